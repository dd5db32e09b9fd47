"""The main window: set-up pages, Start/Stop/Resume, the live dashboard and the runs list."""

from __future__ import annotations

import copy
import json
import logging
import os
import shlex
from pathlib import Path

from PySide6.QtCore import QByteArray, QSettings, QSize, Qt, QTimer
from PySide6.QtGui import QAction, QCloseEvent, QGuiApplication, QIcon, QKeySequence
from PySide6.QtWidgets import (
    QFileDialog,
    QFrame,
    QHBoxLayout,
    QLabel,
    QListWidget,
    QMainWindow,
    QMessageBox,
    QProgressBar,
    QPushButton,
    QScrollArea,
    QStackedWidget,
    QStyle,
    QSystemTrayIcon,
    QToolBar,
    QWidget,
)

from app.background import CliJob, run_in_thread
from app.experiments import extension_facts
from app.forms import Binder, get_path, set_path
from app.label_dialog import LabelDialog
from app.lr_finder import LrFinder
from app.pages.advanced_page import AdvancedPage, value_text
from app.pages.dashboard import Dashboard
from app.pages.dataset_page import DatasetPage
from app.pages.device_page import DevicePage
from app.pages.model_page import ModelPage
from app.pages.optimizer_page import LrFindDialog, OptimizerPage
from app.pages.queue_page import QueuePage
from app.pages.runs_page import ExtendDialog, RunsPage
from app.run_controller import RunController
from app.run_model import RunModel
from app.sweep_dialog import SweepDialog
from app.try_it import TryItDialog
from trainer.core.config import MULTILABEL_LOSS, ConfigError, RunConfig, load_config, save_config
from trainer.core.rundir import RunDir, list_runs, new_config_file
from trainer.data.demo_data import demo_dataset_dir
from trainer.data.scan import find_layout
from trainer.runs.launch import REPO_ROOT, node_commands, train_command, write_slurm_files

log = logging.getLogger(__name__)

DATASET_KEYS = ("data.train_dir", "data.val_dir", "data.test_dir", "data.exclude", "data.labels", "data.val_labels",
                "data.test_labels")  # what New keeps: the dataset, every other setting at its default
PAGES = ["Dataset", "Model", "Optimizer", "Device", "Advanced", "Training", "Runs", "Queue"]
# keys with a home on a page other than through the binder (the Advanced page lists every other key)
PAGE_KEYS = {"optimizer.groups", "device.parallel", "device.launcher", "device.host"}
PREFERRED_SIZE = (1280, 800)
FRAME_ALLOWANCE = (16, 40)  # px, width and height: the borders and the title bar a window manager adds
DEMO_CONFIG = REPO_ROOT / "resources" / "demo.yaml"
STYLE = (REPO_ROOT / "resources" / "style.qss")


