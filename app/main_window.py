"""The main window: it assembles the set-up pages, the toolbar, the dashboard, the runs and the queue, and says who
tells whom. What each part does is in its own module: the form (`app/window/form.py`), config files and commands
(`config_files.py`), Auto and the learning-rate finder (`planning.py`), what is asked of runs (`run_actions.py`), the
status bar (`status.py`), the run lifecycle (`app/jobs/run_controller.py`)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from PySide6.QtCore import QByteArray, QSettings, QSize, Qt, QTimer
from PySide6.QtGui import QAction, QCloseEvent, QGuiApplication, QIcon, QKeySequence
from PySide6.QtWidgets import (
    QFrame,
    QHBoxLayout,
    QListWidget,
    QMainWindow,
    QMessageBox,
    QScrollArea,
    QStackedWidget,
    QStyle,
    QToolBar,
    QWidget,
)

from app.jobs.run_controller import RunController
from app.jobs.run_model import RunModel
from app.pages.advanced_page import AdvancedPage
from app.pages.dataset_page import DatasetPage
from app.pages.device_page import DevicePage
from app.pages.model_page import ModelPage
from app.pages.optimizer_page import OptimizerPage
from app.pages.queue_page import QueuePage
from app.pages.runs_page import RunsPage
from app.pages.setup_pages import SetupPages
from app.state.form_model import FormModel
from app.state.runs_folder import SETTING as RUNS_SETTING
from app.state.runs_folder import RunsFolder
from app.widgets.forms import Binder
from app.window.config_files import ConfigFiles
from app.window.form import DEMO_CONFIG, Form
from app.window.planning import Planning
from app.window.run_actions import RunActions
from app.window.status import StatusLine
from trainer.runs.launch import REPO_ROOT

if TYPE_CHECKING:
    from app.training.dashboard import Dashboard

PAGES = ["Dataset", "Model", "Optimizer", "Device", "Advanced", "Training", "Runs", "Queue"]
# keys with a home on a page other than through the binder (the Advanced page lists every other key)
PAGE_KEYS = {"optimizer.groups", "device.parallel", "device.launcher", "device.host"}
PREFERRED_SIZE = (1280, 800)
PREBUILD_AFTER_MS = 1500  # the Training page is made this long after start-up, while the window is idle
FRAME_ALLOWANCE = (16, 40)  # px, width and height: the borders and the title bar a window manager adds
STYLE = (REPO_ROOT / "resources" / "style.qss")


class MainWindow(QMainWindow):
    def __init__(self, settings: QSettings, runs_dir: Path, config_path: Path | None = None,
                 hold_scan: str | None = None):
        super().__init__()
        self.settings = settings
        self.runs_folder = RunsFolder(runs_dir)
        self.runs = RunController(self.runs_folder, self)
        self._close_after_stop = False
        self._leave_running = False
        self.setWindowTitle("TrainDeck")
        self._fit_to_screen()
        self._build_pages()
        self.form = Form(self.model, self.pages, self.runs_folder, self)
        self.files = ConfigFiles(self.form, settings, self)
        self.planning = Planning(self.form, self.runs, self.dataset_page.auto, self.optimizer_page.find_lr, self)
        self.run_actions = RunActions(self.form, self.runs, self.dataset_page, self.queue_page, lambda: self.dashboard,
                                      self)
        self._build_toolbar()
        self.status = StatusLine(self.statusBar(), self.runs, self.form.restore_button, self)
        self._connect_pages()
        self._connect_runs()
        self._start_up(config_path, hold_scan)

    def _build_pages(self) -> None:
        """The pages, each in a scroll area (a page that needs more room than a laptop screen has scrolls instead of
        widening the window), behind the navigation list."""
        self.model = FormModel()  # the form's values; the set-up pages are its views
        self.binder = Binder(self.model, self)
        self.dataset_page = DatasetPage(self.binder)
        self.model_page = ModelPage(self.binder)
        self.optimizer_page = OptimizerPage(self.binder)
        self.device_page = DevicePage(self.binder)
        self.advanced_page = AdvancedPage(self.model, set(self.binder.widgets) | PAGE_KEYS)
        self.pages = SetupPages(self.binder, self.dataset_page, self.model_page, self.optimizer_page,
                                self.device_page, self.advanced_page)
        self._dashboard: Dashboard | None = None  # built when first needed (16 plots and pyqtgraph: most of the start-up)
        self._dashboard_parts: list = []  # its tabs built so far while the window was idle
        self._marks: dict = {}  # the manifest's entries, for the dashboard's results when it is built
        self.runs_page = RunsPage()
        self.queue_page = QueuePage()

        self.nav = QListWidget()
        self.nav.setObjectName("nav")
        self.nav.addItems(PAGES)
        self.nav.setFixedWidth(110)
        self.stack = QStackedWidget()
        for page in (self.dataset_page, self.model_page, self.optimizer_page, self.device_page, self.advanced_page,
                     QWidget(), self.runs_page, self.queue_page):
            scroll = QScrollArea()
            scroll.setWidgetResizable(True)
            scroll.setFrameShape(QFrame.Shape.NoFrame)
            scroll.setWidget(page)
            self.stack.addWidget(scroll)
        self.nav.currentRowChanged.connect(self._show_page)
        central = QWidget()
        layout = QHBoxLayout(central)
        layout.setContentsMargins(4, 4, 4, 4)
        layout.addWidget(self.nav)
        layout.addWidget(self.stack, 1)
        self.setCentralWidget(central)

    def _build_toolbar(self) -> None:
        bar = QToolBar("Main")
        bar.setObjectName("mainToolbar")
        bar.setMovable(False)
        bar.setIconSize(QSize(18, 18))
        bar.setToolButtonStyle(Qt.ToolButtonStyle.ToolButtonTextBesideIcon)
        self.addToolBar(bar)
        sp = QStyle.StandardPixmap

        def action(text: str, icon, slot, shortcut: str | None = None, tip: str = "") -> QAction:
            a = QAction(self.style().standardIcon(icon), text, self)
            a.setObjectName(text)
            a.triggered.connect(slot)
            if shortcut:
                a.setShortcut(QKeySequence(shortcut))
            if tip:
                a.setToolTip(tip)
            bar.addAction(a)
            return a

        # short labels: the whole toolbar fits 1024 px (Try it was behind the overflow arrow); tooltips say more
        self.new_action = action("New", sp.SP_FileIcon, self.form.new, "Ctrl+N",
                                 "Every setting back to its default, on the same dataset")
        self.open_action = action("Open…", sp.SP_DialogOpenButton, self.files.open_dialog, "Ctrl+O",
                                  "Open a config file (YAML)")
        self.save_action = action("Save…", sp.SP_DialogSaveButton, self.files.save_dialog, "Ctrl+S",
                                  "Save the form as a config file (YAML)")
        self.copy_action = action("Command", sp.SP_FileDialogDetailedView, self.files.copy_command, None,
                                  "Copy the headless command for this run (main.py train ...)")
        bar.addSeparator()
        self.start_action = action("Start", sp.SP_MediaPlay, self.run_actions.start, "Ctrl+R")
        self.queue_action = action("Add to queue", sp.SP_FileDialogListView,
                                   lambda: self.run_actions.add_to_queue(self.queue_action), "Ctrl+Shift+R")
        self.sweep_action = action("Sweep…", sp.SP_FileDialogInfoView, self.run_actions.open_sweep_dialog)
        self.stop_action = action("Stop", sp.SP_MediaStop, self.runs.stop)
        self.resume_action = action("Resume", sp.SP_MediaSeekForward, lambda: self.run_actions.resume(None))
        bar.addSeparator()
        self.try_action = action("Try it…", sp.SP_FileDialogContentsView, self.run_actions.try_it, "Ctrl+T")
        self.quit_action = QAction("Quit", self)  # not on the toolbar: the platform's shortcut (Ctrl+Q), as closing
        self.quit_action.setShortcut(QKeySequence(QKeySequence.StandardKey.Quit))  # the window does (a run asks)
        self.quit_action.triggered.connect(self.close)
        self.addAction(self.quit_action)

    def _connect_pages(self) -> None:
        """Who tells whom on the set-up pages (every edit reaches the form model, which has it validated): the pages to
        each other."""
        later = self.form.timer.start
        self.form.validated.connect(self._validated)
        self.dataset_page.scanned.connect(self._scanned)
        self.model_page.parametersChanged.connect(self.optimizer_page.groups.set_parameters)
        self.model_page.parametersChanged.connect(lambda _: later())
        self.model_page.described.connect(self._model_described)
        # until the new model is described, the Dataset page does not show the previous one's normalisation
        self.model_page.describing.connect(lambda: self.dataset_page.show_normalisation(self.form.raw(), None))
        self.model.listen(lambda key, _by: self.model_page.show_frozen() if key in (None, "model.freeze_backbone")
                          else None)
        self.optimizer_page.lrFindRequested.connect(self.planning.find_lr)
        self.dataset_page.auto.requested.connect(self.planning.auto_plan)
        self.device_page.slurmRequested.connect(self.files.save_slurm_dialog)
        self.dataset_page.default_manifest = lambda: self.form.manifest_path
        self.dataset_page.runs_folder = self.runs_folder
        self.dataset_page.findingsRequested.connect(self.run_actions.show_findings)
        for source in (self.form, self.files, self.run_actions, self.dataset_page):
            source.said.connect(self.statusBar().showMessage)

    def _connect_runs(self) -> None:
        """Who tells whom about runs: the run controller to the views, the results to the manifest, the lists."""
        self.runs.process.ended.connect(self._process_ended)
        self.runs.modelChanged.connect(self._model_changed)
        self.runs.runFinished.connect(lambda *_: self.runs_page.refresh())
        self.runs.changed.connect(self._update_buttons)
        self.dataset_page.manifestChanged.connect(self._marks_changed)
        self.runs_page.openRequested.connect(self.run_actions.open)
        self.queue_page.openRequested.connect(self.run_actions.open)
        self.runs_page.resumeRequested.connect(self.run_actions.resume)
        self.runs_page.extendRequested.connect(self.run_actions.extend)
        self.runs_page.runsDirChosen.connect(self.change_runs_dir)
        self.queue_page.changed.connect(self._update_buttons)
        for source in (self.run_actions, self.planning):
            source.showTraining.connect(lambda: self.nav.setCurrentRow(PAGES.index("Training")))

    def _start_up(self, config_path: Path | None, hold_scan: str | None) -> None:
        """The form (the given config, the last session's, else the demo), the lists, the probes and the re-attached
        remote runs."""
        if hold_scan:
            self.dataset_page.hold(hold_scan)
        if config_path is not None or not self.files.restore_last():
            self.files.open(config_path or DEMO_CONFIG)
        self.runs_page.set_runs_dir(self.runs_dir)
        self.queue_page.set_runs_dir(self.runs_dir)
        self.device_page.hostChanged.connect(self.dataset_page.set_host)
        self.dataset_page.set_host(self.device_page.host)  # a restored config's device.host
        self.device_page.load_hosts()
        self.device_page.start_probe()
        self.model_page.describe()
        self.runs.reattach_remote()
        geometry = self.settings.value("geometry")
        if isinstance(geometry, QByteArray):
            self.restoreGeometry(geometry)
        self.nav.setCurrentRow(0)
        self._update_buttons()
        self._prebuild_dashboard()

    def _fit_to_screen(self) -> None:
        """Open at the preferred size, but inside the screen's available area (a 1280x720 laptop keeps its status bar
        on screen): centred there, never larger than it."""
        width, height = PREFERRED_SIZE
        screen = self.screen() or QGuiApplication.primaryScreen()
        if screen is None:
            self.resize(width, height)
            return
        area = screen.availableGeometry()
        frame_w, frame_h = FRAME_ALLOWANCE
        self.resize(min(width, area.width() - frame_w), min(height, area.height() - frame_h))
        self.move(area.x() + (area.width() - self.width() - frame_w) // 2,
                  area.y() + (area.height() - self.height() - frame_h) // 2)

    def _prebuild_dashboard(self) -> None:
        """The Training page made while the window is idle after start-up, a part per turn of the event loop
        (pyqtgraph's import, each tab, then the page around them), so that the first run opened or started finds it
        built: built then, it held the GUI thread 0.4-0.6 s (bench/scale.py's window case)."""
        def next_part() -> None:
            if self._dashboard is None and self.isVisible() and next(steps, False):
                QTimer.singleShot(0, self, next_part)

        def parts():
            from app.training.dashboard import Dashboard  # with pyqtgraph: not part of the start-up

            yield True
            yield from Dashboard.parts(self._dashboard_parts)
            self.dashboard  # noqa: B018 - the page around the tabs, on a turn of its own
        steps = parts()
        QTimer.singleShot(PREBUILD_AFTER_MS, self, next_part)

    @property
    def dashboard(self) -> Dashboard:
        """The Training page, built the first time it is shown or a run is on it (of it, what was not built yet)."""
        if self._dashboard is None:
            from app.training.dashboard import Dashboard  # with pyqtgraph: not part of the start-up

            self._dashboard = dashboard = Dashboard(built=self._dashboard_parts)
            self.stack.widget(PAGES.index("Training")).setWidget(dashboard)
            results = dashboard.results
            results.markRequested.connect(self.run_actions.mark_image)
            results.undoRequested.connect(self.dataset_page.undo)
            results.labelPoolRequested.connect(self.run_actions.label_pool)
            results.marksRequested.connect(self.dataset_page.mark_many)
            results.set_marked(self._marks)
            if self.runs.model is not None:
                dashboard.set_model(self.runs.model)
        return self._dashboard

    def _model_changed(self, model) -> None:
        if self._dashboard is None:
            self.dashboard  # noqa: B018 - built now, on the run the controller shows
        else:
            self._dashboard.set_model(model)

    def _show_page(self, row: int) -> None:
        if row == PAGES.index("Training"):
            self.dashboard  # noqa: B018 - built on its first showing
        self.stack.setCurrentIndex(row)

    def _marks_changed(self, marks: dict) -> None:
        self._marks = marks
        if self._dashboard is not None:
            self._dashboard.results.set_marked(marks)

    # ---- where runs go ---------------------------------------------------------------------------
    @property
    def runs_dir(self) -> Path:
        return self.runs_folder.path

    def change_runs_dir(self, chosen: str) -> None:
        """The Runs page's choice: every part of the window writes and lists runs there from now on, and the next
        start opens there (unless --runs-dir says otherwise). Not while a run is going: it writes where it began."""
        path = Path(chosen).expanduser()
        if path == self.runs_dir:
            return
        if self.runs.running:
            self.statusBar().showMessage(f"The runs folder stays {self.runs_dir} while a run is going: stop it first",
                                         8000)
            self.runs_page.set_runs_dir(self.runs_dir)
            return
        try:
            path.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            self.statusBar().showMessage(f"Runs folder {path}: cannot be made ({e.strerror or e})", 8000)
            return
        self.runs_folder.path = path
        self.settings.setValue(RUNS_SETTING, str(path))
        self.runs_page.set_runs_dir(path)
        self.queue_page.set_runs_dir(path)
        self.statusBar().showMessage(f"Runs are written and listed in {path}", 5000)

    # ---- what the parts say --------------------------------------------------------------------
    @property
    def process(self):
        return self.runs.process

    @property
    def run_model(self) -> RunModel | None:
        return self.runs.model

    def _validated(self, problems: list[str]) -> None:
        self.status.show_problems(problems)
        self.dataset_page.preview.show_config(self.model.checked)  # drawn again when its settings changed
        self.status.show_hidden_settings(self.advanced_page.differing(), (self.start_action, self.queue_action))
        self._update_buttons()

    def _model_described(self, info: dict) -> None:
        """The chosen model's head (for the recipes) and the normalisation its weights mean (Dataset page)."""
        self.optimizer_page.head = info.get("head")
        self.dataset_page.show_normalisation(self.form.raw(), info.get("normalisation"))

    def _scanned(self, result) -> None:
        if result is not None and result.classes:
            self.model_page.set_class_count(len(result.classes))
        self.form.timer.start()

    def _update_buttons(self) -> None:
        running = self.runs.running
        self.start_action.setEnabled(not running and not self.form.problems)
        self.stop_action.setEnabled(running and not self.runs.finishing)
        self.resume_action.setEnabled(self.runs.can_resume())

    def _process_ended(self, code: int) -> None:
        if self._close_after_stop:
            self.close()

    # ---- closing -------------------------------------------------------------------------------
    def closeEvent(self, event: QCloseEvent) -> None:
        # a run that has ended (its run_end is read) may still have a process tidying up: it needs no answer
        if self.runs.running and not self.runs.finishing and not (self._close_after_stop or self._leave_running):
            event.ignore()
            self._ask_how_to_close()
            return
        self.shutdown()
        super().closeEvent(event)

    def _ask_how_to_close(self) -> None:
        """Stop the run, leave it running, or cancel: asked without blocking (the answer arrives by signal)."""
        box = QMessageBox(QMessageBox.Icon.Question, "A run is in progress",
                          "Stop the run (it saves a checkpoint) or leave it running in the background? "
                          "A run left running can be re-opened from the Runs page.", parent=self)
        stop = box.addButton("Stop run", QMessageBox.ButtonRole.DestructiveRole)
        leave = box.addButton("Leave running", QMessageBox.ButtonRole.AcceptRole)
        cancel = box.addButton(QMessageBox.StandardButton.Cancel)
        box.setDefaultButton(cancel)  # Enter changes nothing (it left the trainer running, issue #71)
        box.setObjectName("closeBox")
        self.close_box = box

        def answered():
            if box.clickedButton() is stop:
                self._close_after_stop = True
                self.runs.stop()
            elif box.clickedButton() is leave:
                self._leave_running = True
                self.close()

        box.finished.connect(answered)
        box.open()

    def shutdown(self) -> None:
        """Stop every timer and helper process this window owns (the trainer itself is left alone)."""
        self.settings.setValue("geometry", self.saveGeometry())
        self.files.keep_for_next_session()
        self.settings.sync()
        if self._dashboard is not None:
            self._dashboard.stop_updates()
        self.model_page.cancel_jobs()
        self.device_page.cancel_jobs()
        self.planning.shutdown()
        self.form.timer.stop()
        self.runs.shutdown()
        self.status.shutdown()


def load_style() -> str:
    try:
        return STYLE.read_text()
    except OSError:
        return ""


def app_icon() -> QIcon:
    return QIcon(str(REPO_ROOT / "resources" / "icon.png"))

