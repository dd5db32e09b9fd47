"""The form as a model, Qt-free: every config key's value, who set it, the file it came from and its problems.

The set-up pages are views of it: each widget shows its key's value and tells the model what the user typed, parsed
by the key's parser; whatever else sets a value (a recipe, Auto's plan, the learning-rate finder, a folder's layout, a
labels file, a past run) calls `set(key, value, by=...)` with who it is, and the Advanced page shows that. What an
edit implies is the trainer's rule (`trainer/data/edits.py`), applied here. Values are stored as given: no widget's
rounding reaches the config. Listeners are plain callables, called as `listener(key, by)` after each change (key None
after `load`: any key may have changed).
"""

from __future__ import annotations

import copy
import hashlib
import os
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

from trainer.core.config import ConfigError, RunConfig
from trainer.core.rundir import configs_folder
from trainer.data.edits import SPLIT_NAMES, folder_layout, get_path, implied_by, new_config_raw, set_path, splits_to_clear

USER = "you"  # who set a value typed or chosen in the form
LAYOUT = "the folder's layout"
Listener = Callable[[str | None, str], None]


def manifest_path_for(train_dir: str, runs_dir: Path, config_path: Path | None) -> Path:
    """Where a new data.exclude manifest goes: beside the open config file, else in the runs folder's configs,
    named after the dataset (another dataset gets another manifest)."""
    if config_path is not None:
        return config_path.with_name(f"{config_path.stem}.exclude.yaml")
    real = os.path.realpath(train_dir or "dataset")
    name = re.sub(r"[^A-Za-z0-9_.-]+", "_", Path(real).name)[:40] or "dataset"
    return configs_folder(runs_dir) / f"{name}-{hashlib.sha1(real.encode()).hexdigest()[:8]}.exclude.yaml"


class FormModel:
    def __init__(self, raw: dict | None = None):
        self._raw = copy.deepcopy(raw) if raw is not None else RunConfig().to_dict()
        self.set_by: dict[str, str] = {}  # key -> who set its value ("you", "Auto's plan", "the config file")
        self.config_path: Path | None = None  # the file loaded or saved (None: the demo, a plan, New)
        self.folder_gave: dict | None = None  # the splits a training folder's layout set (`folder_layout`'s answer)
        self.before_open: dict | None = None  # the form before a past run's settings were loaded into it
        self.problems: list[str] = []  # the last validation's
        self.checked: RunConfig | None = None  # the config the last validation parsed (None: it did not parse)
        self._listeners: list[Listener] = []

    # ---- values -------------------------------------------------------------------------------------
    def get(self, key: str) -> Any:
        return get_path(self._raw, key)

    def raw(self) -> dict:
        """The whole config as a nested dict (a copy)."""
        return copy.deepcopy(self._raw)

    def set(self, key: str, value: Any, by: str = USER) -> bool:
        """`key` holds `value` now, set by `by`; what the edit implies follows (set by the same). False: it held it."""
        if self.get(key) == value and type(self.get(key)) is type(value):
            return False
        set_path(self._raw, key, copy.deepcopy(value))
        self.set_by[key] = by
        self._tell(key, by)
        for implied, implied_value in implied_by(key, self._raw).items():
            self.set(implied, implied_value, by)
        return True

    def load(self, raw: dict, by: str = "") -> None:
        """Another config in the form: `by` names who chose its values (those that differ from the defaults); its
        splits are its own, and what an opened run replaced is gone."""
        self._raw = copy.deepcopy(raw)
        defaults = RunConfig().to_dict()
        self.set_by = {key: by for key in _keys(self._raw) if get_path(defaults, key) != self.get(key)} if by else {}
        self.folder_gave = None
        self.before_open = None
        self._tell(None, by)

    def listen(self, listener: Listener) -> None:
        self._listeners.append(listener)

    def _tell(self, key: str | None, by: str) -> None:
        for listener in list(self._listeners):
            listener(key, by)

    # ---- checks and rules ---------------------------------------------------------------------------
    def config(self) -> RunConfig | None:
        try:
            return RunConfig.from_dict(self.raw())
        except ConfigError:
            return None

    def check(self) -> list[str]:
        """The config's own problems (each starting with the key at fault); `checked` holds the config when none."""
        self.checked = None
        try:
            self.checked = RunConfig.from_dict(self.raw())
        except ConfigError as e:
            return list(e.problems)
        return []

    def settle_folder(self, folder: str, local: bool = True) -> str:
        """The training folder is `folder` now (typing has paused, or it was chosen): the splits an earlier folder's
        layout gave go (unless the user set another since), and a folder laid out as train/ val/ test/ gives its own
        (`local`: on this machine; a host's scan there says what its folder holds). What happened, for the status bar
        ("" when nothing did)."""
        gave = self.folder_gave
        if gave and os.path.normpath(folder) != os.path.normpath(gave["data.train_dir"]):
            self.folder_gave = None  # another training folder: what the last one gave is no longer its
        cleared = splits_to_clear(gave, folder, self._raw)
        for key in cleared:
            self.set(key, "" if key == "data.val_dir" else None, LAYOUT)
        layout = folder_layout(folder) if local else None
        if layout is None:
            return (f"{folder}: a new training folder; the {' and '.join(SPLIT_NAMES[k] for k in cleared)} folder of "
                    f"the last one no longer applies and was cleared") if cleared else ""
        for key in ("data.val_dir", "data.test_dir", "data.train_dir"):
            self.set(key, layout[key], LAYOUT)
        self.folder_gave = layout
        splits = ", ".join(f"{split}/" for split, key in (("train", "data.train_dir"), ("val", "data.val_dir"),
                                                          ("test", "data.test_dir")) if layout[key])
        return f"{folder} holds {splits}: they are used as the training, validation and test sets"

    def new(self, start: dict) -> None:
        """A first start's settings (`start`) on the form's dataset, as New gives them; the dataset's values stay even
        where they do not make a valid config yet (the forms then mark what to fix)."""
        self.load(new_config_raw(self._raw, start))
        self.config_path = None


def _keys(raw: dict, prefix: str = "") -> list[str]:
    """Every leaf's dotted key in a nested config dict."""
    keys = []
    for name, value in raw.items():
        key = f"{prefix}{name}"
        keys += _keys(value, key + ".") if isinstance(value, dict) else [key]
    return keys