class MainWindow(QMainWindow):
    def __init__(self, settings: QSettings, runs_dir: Path, config_path: Path | None = None,
                 hold_scan: str | None = None):
        super().__init__()
        self.settings = settings
        self.runs_dir = Path(runs_dir)
        self.config_path: Path | None = None
        self.config_problems: list[str] = []
        self.runs = RunController(self.runs_dir, self)
        self.runs.process.ended.connect(self._process_ended)
        self._close_after_stop = False
        self._leave_running = False
        self.setWindowTitle("TrainDeck")
        self._fit_to_screen()
        self._build_pages()
        self._build_toolbar()
        self._build_status_bar()
        self._connect()
        self._start_up(config_path, hold_scan)

    def _build_pages(self) -> None:
        """The pages, each in a scroll area (a page that needs more room than a laptop screen has scrolls instead of
        widening the window), behind the navigation list."""
        self.binder = Binder(self)
        self.dataset_page = DatasetPage(self.binder)
        self.model_page = ModelPage(self.binder)
        self.optimizer_page = OptimizerPage(self.binder)
        self.device_page = DevicePage(self.binder)
        self.advanced_page = AdvancedPage(set(self.binder.widgets) | PAGE_KEYS)
        self.dashboard = Dashboard()
        self.runs_page = RunsPage()
        self.queue_page = QueuePage()

        self.nav = QListWidget()
        self.nav.setObjectName("nav")
        self.nav.addItems(PAGES)
        self.nav.setFixedWidth(110)
        self.stack = QStackedWidget()
        for page in (self.dataset_page, self.model_page, self.optimizer_page, self.device_page, self.advanced_page,
                     self.dashboard,
                     self.runs_page, self.queue_page):
            scroll = QScrollArea()
            scroll.setWidgetResizable(True)
            scroll.setFrameShape(QFrame.Shape.NoFrame)
            scroll.setWidget(page)
            self.stack.addWidget(scroll)
        self.nav.currentRowChanged.connect(self.stack.setCurrentIndex)
        central = QWidget()
        layout = QHBoxLayout(central)
        layout.setContentsMargins(4, 4, 4, 4)
        layout.addWidget(self.nav)
        layout.addWidget(self.stack, 1)
        self.setCentralWidget(central)


    def _build_status_bar(self) -> None:
        self.state_label = QLabel("Ready")
        self.state_label.setObjectName("stateLabel")
        self.problem_label = QLabel("")
        self.problem_label.setObjectName("problemLabel")
        self.problem_label.setStyleSheet("color: #c9302c;")
        self.progress = QProgressBar()
        self.progress.setObjectName("epochProgress")
        self.progress.setMaximumWidth(260)
        self.progress.setFormat("epoch %v/%m")
        self.eta_label = QLabel("")
        self.budget_label = QLabel("")
        self.budget_label.setObjectName("budgetLabel")
        self.budget_label.setStyleSheet("font-weight: bold;")
        self.statusBar().addWidget(self.state_label)
        self.statusBar().addWidget(self.problem_label, 1)
        self.statusBar().addPermanentWidget(self.budget_label)
        self.statusBar().addPermanentWidget(self.eta_label)
        self.restore_form = QPushButton("Put the form back")
        self.restore_form.setObjectName("restoreForm")
        self.restore_form.setToolTip("Opening a run loaded its settings into the forms; this puts back what they held")
        self.restore_form.clicked.connect(self._restore_form)
        self.restore_form.hide()
        self.statusBar().addPermanentWidget(self.restore_form)
        self.statusBar().addPermanentWidget(self.progress)

        self.tray = QSystemTrayIcon(self.windowIcon(), self) if QSystemTrayIcon.isSystemTrayAvailable() else None
        if self.tray:
            self.tray.setIcon(self.style().standardIcon(QStyle.StandardPixmap.SP_ComputerIcon))
            self.tray.show()


    def _connect(self) -> None:
        """Who tells whom: validation on every edit, the pages to each other, the run controller to the views."""
        self._validate_timer = QTimer(self)
        self._validate_timer.setSingleShot(True)
        self._validate_timer.setInterval(150)
        self._validate_timer.timeout.connect(self.validate)
        self.binder.changed.connect(self._validate_timer.start)
        self.advanced_page.changed.connect(self._validate_timer.start)
        self.optimizer_page.groups.changed.connect(self._validate_timer.start)
        self.device_page.mode.currentIndexChanged.connect(lambda _: self._validate_timer.start())
        self.dataset_page.scanned.connect(self._scanned)
        self.model_page.parametersChanged.connect(self.optimizer_page.groups.set_parameters)
        self.model_page.parametersChanged.connect(lambda _: self._validate_timer.start())
        self.model_page.described.connect(self._model_described)
        # until the new model is described, the Dataset page does not show the previous one's normalisation
        self.model_page.describing.connect(lambda: self.dataset_page.show_normalisation(self.current_raw(), None))
        self.binder.widgets["model.freeze_backbone"].toggled.connect(lambda _: self.model_page.show_frozen())
        self.optimizer_page.lrFindRequested.connect(self.find_lr)
        self.dataset_page.auto.requested.connect(self.auto_plan)
        self.auto_job: CliJob | None = None
        self.device_page.slurmRequested.connect(self._save_slurm_dialog)
        self._folder_gave: dict | None = None  # the splits the training folder's layout gave (val/, test/)
        self._form_before_open: dict | None = None  # the form before a past run's settings were loaded into it
        self.lr_finder = LrFinder(self.runs_dir, self)
        self.lr_finder.done.connect(self._lr_found)
        self.lr_finder.failed.connect(self._lr_failed)
        self.runs.modelChanged.connect(self.dashboard.set_model)
        self.runs.stateText.connect(self.state_label.setText)
        self.runs.progressed.connect(self._progress)
        self.runs.runFinished.connect(self._run_finished)
        self.runs.changed.connect(self._update_buttons)
        self.dataset_page.default_manifest = self.default_manifest_path
        self.dataset_page.runs_dir = self.runs_dir
        self.dataset_page.findingsRequested.connect(self.show_findings)
        self.binder.widgets["data.train_dir"].textChanged.connect(lambda _: self._dataset_changed())
        self.dataset_page.folderSettled.connect(self._use_folder_splits)
        self.dashboard.results.markRequested.connect(self._mark_image)
        self.dashboard.results.undoRequested.connect(self.dataset_page.undo)
        self.dashboard.results.labelPoolRequested.connect(self.label_pool)
        self.dashboard.results.marksRequested.connect(self.dataset_page.mark_many)
        self.dataset_page.manifestChanged.connect(self.dashboard.results.set_marked)
        self.runs_page.openRequested.connect(self.open_run)
        self.queue_page.openRequested.connect(self.open_run)
        self.runs_page.resumeRequested.connect(self.resume_run)
        self.runs_page.extendRequested.connect(self.extend_run)


    def _start_up(self, config_path: Path | None, hold_scan: str | None) -> None:
        """The form (the given config, the last session's, else the demo), the lists, the probes and the re-attached
        remote runs."""
        if hold_scan:
            self.dataset_page.hold(hold_scan)
        if config_path is not None or not self._restore_last_config():
            self.load_config_file(config_path or DEMO_CONFIG)
        self.runs_page.set_runs_dir(self.runs_dir)
        self.queue_page.set_runs_dir(self.runs_dir)
        self.queue_page.changed.connect(self._update_buttons)
        self.device_page.hostChanged.connect(self.dataset_page.set_host)
        self.dataset_page.set_host(self.device_page.host)  # a restored config's device.host
        self.device_page.load_hosts()
        self.device_page.start_probe()
        self.model_page.describe()
        self.runs.reattach_remote()
        self._restore_settings()
        self.nav.setCurrentRow(0)
        self._update_buttons()

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

    # ---- toolbar -----------------------------------------------------------------------------
    def _build_toolbar(self) -> None:
        bar = QToolBar("Main")
        bar.setObjectName("mainToolbar")
        bar.setMovable(False)
        bar.setIconSize(QSize(18, 18))
        bar.setToolButtonStyle(Qt.ToolButtonStyle.ToolButtonTextBesideIcon)
        self.addToolBar(bar)
        sp = QStyle.StandardPixmap

        def action(text: str, icon, slot, shortcut: str | None = None) -> QAction:
            a = QAction(self.style().standardIcon(icon), text, self)
            a.setObjectName(text)
            a.triggered.connect(slot)
            if shortcut:
                a.setShortcut(QKeySequence(shortcut))
            bar.addAction(a)
            return a

        self.new_action = action("New", sp.SP_FileIcon, self.new_config, "Ctrl+N")
        self.new_action.setToolTip("Every setting back to its default, on the same dataset")
        # short labels: the whole toolbar fits 1024 px (Try it was behind the overflow arrow); tooltips say more
        self.open_action = action("Open…", sp.SP_DialogOpenButton, self._open_config_dialog, "Ctrl+O")
        self.open_action.setToolTip("Open a config file (YAML)")
        self.save_action = action("Save…", sp.SP_DialogSaveButton, self._save_config_dialog, "Ctrl+S")
        self.save_action.setToolTip("Save the form as a config file (YAML)")
        self.copy_action = action("Command", sp.SP_FileDialogDetailedView, self.copy_command)
        self.copy_action.setToolTip("Copy the headless command for this run (main.py train ...)")
        bar.addSeparator()
        self.start_action = action("Start", sp.SP_MediaPlay, self.start_run, "Ctrl+R")
        self.queue_action = action("Add to queue", sp.SP_FileDialogListView, self.add_to_queue, "Ctrl+Shift+R")
        self.sweep_action = action("Sweep…", sp.SP_FileDialogInfoView, self.open_sweep_dialog)
        self.stop_action = action("Stop", sp.SP_MediaStop, self.stop_run)
        self.resume_action = action("Resume", sp.SP_MediaSeekForward, lambda: self.resume_run(None))
        bar.addSeparator()
        self.try_action = action("Try it…", sp.SP_FileDialogContentsView, self.try_it, "Ctrl+T")

    # ---- config ------------------------------------------------------------------------------
    def load_config_file(self, path: Path) -> bool:
        try:
            cfg = load_config(path)
        except ConfigError as e:
            QMessageBox.warning(self, "Cannot load config", str(e))
            return False
        self.config_path = Path(path) if Path(path) != DEMO_CONFIG else None
        if self.config_path is None:  # the app's demo dataset lives in the user's data folder
            cfg.data.train_dir = str(demo_dataset_dir())
        self.load_config(cfg)
        if self.config_path:
            self._remember_recent(str(self.config_path))
        return True

    def load_config(self, cfg: RunConfig, set_by: str = "") -> None:
        """Show `cfg` in the forms; `set_by` names who chose its values (the Advanced page marks them so)."""
        raw = cfg.to_dict()
        self.loaded_raw = raw
        self._folder_gave = None  # the config's splits are its own, not a folder's
        self._form_before_open = None  # another config now: what a run's opening replaced is no longer to go back to
        self.restore_form.hide()
        self.binder.load(raw)
        self.optimizer_page.load(raw)
        self.device_page.load(raw)
        self.advanced_page.load(raw, set_by)
        self.dataset_page.scan()
        self.validate()

    def current_raw(self) -> dict:
        raw = copy.deepcopy(getattr(self, "loaded_raw", None) or RunConfig().to_dict())
        self.binder.dump(raw)
        self.optimizer_page.dump(raw)
        self.device_page.dump(raw)
        self.advanced_page.dump(raw)
        return raw

    def current_config(self) -> RunConfig | None:
        try:
            return RunConfig.from_dict(self.current_raw())
        except ConfigError:
            return None

    def validate(self) -> list[str]:
        """Check the form; mark the widgets at fault in place; Start is enabled only when all is well."""
        raw = self.current_raw()
        problems: list[str] = []
        try:
            RunConfig.from_dict(raw)
        except ConfigError as e:
            problems.extend(e.problems)
        problems += self.dataset_page.problems() + self.model_page.problems()
        problems += self.optimizer_page.groups.problems(self.optimizer_page.head,
                                                        bool(raw.get("model", {}).get("freeze_backbone")))
        problems += self.device_page.problems(raw)
        self.config_problems = problems
        self.binder.mark_errors(problems)
        self.optimizer_page.groups.mark_errors(problems)
        self.advanced_page.mark_errors(problems)
        self._show_hidden_settings()
        self.problem_label.setText(problems[0] + (f"  (+{len(problems) - 1} more)" if len(problems) > 1 else "")
                                   if problems else "")
        self.problem_label.setToolTip("\n".join(problems))
        self._update_buttons()
        return problems

    def _show_hidden_settings(self) -> None:
        """Before Start: its tooltip names every setting with no form of its own that differs from its default (the
        Advanced page lists them), and a time budget shows in the status bar."""
        differing = self.advanced_page.differing()
        budget = differing.get("train.budget")
        budget = budget if isinstance(budget, (int, float)) and budget > 0 else None
        tip = "Start a run with the settings on the pages"
        if differing:
            tip += ", including these from the Advanced page:\n" + "\n".join(
                f"{key} = {value_text(value)}" for key, value in differing.items())
        if budget:
            tip = f"The run ends after its time budget of {budget:g} min (train.budget).\n" + tip
        self.start_action.setToolTip(tip)
        self.queue_action.setToolTip(tip.replace("Start a run", "Queue a run"))
        self.budget_label.setText(f"budget {budget:g} min" if budget else "")
        self.budget_label.setToolTip("train.budget, on the Advanced page: the run ends when it is spent" if budget
                                     else "")

    def new_config(self) -> None:
        """The defaults on the form's dataset: a fresh start, whatever a plan or an opened run had set. The dataset's
        fields stay even when they do not make a valid config yet (they were cleared, while the status bar said
        'on the same dataset'): the forms then mark what to fix."""
        current = self.current_raw()
        raw = RunConfig().to_dict()
        for key in DATASET_KEYS:
            set_path(raw, key, get_path(current, key))
        if get_path(raw, "data.labels"):  # a multi-label dataset: its loss, as the config's rule says
            set_path(raw, "loss.name", MULTILABEL_LOSS)
        try:
            cfg = RunConfig.from_dict(raw)
        except ConfigError:
            cfg = RunConfig()
        self.config_path = None
        self.load_config(cfg)
        for key in DATASET_KEYS:  # what the defaults could not take is set as it was, to be marked
            value = get_path(raw, key)
            if value and getattr(cfg.data, key.removeprefix("data.")) != value:
                if key in self.binder.widgets:
                    self.binder.widgets[key].setText(str(value))
                else:
                    self.advanced_page.set_value(key, value)
        self.validate()
        self.statusBar().showMessage("New config: every setting at its default, on the same dataset", 5000)

    def _model_described(self, info: dict) -> None:
        """The chosen model's head (for the recipes) and the normalisation its weights mean (Dataset page)."""
        self.optimizer_page.head = info.get("head")
        self.dataset_page.show_normalisation(self.current_raw(), info.get("normalisation"))

    def _scanned(self, result) -> None:
        if result is not None and result.classes:
            self.model_page.set_class_count(len(result.classes))
        self._validate_timer.start()

    def _open_config_dialog(self) -> None:
        start = self.settings.value("last_config_dir", self._near_the_dataset())
        path, _ = QFileDialog.getOpenFileName(self, "Open config", start, "YAML (*.yaml *.yml)")
        if path:
            self.settings.setValue("last_config_dir", str(Path(path).parent))
            self.load_config_file(Path(path))

    def _save_config_dialog(self) -> None:
        cfg = self.current_config()
        if cfg is None:
            QMessageBox.warning(self, "Cannot save", "Fix the marked settings first:\n" + "\n".join(self.config_problems))
            return
        start = str(self.config_path or Path(self.settings.value("last_config_dir", self._near_the_dataset())) / "config.yaml")
        path, _ = QFileDialog.getSaveFileName(self, "Save config", start, "YAML (*.yaml *.yml)")
        if path:
            self.save_config_to(Path(path))

    def save_config_to(self, path: Path) -> None:
        save_config(self.current_config(), path)
        self.config_path = path
        self.settings.setValue("last_config_dir", str(path.parent))
        self._remember_recent(str(path))

    def command_text(self) -> str:
        """The headless command(s) for the current form: one line, or one per node for multi-node runs."""
        cfg = self.current_config()
        if cfg is None:
            return ""
        path = self.config_path
        if path is None or load_config(path).to_dict() != cfg.to_dict():
            path = new_config_file(self.runs_dir)
            save_config(cfg, path)
        if cfg.device.nnodes > 1:
            return "\n".join(f"# node {i}\n{c}" for i, c in enumerate(node_commands(path, cfg)))
        cmd = train_command(path, runs_dir=self.runs_dir)
        cmd[0:2] = ["python", "main.py"]
        return shlex.join(cmd)

    def _save_slurm_dialog(self) -> None:
        if self.current_config() is None:
            QMessageBox.warning(self, "Cannot save", "Fix the marked settings first:\n" + "\n".join(self.config_problems))
            return
        start = str(Path(self.settings.value("last_config_dir", self._near_the_dataset())) / "train.sh")
        path, _ = QFileDialog.getSaveFileName(self, "Save SLURM script", start, "Shell scripts (*.sh)")
        if path:
            self.save_slurm_script(Path(path))

    def save_slurm_script(self, path: Path) -> Path:
        """The SLURM batch script for the current form and, beside it, the config it trains (as `main.py slurm`)."""
        config_path = write_slurm_files(self.current_config(), path, self.runs_dir)
        self.statusBar().showMessage(f"Saved {path} and {config_path.name}; submit with: sbatch {path}", 8000)
        return config_path

    def find_lr(self) -> None:
        """Sweep the learning rate on the current form (in a subprocess); show the curve, offer the suggestion."""
        cfg = self.current_config()
        if cfg is None or self.lr_finder.busy:
            return
        self.lr_finder.start(cfg)
        self.optimizer_page.find_lr.setEnabled(False)
        self.optimizer_page.find_lr.setText("Sweeping…")

    def _lr_sweep_over(self) -> None:
        self.optimizer_page.find_lr.setEnabled(True)
        self.optimizer_page.find_lr.setText("Find…")

    def _lr_found(self, result: dict) -> None:
        self._lr_sweep_over()
        self.lr_dialog = LrFindDialog(result, lambda lr: self.binder.widgets["optimizer.lr"].setText(f"{lr:.3g}"), self)
        self.lr_dialog.open()

    def _lr_failed(self, error: str) -> None:
        self._lr_sweep_over()
        QMessageBox.warning(self, "Learning-rate finder", error)

    def auto_plan(self, minutes: float) -> CliJob | None:
        """Auto (issue #24): plan in a subprocess (`main.py auto --plan-only`), then load the plan into the forms,
        show every choice and start it as a run."""
        panel = self.dataset_page.auto
        folder = self.dataset_page.train_dir
        if self.auto_job is not None or self.runs.running:
            panel.failed("a run is going; stop it first" if self.runs.running else "already planning")
            return None
        if not folder:
            panel.failed("choose a folder of training images first")
            return None
        exclude = self.binder.widgets["data.exclude"].text().strip()
        args = ["auto", folder, "--minutes", f"{minutes:g}", "--plan-only"]
        if self.dataset_page.labels_path:  # multi-label: Auto plans a run of the labels file, by mAP
            args += ["--labels", self.dataset_page.labels_path]
        if self.device_page.host:  # planned there, on its devices (the folder is the host's)
            args += ["--host", self.device_page.host]
        if exclude:
            args += ["--set", f"data.exclude={exclude}"]
        self.auto_job = job = CliJob(args, self)
        self._auto_asked = (folder, minutes, [f"data.exclude={exclude}"] if exclude else [],
                            self.dataset_page.labels_path or None)
        panel.planning("starting")
        job.progress.connect(lambda line: panel.planning(line.removeprefix("auto: ").strip())
                             if line.startswith("auto: ") else None)
        job.done.connect(self._auto_planned)
        job.failed.connect(self._auto_failed)
        return job

    def _auto_failed(self, error: str) -> None:
        self.auto_job = None
        self.dataset_page.auto.failed(error)

    def _auto_planned(self, plan: dict) -> None:
        self.auto_job = None
        if plan.get("in_job"):  # the trainer's answer for a SLURM host: the plan is made inside the job
            self._auto_in_job(plan)
            return
        try:
            cfg = RunConfig.from_dict(plan["config"])
        except (ConfigError, KeyError, TypeError) as e:
            self._auto_failed(f"the plan is not a config this app reads ({e})")
            return
        self.config_path = None
        self.load_config(cfg, set_by="Auto's plan")
        self.dataset_page.auto.show_choices(plan["choices"], plan.get("planning_s", 0))
        if self.validate() or self.runs.running:
            self.dataset_page.auto.failed("the plan is loaded, but the form has problems (see the status bar)")
            return
        self.runs.start(cfg, choices=plan["choices"])
        # The budget was that run's: the form keeps Auto's other choices (marked on the Advanced page), not its clock.
        self.advanced_page.set_value("train.budget", 0.0)
        self.validate()
        self.nav.setCurrentRow(PAGES.index("Training"))

    def _auto_in_job(self, plan: dict) -> None:
        """Auto submitted to a SLURM host as one run: its choices are shown once the job has made them (its
        auto.json, mirrored); the forms are left as they were (the plan is the job's)."""
        folder, minutes, overrides, labels = self._auto_asked
        run = self.runs.start_auto(folder, minutes, plan["host"], overrides, labels)
        panel = self.dataset_page.auto
        panel.waiting_for_job(plan["why"])

        def show_when_planned(_event) -> None:
            if panel.shown_run == run.path:
                return
            try:
                choices = json.loads(run.auto_choices.read_text(encoding="utf-8"))["choices"]
            except (OSError, ValueError, KeyError, TypeError):
                return  # not mirrored yet: the next epoch looks again
            panel.show_job_choices(choices, run.path, plan["host"])

        self.runs.model.runStarted.connect(show_when_planned)
        self.runs.model.epochEnded.connect(show_when_planned)
        self.runs.model.finished.connect(lambda *_: show_when_planned(None))
        self.nav.setCurrentRow(PAGES.index("Training"))

    def copy_command(self) -> None:
        text = self.command_text()
        if text:
            QGuiApplication.clipboard().setText(text)
            self.statusBar().showMessage("Copied: " + text.splitlines()[-1], 5000)

    # ---- runs --------------------------------------------------------------------------------
    @property
    def process(self):
        return self.runs.process

    @property
    def run_model(self) -> RunModel | None:
        return self.runs.model

    def start_run(self) -> None:
        if self.validate() or self.runs.running:
            return
        self.runs.start(self.current_config())
        self.nav.setCurrentRow(PAGES.index("Training"))

    def stop_run(self) -> None:
        self.runs.stop()

    def resume_run(self, path: str | None) -> None:
        run = RunDir(path) if path else (self.run_model.run if self.run_model else None)
        if run is None or self.runs.running:
            return
        refused = self.runs.resume(run)
        if refused:
            QMessageBox.information(self, "Resume", refused)
            return
        self.nav.setCurrentRow(PAGES.index("Training"))

    def extend_run(self, path: str) -> None:
        """"Continue for N more epochs": the dialog shows the schedule rule's effect, then the run is resumed with
        --epochs TOTAL."""
        run = RunDir(path)

        def ask(facts: dict) -> None:
            dialog = ExtendDialog(run, facts, self)
            dialog.setAttribute(Qt.WidgetAttribute.WA_DeleteOnClose)
            dialog.accepted.connect(lambda: self._extend(run, dialog.total))
            dialog.open()
            self.extend_dialog = dialog

        run_in_thread(lambda: extension_facts(run), ask,
                      lambda error: QMessageBox.warning(self, "Continue", f"{run.name}: {error}"), owner=self)

    def _extend(self, run: RunDir, total: int) -> None:
        refused = self.runs.extend(run, total)
        if refused:
            QMessageBox.information(self, "Continue", refused)
            return
        self.nav.setCurrentRow(PAGES.index("Training"))

    # ---- the queue and sweeps ------------------------------------------------------------------
    def _form_config_file(self) -> Path | None:
        """The form's config written to the runs folder's configs (what a queued run or a sweep starts from)."""
        cfg = self.current_config()
        if cfg is None or self.config_problems:
            QMessageBox.warning(self, "Cannot queue", "Fix the marked settings first:\n" + "\n".join(self.config_problems))
            return None
        path = new_config_file(self.runs_dir)
        save_config(cfg, path)
        return path

    def add_to_queue(self) -> CliJob | None:
        """Queue the form's config (`main.py queue add`, which checks it) and make sure a scheduler works the queue."""
        if not self.queue_action.isEnabled():  # one queued run a click: a double click queued two
            return None
        path = self._form_config_file()
        if path is None:
            return None
        job = CliJob(["queue", "add", str(path), "--runs-dir", str(self.runs_dir)], self, parse_json=False)
        self.queue_action.setEnabled(False)

        def done(out: str) -> None:
            self.queue_action.setEnabled(True)
            self.statusBar().showMessage(f"queued {Path(out.strip()).name}", 8000)
            self.queue_page.ensure_scheduler()
            self.queue_page.refresh()

        def failed(error: str) -> None:
            self.queue_action.setEnabled(True)
            QMessageBox.warning(self, "Not queued", error)

        job.done.connect(done)
        job.failed.connect(failed)
        return job

    def open_sweep_dialog(self) -> SweepDialog | None:
        path = self._form_config_file()
        if path is None:
            return None
        dialog = SweepDialog(path, self.runs_dir, self)
        dialog.add_grid_row("optimizer.lr", "1e-3, 3e-3, 1e-2")
        dialog.queued.connect(lambda _: (self.queue_page.ensure_scheduler(), self.queue_page.refresh()))
        dialog.setAttribute(Qt.WidgetAttribute.WA_DeleteOnClose)
        dialog.show()
        return dialog

    # ---- the dataset manifest and Try it -------------------------------------------------------
    def default_manifest_path(self) -> Path:
        """Where a new data.exclude manifest goes: beside the open config file, else in the runs folder's configs,
        named after the dataset (another dataset gets another manifest)."""
        if self.config_path is not None:
            return self.config_path.with_name(f"{self.config_path.stem}.exclude.yaml")
        import hashlib
        import re

        folder = self.dataset_page.train_dir or "dataset"
        real = os.path.realpath(folder)
        name = re.sub(r"[^A-Za-z0-9_.-]+", "_", Path(real).name)[:40] or "dataset"
        return self.runs_dir / "configs" / f"{name}-{hashlib.sha1(real.encode()).hexdigest()[:8]}.exclude.yaml"

    def _use_folder_splits(self, folder: str) -> None:
        """A folder laid out as train/ val/ test/ is used as those splits (the scan's rule, as Auto does), and what it
        gave is remembered: when the training folder becomes another one, the splits it gave go (a flat folder kept
        the first folder's val/ and test/, and the run validated and tested on another dataset); a split the user
        set since stays. A host's folders are not on this machine: its scan there says what it holds."""
        cleared = self._forget_folder_splits(folder)
        layout = find_layout(folder) if not self.device_page.host else None
        if layout is None or os.path.normpath(layout["train_dir"]) == os.path.normpath(folder):
            if cleared:
                self.statusBar().showMessage(f"{folder}: a new training folder; the {' and '.join(cleared)} folder of "
                                             f"the last one no longer applies and was cleared", 10000)
            return
        self.binder.widgets["data.val_dir"].setText(layout["val_dir"] or "")
        self.advanced_page.set_value("data.test_dir", layout["test_dir"])
        self._folder_gave = {"train_dir": layout["train_dir"], "data.val_dir": layout["val_dir"] or "",
                             "data.test_dir": layout["test_dir"]}
        self.binder.widgets["data.train_dir"].setText(layout["train_dir"])
        splits = ", ".join(f"{s}/" for s in ("train", "val", "test") if layout[f"{s}_dir"])
        self.statusBar().showMessage(f"{folder} holds {splits}: they are used as the training, validation and test "
                                     f"sets", 10000)

    def _forget_folder_splits(self, folder: str) -> list[str]:
        """The validation and test folders an earlier training folder gave, cleared when `folder` is another one and
        they still hold what it gave; which were cleared ("validation", "test")."""
        gave = self._folder_gave
        if not gave or os.path.normpath(folder) == os.path.normpath(gave["train_dir"]):
            return []
        self._folder_gave = None
        cleared = []
        if gave["data.val_dir"] and self.binder.widgets["data.val_dir"].text() == gave["data.val_dir"]:
            self.binder.widgets["data.val_dir"].setText("")
            cleared.append("validation")
        if gave["data.test_dir"] and self.advanced_page.value("data.test_dir") == gave["data.test_dir"]:
            self.advanced_page.set_value("data.test_dir", None)
            cleared.append("test")
        return cleared

    def _dataset_changed(self) -> None:
        """A manifest TrainDeck made for another dataset (in the runs folder) does not follow the user to this one."""
        exclude = self.binder.widgets["data.exclude"]
        current = exclude.text().strip()
        made_here = not current or Path(current).parent == self.runs_dir / "configs"
        if made_here and self.config_path is None:  # this dataset's own manifest, when it has one
            mine = self.default_manifest_path()
            exclude.setText(str(mine) if mine.exists() else "")

    def _mark_image(self, image: str, new_class) -> None:
        self.dataset_page.mark(image, new_class)
        what = "left out of training" if new_class is None else f"relabelled as {new_class}"
        self.statusBar().showMessage(f"{Path(image).name}: {what} in {self.dataset_page.manifest_path} (the next "
                                     f"run uses it; undo on the Dataset page)", 8000)

    def label_pool(self, run_path: str) -> LabelDialog:
        """The labelling view for `run_path`'s network; its labels go into the form's manifest, and "Train again"
        starts a run with them."""
        dialog = LabelDialog(run_path, lambda: self.dataset_page.manifest_path, self.dataset_page.add_labelled, self)
        dialog.trainRequested.connect(self.start_run)
        dialog.setAttribute(Qt.WidgetAttribute.WA_DeleteOnClose)
        dialog.resize(760, 460)
        dialog.show()
        return dialog

    def try_it(self) -> TryItDialog:
        """The Try it dialog, offering the shown run first, then every other run with a best checkpoint."""
        runs = [r.path for r in list_runs(self.runs_dir) if (r.checkpoints / "best.pt").exists()]
        current = self.run_model.run.path if self.run_model is not None else None
        if current is not None and (current / "checkpoints" / "best.pt").exists():
            runs = [current] + [r for r in runs if r != current]
        dataset = self.dataset_page.train_dir
        dialog = TryItDialog(runs, self, start_dir=str(Path(dataset).parent) if dataset else None)
        dialog.setAttribute(Qt.WidgetAttribute.WA_DeleteOnClose)
        dialog.show()
        return dialog

    def open_run(self, path: str) -> None:
        """Show a past run's curves (replayed from its events), re-attaching when it is still going."""
        run = RunDir(path)
        self.runs.open(run)
        before = self.current_raw()
        try:
            self.load_config(load_config(run.config))
        except ConfigError as e:
            log.warning("%s", e)
        else:
            if self.current_raw() != before:  # the forms now hold the run's settings: said, and undoable
                self._form_before_open = before
                self.restore_form.setText(f"Put the form back (it holds {run.name}'s settings now)")
                self.restore_form.show()
        self.nav.setCurrentRow(PAGES.index("Training"))

    def _restore_form(self) -> None:
        """The form as it was before a past run was opened (opening one loads its settings; the next Start trained
        that run's dataset without a word)."""
        before, self._form_before_open = self._form_before_open, None
        self.restore_form.hide()
        if before is not None:
            self.load_config(RunConfig.from_dict(before))
            self.statusBar().showMessage("The form is as it was before the run was opened", 5000)

    def show_findings(self, path: str, kind: str) -> None:
        """A finding of the Dataset page's data check: its run opened on the Results tab, the audit's view shown."""
        self.open_run(path)
        self.dashboard.tabs.setCurrentWidget(self.dashboard.results)
        self.dashboard.results.find_label_issues(kind)

    def _fit_progress(self) -> None:
        """The status bar's progress as wide as its text ("epoch 61/97 · stopped early" was cut at 1024 px)."""
        self.progress.setMinimumWidth(min(self.progress.maximumWidth(),
                                          self.progress.fontMetrics().horizontalAdvance(self.progress.text()) + 40))

    def _progress(self, done: float, epochs: int, eta_s: float | None) -> None:
        self.progress.setFormat("epoch %v/%m")
        self.progress.setMaximum(max(epochs, 1))
        self.progress.setValue(int(done))
        budget = (self.run_model.start_event.get("config", {}).get("train", {}).get("budget") or 0
                  if self.run_model is not None else 0)
        text = "" if eta_s is None else f"ETA {int(eta_s // 60)}:{int(eta_s % 60):02d}"
        if budget:  # the trainer ends the run when its budget is spent, whatever the pace says
            text = f"{text} (budget {budget:g} min)".strip()
        self.eta_label.setText(text)

    def _run_finished(self, state: str, message: str) -> None:
        self.eta_label.setText("")
        if state == "completed":  # what the run trained, of what it planned (an early stop ends short of it)
            done, epochs, reason = self.run_model.final_progress()
            self.progress.setMaximum(max(epochs, 1))
            self.progress.setValue(done)
            self.progress.setFormat(f"epoch %v/%m · {reason}" if reason else "epoch %v/%m")
            self._fit_progress()
        if state in ("failed", "diverged") and message and self.isVisible() and self.isActiveWindow():
            box = QMessageBox(QMessageBox.Icon.Warning, f"Run {state}", message, parent=self)
            box.setDetailedText(self.run_model.run.tail_log(30))
            box.setObjectName("runFailedBox")
            box.open()
        if self.tray and not self.isActiveWindow():
            self.tray.showMessage("TrainDeck", f"{self.run_model.run.name}: {state}",
                                  QSystemTrayIcon.MessageIcon.Warning if state != "completed"
                                  else QSystemTrayIcon.MessageIcon.Information)
        self.runs_page.refresh()

    def _process_ended(self, code: int) -> None:
        if self._close_after_stop:
            self.close()

    def _update_buttons(self) -> None:
        running = self.runs.running
        self.start_action.setEnabled(not running and not self.config_problems)
        self.stop_action.setEnabled(running and not self.runs.finishing)
        self.resume_action.setEnabled(self.runs.can_resume())

    # ---- settings and closing ----------------------------------------------------------------
    def _remember_recent(self, path: str) -> None:
        recent = [p for p in (self.settings.value("recent_configs") or []) if p != path]
        self.settings.setValue("recent_configs", [path] + recent[:9])

    def _near_the_dataset(self) -> str:
        """Where a file dialog opens when nothing was chosen before: beside the dataset, else the home folder."""
        dataset = self.dataset_page.train_dir
        return str(Path(dataset).parent) if dataset and Path(dataset).parent.is_dir() else str(Path.home())

    def _restore_last_config(self) -> bool:
        """The form as the last session left it (dataset, model, every setting); False when there is none or it no
        longer reads as a config (then the demo config is loaded)."""
        import yaml

        text = self.settings.value("last_config")
        if not isinstance(text, str) or not text.strip():
            return False
        try:
            cfg = RunConfig.from_dict(yaml.safe_load(text) or {})
        except (ConfigError, yaml.YAMLError, TypeError, ValueError) as e:
            log.warning("the last session's settings are not usable (%s): opening the demo config", e)
            return False
        path = self.settings.value("last_config_path")
        self.config_path = Path(path) if isinstance(path, str) and path else None
        self.load_config(cfg)
        return True

    def _restore_settings(self) -> None:
        geometry = self.settings.value("geometry")
        if isinstance(geometry, QByteArray):
            self.restoreGeometry(geometry)

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
        box.addButton(QMessageBox.StandardButton.Cancel)
        box.setObjectName("closeBox")

        def answered():
            if box.clickedButton() is stop:
                self._close_after_stop = True
                self.stop_run()
            elif box.clickedButton() is leave:
                self._leave_running = True
                self.close()

        box.finished.connect(answered)
        box.open()

    def shutdown(self) -> None:
        """Stop every timer and helper process this window owns (the trainer itself is left alone)."""
        self.settings.setValue("geometry", self.saveGeometry())
        cfg = self.current_config()  # an invalid form is not kept: the next start opens the demo config
        self.settings.setValue("last_config", cfg.to_yaml() if cfg is not None else "")
        self.settings.setValue("last_config_path", str(self.config_path or ""))
        self.settings.sync()
        self.dashboard.stop_updates()
        self.model_page.cancel_jobs()
        self.device_page.cancel_jobs()
        self.lr_finder.cancel()
        self._validate_timer.stop()
        self.runs.shutdown()
        if self.tray:
            self.tray.hide()


def load_style() -> str:
    try:
        return STYLE.read_text()
    except OSError:
        return ""


def app_icon() -> QIcon:
    return QIcon(str(REPO_ROOT / "resources" / "icon.png"))

