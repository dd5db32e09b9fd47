"""What the form holds besides its widgets' values, and the rules that follow from it; Qt-free.

The config file it came from, the config it was loaded from (keys with no widget keep their values there), the
splits a training folder's own layout gave, and the form as it was before a past run's settings replaced it. The
rules: New keeps the dataset and nothing else; a new training folder drops the splits the last one gave (never a
split the user set since); a manifest TrainDeck makes is named after its dataset.
"""

from __future__ import annotations

import copy
import hashlib
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from trainer.core.config import DATASET_KEYS, RunConfig, loss_for_labels
from trainer.core.rundir import configs_folder

SPLIT_NAMES = {"data.val_dir": "validation", "data.test_dir": "test"}


def get_path(raw: dict, key: str) -> Any:
    """The value at a dotted key ("data.val_split") of a nested config dict; None where it has none."""
    node: Any = raw
    for part in key.split("."):
        node = node.get(part) if isinstance(node, dict) else None
    return node


def set_path(raw: dict, key: str, value: Any) -> None:
    parts = key.split(".")
    node = raw
    for part in parts[:-1]:
        node = node.setdefault(part, {})
    node[parts[-1]] = value


def new_config_raw(current: dict, start: dict) -> dict:
    """Every setting as a first start has it (`start`: the config the window first opens with) on `current`'s
    dataset; a labels file means its loss, as the config's rule says."""
    raw = copy.deepcopy(start)
    for key in DATASET_KEYS:
        set_path(raw, key, get_path(current, key))
    loss = get_path(raw, "loss.name") or RunConfig().loss.name
    set_path(raw, "loss.name", loss_for_labels(bool(get_path(raw, "data.labels")), loss))
    return raw


def manifest_path_for(train_dir: str, runs_dir: Path, config_path: Path | None) -> Path:
    """Where a new data.exclude manifest goes: beside the open config file, else in the runs folder's configs,
    named after the dataset (another dataset gets another manifest)."""
    if config_path is not None:
        return config_path.with_name(f"{config_path.stem}.exclude.yaml")
    real = os.path.realpath(train_dir or "dataset")
    name = re.sub(r"[^A-Za-z0-9_.-]+", "_", Path(real).name)[:40] or "dataset"
    return configs_folder(runs_dir) / f"{name}-{hashlib.sha1(real.encode()).hexdigest()[:8]}.exclude.yaml"


@dataclass
class FormState:
    config_path: Path | None = None  # the file the form was loaded from or saved to (None: the demo, a plan, New)
    loaded: dict | None = None  # the config last loaded (the keys no page shows keep its values)
    folder_gave: dict | None = None  # {"train_dir", "data.val_dir", "data.test_dir"} a folder's layout set
    before_open: dict | None = None  # the form before a past run's settings were loaded into it
    problems: list[str] = field(default_factory=list)  # the last validation's
    checked: RunConfig | None = None  # the config the last validation parsed (None: the form did not parse)

    def loaded_again(self) -> None:
        """Another config is in the form: its splits are its own, and what an opened run replaced is gone."""
        self.folder_gave = None
        self.before_open = None

    def splits_given(self, layout: dict) -> None:
        self.folder_gave = {"train_dir": layout["train_dir"], "data.val_dir": layout["val_dir"] or "",
                            "data.test_dir": layout["test_dir"]}

    def splits_to_clear(self, folder: str, current: dict[str, str | None]) -> list[str]:
        """The keys of the splits an earlier training folder gave that still hold what it gave, now that the
        training folder is `folder` (another one); `current` holds each split key's value in the form."""
        gave = self.folder_gave
        if not gave or os.path.normpath(folder) == os.path.normpath(gave["train_dir"]):
            return []
        self.folder_gave = None
        return [key for key in SPLIT_NAMES if gave[key] and current.get(key) == gave[key]]
