"""The trainer's advice on the form: Auto's plan (loaded, shown and started as a run) and the learning-rate finder
(its curve, and its suggestion into the form). Both are asked of the trainer; this shows what it answered."""

from __future__ import annotations

from typing import TYPE_CHECKING

from PySide6.QtCore import QObject, Signal
from PySide6.QtWidgets import QPushButton, QWidget

from app.jobs.background import CliJob
from app.jobs.lr_finder import LrFinder
from app.jobs.run_controller import RunController
from app.pages.auto_panel import AutoPanel
from app.window.form import Form
from trainer.core.config import ConfigError, RunConfig
from trainer.core.rundir import read_run_json
from trainer.runs.commands import Auto, FetchWeights

if TYPE_CHECKING:
    from app.dialogs.lr_find_dialog import LrFindDialog


AUTO = "Auto's plan"  # who set the values of a plan
LR_FINDER = "the learning-rate finder"


class Planning(QObject):
    showTraining = Signal()  # Auto started its run: the Training page shows it

    def __init__(self, form: Form, runs: RunController, panel: AutoPanel, find_lr_button: QPushButton,
                 parent: QWidget):
        super().__init__(parent)
        self.form, self.model, self.runs = form, form.model, runs
        self.panel, self.find_lr_button, self.parent_widget = panel, find_lr_button, parent
        self.auto_job: CliJob | None = None
        self.download_job: CliJob | None = None  # the offered ImageNet weights, downloading
        self.panel.downloadRequested.connect(self.download_weights)
        self.panel.downloadCancelled.connect(self.cancel_download)
        self.lr_dialog: LrFindDialog | None = None
        self._asked: tuple | None = None  # what the last Auto plan was asked for (folder, minutes, overrides, labels)
        self.lr_finder = LrFinder(form.runs_folder, self)
        self.lr_finder.done.connect(self._lr_found)
        self.lr_finder.failed.connect(self._lr_failed)
        self.lr_finder.point.connect(lambda lr, loss: self.lr_dialog and self.lr_dialog.add_point(lr, loss))

    # ---- the learning-rate finder --------------------------------------------------------------------
    def find_lr(self, lr_range: tuple[float, float] | None = None) -> None:
        """Sweep the learning rate on the current form (in a subprocess), over the trainer's range or `lr_range`;
        show the curve, offer the suggestion (or, without one, the wider range the trainer proposes)."""
        cfg = self.form.config()
        if cfg is None or self.lr_finder.busy:
            return
        if self.lr_dialog is not None:
            self.lr_dialog.done(0)  # an earlier sweep's window, replaced by this one
        self.lr_finder.start(cfg, lr_range)
        self._lr_button(sweeping=True)
        from app.dialogs.lr_find_dialog import LrFindDialog  # with pyqtgraph: not part of the start-up

        self.lr_dialog = dialog = LrFindDialog(lambda lr: self.model.set("optimizer.lr", lr, LR_FINDER),
                                               self.parent_widget, extend=self.find_lr)
        dialog.rejected.connect(lambda: self._lr_given_up(dialog))
        dialog.open()

    def _lr_given_up(self, dialog: LrFindDialog) -> None:
        """The curve's window closed before the sweep ended: the sweep is given up."""
        if dialog is self.lr_dialog and self.lr_finder.busy:
            self.lr_finder.cancel()
            self._lr_button(sweeping=False)

    def _lr_button(self, sweeping: bool) -> None:
        button = self.find_lr_button
        button.setEnabled(not sweeping)
        button.setText("Sweeping…" if sweeping else "Find…")

    def _lr_found(self, result: dict) -> None:
        self._lr_button(sweeping=False)
        self.lr_dialog.finish(result)

    def _lr_failed(self, error: str) -> None:
        self._lr_button(sweeping=False)
        self.lr_dialog.fail(error)

    # ---- Auto ----------------------------------------------------------------------------------------
    def auto_plan(self, minutes: float) -> CliJob | None:
        """Auto (issue #24): plan in a subprocess (`main.py auto --plan-only`), then load the plan into the forms,
        show every choice and start it as a run."""
        model = self.model
        folder, host, labels = (str(model.get(key) or "").strip() for key in ("data.train_dir", "device.host",
                                                                              "data.labels"))
        if self.auto_job is not None or self.runs.running:
            self.panel.failed("a run is going; stop it first" if self.runs.running else "already planning")
            return None
        if not folder:
            self.panel.failed("choose a folder of training images first")
            return None
        exclude = str(model.get("data.exclude") or "").strip()
        overrides = [f"data.exclude={exclude}"] if exclude else []
        # multi-label: Auto plans a run of the labels file, by mAP; with a host, there, on its devices
        self.auto_job = job = CliJob(Auto(folder=folder, minutes=minutes, plan_only=True, labels=labels or None,
                                          host=host or None, set=overrides), self)
        self._asked = (folder, minutes, overrides, labels or None)
        self.panel.planning("starting")
        job.progress.connect(lambda line: self.panel.planning(line.removeprefix("auto: ").strip())
                             if line.startswith("auto: ") else None)
        job.done.connect(self._auto_planned)
        job.failed.connect(self._auto_failed)
        return job

    def _auto_failed(self, error: str) -> None:
        self.auto_job = None
        self.panel.failed(error)

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
        self.form.config_path = None
        self.form.load(cfg, set_by=AUTO)
        offer = None if self.model.get("device.host") else plan.get("offer")  # a host's cache is the host's
        self.panel.show_choices(plan["choices"], plan.get("planning_s", 0), plan.get("probes"), offer)
        if self.form.validate() or self.runs.running:
            self.panel.failed("the plan is loaded, but the form has problems (see the status bar)")
            return
        self.runs.start(cfg, choices=plan["choices"])
        # The budget was that run's: the form keeps Auto's other choices (marked on the Advanced page), not its clock.
        self.model.set("train.budget", 0.0, AUTO)
        self.model.set("train.finish_images", 0, AUTO)
        self.form.validate()
        self.showTraining.emit()

    def _auto_in_job(self, plan: dict) -> None:
        """Auto submitted to a SLURM host as one run: its choices are shown once the job has made them (its
        auto.json, mirrored); the forms are left as they were (the plan is the job's)."""
        folder, minutes, overrides, labels = self._asked
        run = self.runs.start_auto(folder, minutes, plan["host"], overrides, labels)
        panel = self.panel
        panel.waiting_for_job(plan["why"])

        def show_when_planned(_event) -> None:
            if panel.shown_run == run.path:
                return
            try:
                choices = read_run_json(run.auto_choices, "Auto's choices")["choices"]
            except (OSError, ValueError, KeyError, TypeError):
                return  # not mirrored yet: the next epoch looks again
            panel.show_job_choices(choices, run.path, plan["host"])

        self.runs.model.runStarted.connect(show_when_planned)
        self.runs.model.epochEnded.connect(show_when_planned)
        self.runs.model.finished.connect(lambda *_: show_when_planned(None))
        self.showTraining.emit()

    # ---- the offered ImageNet weights ---------------------------------------------------------------------
    def download_weights(self, model: str, weights: str) -> CliJob | None:
        """`main.py fetch-weights MODEL WEIGHTS` (a subprocess): its progress on the Auto box, Cancel stops it (the
        partial file goes), and the next plan finds the weights in the cache."""
        if self.download_job is not None:
            return None
        self.download_job = job = CliJob(FetchWeights(model=model, weights=weights), self, parse_json=False,
                                         gentle_cancel=True)
        job.progress.connect(self.panel.downloading)
        job.done.connect(lambda out: self._downloaded(f"Downloaded into {out.strip()}: the next Auto plans with "
                                                      f"{model}'s ImageNet weights.", True))
        job.failed.connect(lambda error: self._downloaded(f"Not downloaded: {error}", False))
        return job

    def cancel_download(self) -> None:
        if self.download_job is not None:
            self.download_job.cancel()
            self._downloaded("Download cancelled: nothing was kept.", False)

    def _downloaded(self, text: str, ok: bool) -> None:
        self.download_job = None
        self.panel.download_ended(text, ok)

    def shutdown(self) -> None:
        if self.download_job is not None:
            self.download_job.cancel()
        self.lr_finder.cancel()
