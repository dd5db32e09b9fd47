"""The form's file and lifecycle: load a config into the form model, validate it, New, a past run's settings and back,
and the manifest that follows the dataset. The values are the model's (`app/state/form_model.py`); the pages show
them; the rules are the model's and the config's."""

from __future__ import annotations

import logging
from pathlib import Path

from PySide6.QtCore import QObject, QTimer, Signal
from PySide6.QtWidgets import QMessageBox, QPushButton, QWidget

from app.pages.setup_pages import SetupPages
from app.state.form_model import FormModel, manifest_path_for
from app.state.runs_folder import RunsFolder
from trainer.core.config import ConfigError, RunConfig, load_config
from trainer.core.rundir import RunDir, configs_folder
from trainer.data.demo_data import demo_dataset_dir
from trainer.runs.launch import REPO_ROOT

log = logging.getLogger(__name__)

DEMO_CONFIG = REPO_ROOT / "resources" / "demo.yaml"
VALIDATE_AFTER_MS = 150  # an edit is checked once typing pauses
DATASET_MANIFEST = "the dataset's manifest"  # who set data.exclude when it follows the dataset


class Form(QObject):
    validated = Signal(list)  # the form's problems (none: it can start)
    said = Signal(str, int)  # a line for the status bar, and for how many ms

    def __init__(self, model: FormModel, pages: SetupPages, runs_folder: RunsFolder, parent: QWidget):
        super().__init__(parent)
        self.parent_widget = parent  # the dialogs' parent
        self.model, self.pages, self.runs_folder = model, pages, runs_folder
        self.timer = QTimer(self)
        self.timer.setSingleShot(True)
        self.timer.setInterval(VALIDATE_AFTER_MS)
        self.timer.timeout.connect(self.validate)
        self.restore_button = QPushButton("Put the form back")
        self.restore_button.setObjectName("restoreForm")
        self.restore_button.setToolTip("Opening a run loaded its settings into the forms; this puts back what they "
                                       "held")
        self.restore_button.clicked.connect(self.restore)
        self.restore_button.hide()
        model.listen(self._changed)

    @property
    def problems(self) -> list[str]:
        return self.model.problems

    @property
    def config_path(self) -> Path | None:
        return self.model.config_path

    @config_path.setter
    def config_path(self, path: Path | None) -> None:
        self.model.config_path = path

    def _changed(self, key: str | None, _by: str) -> None:
        self.timer.start()  # checked once the edits pause
        if key == "data.train_dir":
            self.follow_dataset()

    # ---- in and out ------------------------------------------------------------------------------
    def load_file(self, path: Path) -> bool:
        try:
            cfg = load_config(path)
        except ConfigError as e:
            QMessageBox.warning(self.parent_widget, "Cannot load config", str(e))
            return False
        is_demo = Path(path) == DEMO_CONFIG
        if is_demo:  # the app's demo dataset lives in the user's data folder
            cfg.data.train_dir = str(demo_dataset_dir())
        self.model.config_path = None if is_demo else Path(path)
        self.load(cfg, set_by="the demo config" if is_demo else Path(path).name)
        return True

    def load(self, cfg: RunConfig, set_by: str = "") -> None:
        """Show `cfg` in the forms; `set_by` names who chose its values (the Advanced page says so)."""
        self._show(cfg.to_dict(), set_by)

    def _show(self, raw: dict, set_by: str = "") -> None:
        self.model.load(raw, set_by)
        self.restore_button.hide()
        self.pages.dataset.scan()
        self.validate()

    def raw(self) -> dict:
        return self.model.raw()

    def config(self) -> RunConfig | None:
        return self.model.config()

    def validate(self) -> list[str]:
        """Check the form and mark the widgets at fault in place; `validated` tells the window."""
        problems = self.model.check()
        problems += self.pages.problems(self.model.raw())
        self.model.problems = problems
        self.pages.mark_errors(problems)
        self.validated.emit(problems)
        return problems

    def new(self) -> None:
        """The settings of a first start (the demo's config) on the form's dataset: a fresh start, whatever a plan
        or an opened run had set. The dataset's fields stay even when they do not make a valid config yet (they
        were cleared, while the status bar said 'on the same dataset'): the forms then mark what to fix."""
        self.model.new(load_config(DEMO_CONFIG).to_dict())
        self.restore_button.hide()
        self.pages.dataset.scan()
        self.validate()
        self.said.emit("New config: every setting at its default, on the same dataset", 5000)

    # ---- a past run's settings -----------------------------------------------------------------------
    def load_run(self, run: RunDir) -> None:
        """A past run's settings into the forms (what the trainer decided for its data back to auto), said and
        undoable (the next Start trained that run's dataset without a word)."""
        before = self.model.raw()
        try:
            self.load(run.settings(), set_by=f"run {run.name}")
        except ConfigError as e:
            log.warning("%s", e)
            return
        if self.model.raw() != before:
            self.model.before_open = before
            self.restore_button.setText(f"Put the form back (it holds {run.name}'s settings now)")
            self.restore_button.show()

    def restore(self) -> None:
        """The form as it was before a past run was opened (valid or not)."""
        before = self.model.before_open
        if before is not None:
            self._show(before)
            self.said.emit("The form is as it was before the run was opened", 5000)
        self.restore_button.hide()

    # ---- the dataset's manifest ----------------------------------------------------------------------
    @property
    def manifest_path(self) -> Path:
        return manifest_path_for(self.model.get("data.train_dir") or "", self.runs_folder.path,
                                 self.model.config_path)

    def follow_dataset(self) -> None:
        """A manifest TrainDeck made for another dataset (in the runs folder) does not follow the user to this one."""
        current = str(self.model.get("data.exclude") or "").strip()
        made_here = not current or Path(current).parent == configs_folder(self.runs_folder.path)
        if made_here and self.model.config_path is None:  # this dataset's own manifest, when it has one
            mine = self.manifest_path
            self.model.set("data.exclude", str(mine) if mine.exists() else None, DATASET_MANIFEST)
