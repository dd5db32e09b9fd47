"""What the toolbar and the pages ask of runs: start, stop, resume, continue, queue, sweep, open a past one, Try it,
and the labelling and manifest actions of a run's results. The run lifecycle itself is `app/jobs/run_controller.py`'s."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from PySide6.QtCore import QObject, Qt, QTimer, Signal
from PySide6.QtWidgets import QMessageBox, QWidget

from app.dialogs.label_dialog import LabelDialog
from app.dialogs.run_dialogs import ExtendDialog
from app.dialogs.sweep_dialog import SweepDialog
from app.dialogs.try_it import TryItDialog
from app.jobs.background import CliJob, run_in_thread
from app.jobs.run_controller import RunController
from app.pages.dataset_page import DatasetPage
from app.pages.queue_page import QueuePage
from app.state.experiments import extension_facts
from trainer.core.config import save_config
from trainer.core.rundir import RunDir, list_runs, new_config_file
from trainer.runs.commands import Queue

if TYPE_CHECKING:
    from app.training.dashboard import Dashboard
    from app.window.form import Form


class RunActions(QObject):
    showTraining = Signal()  # a run was started, resumed or opened: the Training page shows it
    said = Signal(str, int)  # a line for the status bar, and for how many ms

    def __init__(self, form: Form, runs: RunController, dataset: DatasetPage, queue: QueuePage,
                 dashboard: Callable[[], Dashboard], parent: QWidget):
        super().__init__(parent)
        self.form, self.runs, self.dataset, self.queue = form, runs, dataset, queue
        self.dashboard = dashboard  # the Training page, built when first asked for
        self.parent_widget = parent  # the dialogs' parent
        self.extend_dialog: ExtendDialog | None = None

    def start(self) -> None:
        if self.form.validate() or self.runs.running:
            return
        self.runs.start(self.form.config())
        self.showTraining.emit()

    def resume(self, path: str | None) -> None:
        run = RunDir(path) if path else (self.runs.model.run if self.runs.model else None)
        if run is None or self.runs.running:
            return
        refused = self.runs.resume(run)
        if refused:
            QMessageBox.information(self.parent_widget, "Resume", refused)
            return
        self.showTraining.emit()

    def extend(self, path: str) -> None:
        """"Continue for N more epochs": the dialog shows the schedule rule's effect, then the run is resumed with
        --epochs TOTAL."""
        run = RunDir(path)

        def ask(facts: dict) -> None:
            dialog = ExtendDialog(run, facts, self.parent_widget)
            dialog.setAttribute(Qt.WidgetAttribute.WA_DeleteOnClose)
            dialog.accepted.connect(lambda: self._extend(run, dialog.total))
            dialog.open()
            self.extend_dialog = dialog

        run_in_thread(lambda: extension_facts(run), ask,
                      lambda error: QMessageBox.warning(self.parent_widget, "Continue", f"{run.name}: {error}"), owner=self)

    def _extend(self, run: RunDir, total: int) -> None:
        refused = self.runs.extend(run, total)
        if refused:
            QMessageBox.information(self.parent_widget, "Continue", refused)
            return
        self.showTraining.emit()

    def open(self, path: str) -> None:
        """Show a past run's curves (replayed from its events), re-attaching when it is still going; its settings go
        into the forms, said and undoable. The Training page shows it on the next turn of the event loop (laid out
        the first time: ~20 ms of the GUI thread, not added to the open's own)."""
        run = RunDir(path)
        self.runs.open(run)
        self.form.load_run(run)
        QTimer.singleShot(1, self, self.showTraining.emit)  # a timer, not a posted call: what is due goes first

    # ---- the queue and sweeps ------------------------------------------------------------------
    def _form_config_file(self) -> Path | None:
        """The form's config written to the runs folder's configs (what a queued run or a sweep starts from)."""
        cfg = self.form.config()
        if cfg is None or self.form.problems:
            QMessageBox.warning(self.parent_widget, "Cannot queue",
                                "Fix the marked settings first:\n" + "\n".join(self.form.problems))
            return None
        path = new_config_file(self.form.runs_folder.path)
        save_config(cfg, path)
        return path

    def add_to_queue(self, button) -> CliJob | None:
        """Queue the form's config (`main.py queue add`, which checks it) and make sure a scheduler works the queue;
        `button` is off while it is asked (a double click queued two)."""
        if not button.isEnabled():
            return None
        path = self._form_config_file()
        if path is None:
            return None
        job = CliJob(Queue(action="add", target=str(path), runs_dir=str(self.form.runs_folder.path)), self,
                     parse_json=False)
        button.setEnabled(False)
        queue = self.queue

        def done(out: str) -> None:
            button.setEnabled(True)
            self.said.emit(f"queued {Path(out.strip()).name}", 8000)
            queue.ensure_scheduler()
            queue.refresh()

        def failed(error: str) -> None:
            button.setEnabled(True)
            QMessageBox.warning(self.parent_widget, "Not queued", error)

        job.done.connect(done)
        job.failed.connect(failed)
        return job

    def open_sweep_dialog(self) -> SweepDialog | None:
        path = self._form_config_file()
        if path is None:
            return None
        queue = self.queue
        dialog = SweepDialog(path, self.form.runs_folder.path, self.parent_widget)
        dialog.add_grid_row("optimizer.lr", "1e-3, 3e-3, 1e-2")
        dialog.queued.connect(lambda _: (queue.ensure_scheduler(), queue.refresh()))
        dialog.setAttribute(Qt.WidgetAttribute.WA_DeleteOnClose)
        dialog.show()
        return dialog

    # ---- a run's results and the dataset's manifest ----------------------------------------------
    def mark_image(self, image: str, new_class) -> None:
        dataset = self.dataset
        dataset.mark(image, new_class)
        what = "left out of training" if new_class is None else f"relabelled as {new_class}"
        self.said.emit(f"{Path(image).name}: {what} in {dataset.manifest_path} (the next run uses it; undo on the "
                       f"Dataset page)", 8000)

    def label_pool(self, run_path: str) -> LabelDialog:
        """The labelling view for `run_path`'s network; its labels go into the form's manifest, and "Train again"
        starts a run with them."""
        dataset = self.dataset
        dialog = LabelDialog(run_path, lambda: dataset.manifest_path, dataset.add_labelled, self.parent_widget)
        dialog.trainRequested.connect(self.start)
        dialog.setAttribute(Qt.WidgetAttribute.WA_DeleteOnClose)
        dialog.resize(760, 460)
        dialog.show()
        return dialog

    def show_findings(self, path: str, kind: str) -> None:
        """A finding of the Dataset page's data check: its run opened on the Results tab, the audit's view shown."""
        self.open(path)
        dashboard = self.dashboard()
        dashboard.tabs.setCurrentWidget(dashboard.results)
        results = dashboard.results
        results.find_label_issues(kind)

    def try_it(self) -> TryItDialog:
        """The Try it dialog, offering the shown run first, then every other run with a best checkpoint."""
        runs = [r.path for r in list_runs(self.form.runs_folder.path) if r.best_checkpoint.exists()]
        current = self.runs.model.run.path if self.runs.model is not None else None
        if current is not None and RunDir(current).best_checkpoint.exists():
            runs = [current] + [r for r in runs if r != current]
        dataset = str(self.form.model.get("data.train_dir") or "")
        dialog = TryItDialog(runs, self.parent_widget, start_dir=str(Path(dataset).parent) if dataset else None)
        dialog.setAttribute(Qt.WidgetAttribute.WA_DeleteOnClose)
        dialog.show()
        return dialog
