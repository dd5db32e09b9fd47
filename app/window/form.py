"""The set-up pages as one config: load it, read it back, validate it, New, a past run's settings and back, and
the splits a training folder's layout gives. The rules are `app/state/form_state.py`'s and the config's; this
applies them to the widgets."""

from __future__ import annotations

import copy
import logging
import os
from pathlib import Path

from PySide6.QtCore import QObject, QTimer, Signal
from PySide6.QtWidgets import QMessageBox, QPushButton

from app.state.form_state import SPLIT_NAMES, FormState, get_path, manifest_path_for, new_config_raw
from app.state.runs_folder import RunsFolder
from trainer.core.config import DATASET_KEYS, ConfigError, RunConfig, load_config
from trainer.core.rundir import RunDir, configs_folder
from trainer.data.demo_data import demo_dataset_dir
from trainer.data.scan import find_layout
from trainer.runs.launch import REPO_ROOT

log = logging.getLogger(__name__)

DEMO_CONFIG = REPO_ROOT / "resources" / "demo.yaml"
VALIDATE_AFTER_MS = 150  # an edit is checked once typing pauses


class Form(QObject):
    validated = Signal(list)  # the form's problems (none: it can start)
    said = Signal(str, int)  # a line for the status bar, and for how many ms

    def __init__(self, window, runs_folder: RunsFolder):
        super().__init__(window)
        self.window = window  # the dialogs' parent
        self.binder = window.binder
        self.pages = window.dataset_page, window.model_page, window.optimizer_page, window.device_page
        self.advanced = window.advanced_page
        self.runs_folder = runs_folder
        self.state = FormState()
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

    @property
    def problems(self) -> list[str]:
        return self.state.problems

    @property
    def config_path(self) -> Path | None:
        return self.state.config_path

    @config_path.setter
    def config_path(self, path: Path | None) -> None:
        self.state.config_path = path

    # ---- in and out ------------------------------------------------------------------------------
    def load_file(self, path: Path) -> bool:
        try:
            cfg = load_config(path)
        except ConfigError as e:
            QMessageBox.warning(self.window, "Cannot load config", str(e))
            return False
        is_demo = Path(path) == DEMO_CONFIG
        if is_demo:  # the app's demo dataset lives in the user's data folder
            cfg.data.train_dir = str(demo_dataset_dir())
        self.state.config_path = None if is_demo else Path(path)
        self.load(cfg)
        return True

    def load(self, cfg: RunConfig, set_by: str = "") -> None:
        """Show `cfg` in the forms; `set_by` names who chose its values (the Advanced page marks them so)."""
        dataset, model, optimizer, device = self.pages
        raw = cfg.to_dict()
        self.state.loaded = raw
        self.state.loaded_again()
        self.restore_button.hide()
        self.binder.load(raw)
        optimizer.load(raw)
        device.load(raw)
        self.advanced.load(raw, set_by)
        dataset.scan()
        self.validate()

    def raw(self) -> dict:
        raw = copy.deepcopy(self.state.loaded or RunConfig().to_dict())
        self.binder.dump(raw)
        for page in self.pages[2:] + (self.advanced,):
            page.dump(raw)
        return raw

    def config(self) -> RunConfig | None:
        try:
            return RunConfig.from_dict(self.raw())
        except ConfigError:
            return None

    def validate(self) -> list[str]:
        """Check the form and mark the widgets at fault in place; `validated` tells the window."""
        dataset, model, optimizer, device = self.pages
        raw = self.raw()
        problems: list[str] = []
        self.state.checked = None
        try:
            self.state.checked = RunConfig.from_dict(raw)
        except ConfigError as e:
            problems.extend(e.problems)
        problems += dataset.problems() + model.problems()
        problems += optimizer.groups.problems(optimizer.head, bool(get_path(raw, "model.freeze_backbone")))
        problems += device.problems(raw)
        self.state.problems = problems
        self.binder.mark_errors(problems)
        optimizer.groups.mark_errors(problems)
        self.advanced.mark_errors(problems)
        self.validated.emit(problems)
        return problems

    def new(self) -> None:
        """The settings of a first start (the demo's config) on the form's dataset: a fresh start, whatever a plan
        or an opened run had set. The dataset's fields stay even when they do not make a valid config yet (they
        were cleared, while the status bar said 'on the same dataset'): the forms then mark what to fix."""
        first_start = load_config(DEMO_CONFIG)
        raw = new_config_raw(self.raw(), first_start.to_dict())
        try:
            cfg = RunConfig.from_dict(raw)
        except ConfigError:
            cfg = first_start
        self.state.config_path = None
        self.load(cfg)
        for key in DATASET_KEYS:  # what the defaults could not take is set as it was, to be marked
            value = get_path(raw, key)
            if value and getattr(cfg.data, key.removeprefix("data.")) != value:
                if key in self.binder.widgets:
                    self.binder.widgets[key].setText(str(value))
                else:
                    self.advanced.set_value(key, value)
        self.validate()
        self.said.emit("New config: every setting at its default, on the same dataset", 5000)

    # ---- a past run's settings -----------------------------------------------------------------------
    def load_run(self, run: RunDir) -> None:
        """A past run's settings into the forms (what the trainer decided for its data back to auto), said and
        undoable (the next Start trained that run's dataset without a word)."""
        before, name = self.raw(), run.name
        try:
            self.load(run.settings())
        except ConfigError as e:
            log.warning("%s", e)
            return
        if self.raw() != before:
            self.state.before_open = before
            self.restore_button.setText(f"Put the form back (it holds {name}'s settings now)")
            self.restore_button.show()

    def restore(self) -> None:
        """The form as it was before a past run was opened."""
        before, self.state.before_open = self.state.before_open, None
        self.restore_button.hide()
        if before is not None:
            self.load(RunConfig.from_dict(before))
            self.said.emit("The form is as it was before the run was opened", 5000)

    # ---- the dataset -----------------------------------------------------------------------------
    @property
    def manifest_path(self) -> Path:
        return manifest_path_for(self.pages[0].train_dir, self.runs_folder.path, self.state.config_path)

    def use_folder_splits(self, folder: str) -> None:
        """A folder laid out as train/ val/ test/ is used as those splits (the scan's rule, as Auto does), and what it
        gave is remembered: when the training folder becomes another one, the splits it gave go (a flat folder kept
        the first folder's val/ and test/, and the run validated and tested on another dataset); a split the user
        set since stays. A host's folders are not on this machine: its scan there says what it holds."""
        cleared = self._forget_folder_splits(folder)
        layout = find_layout(folder) if not self.pages[3].host else None
        if layout is None or os.path.normpath(layout["train_dir"]) == os.path.normpath(folder):
            if cleared:
                self.said.emit(f"{folder}: a new training folder; the {' and '.join(cleared)} folder of the last one "
                               f"no longer applies and was cleared", 10000)
            return
        self.binder.widgets["data.val_dir"].setText(layout["val_dir"] or "")
        self.advanced.set_value("data.test_dir", layout["test_dir"])
        self.state.splits_given(layout)
        self.binder.widgets["data.train_dir"].setText(layout["train_dir"])
        splits = ", ".join(f"{s}/" for s in ("train", "val", "test") if layout[f"{s}_dir"])
        self.said.emit(f"{folder} holds {splits}: they are used as the training, validation and test sets", 10000)

    def _forget_folder_splits(self, folder: str) -> list[str]:
        """The splits an earlier training folder gave, cleared; which ("validation", "test")."""
        val = self.binder.widgets["data.val_dir"]
        keys = self.state.splits_to_clear(folder, {"data.val_dir": val.text(),
                                                   "data.test_dir": self.advanced.value("data.test_dir")})
        if "data.val_dir" in keys:
            val.setText("")
        if "data.test_dir" in keys:
            self.advanced.set_value("data.test_dir", None)
        return [SPLIT_NAMES[key] for key in keys]

    def follow_dataset(self) -> None:
        """A manifest TrainDeck made for another dataset (in the runs folder) does not follow the user to this one."""
        exclude = self.binder.widgets["data.exclude"]
        current = exclude.text().strip()
        made_here = not current or Path(current).parent == configs_folder(self.runs_folder.path)
        if made_here and self.state.config_path is None:  # this dataset's own manifest, when it has one
            mine = self.manifest_path
            exclude.setText(str(mine) if mine.exists() else "")
