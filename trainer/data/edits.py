"""What an edit of a config implies, torch-free: the rules the app's form model calls (and nothing else keeps).

A labels file sets the loss (a multi-label run trains with its own); a training folder laid out as train/ val/ test/
sets its splits, and a new training folder drops the splits the last one gave (never one the user set since); New
keeps the dataset and nothing else. Values are read and written at dotted keys ("data.val_split") of a config dict.
"""

from __future__ import annotations

import copy
import os
from typing import Any

from trainer.core.config import DATASET_KEYS, RunConfig, loss_for_labels
from trainer.data.scan import find_layout

SPLIT_NAMES = {"data.val_dir": "validation", "data.test_dir": "test"}  # the splits a folder's layout gives


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


def implied_by(key: str, raw: dict) -> dict[str, Any]:
    """The other keys an edit of `key` (already in `raw`) sets, and to what: a labels file means its loss; cleared,
    the default loss is back (a multi-label loss left behind is a config the trainer refuses)."""
    if key == "data.labels":
        loss = get_path(raw, "loss.name") or RunConfig().loss.name
        wanted = loss_for_labels(bool(str(get_path(raw, key) or "").strip()), loss)
        return {"loss.name": wanted} if wanted != loss else {}
    return {}


def new_config_raw(current: dict, start: dict) -> dict:
    """Every setting as a first start has it (`start`: the config the window first opens with) on `current`'s
    dataset; a labels file means its loss, as the config's rule says."""
    raw = copy.deepcopy(start)
    for key in DATASET_KEYS:
        set_path(raw, key, get_path(current, key))
    for implied, value in implied_by("data.labels", raw).items():
        set_path(raw, implied, value)
    return raw


def folder_layout(folder: str) -> dict | None:
    """{"data.train_dir", "data.val_dir", "data.test_dir"} that a folder laid out as train/ val/ test/ gives (the
    scan's own rule, as Auto uses it); None for any other folder, a train/ itself included (its splits are the user's
    to set: the folder the layout gave is settled again, and a split cleared since stays cleared)."""
    layout = find_layout(folder)
    if os.path.normpath(layout["train_dir"]) == os.path.normpath(folder):
        return None
    return {"data.train_dir": layout["train_dir"], "data.val_dir": layout["val_dir"] or "",
            "data.test_dir": layout["test_dir"]}


def splits_to_clear(gave: dict | None, folder: str, raw: dict) -> list[str]:
    """The split keys that an earlier training folder's layout gave (`gave`, as `folder_layout` answered) and that
    still hold what it gave, now that the training folder is `folder`; none when `folder` is that same one."""
    if not gave or os.path.normpath(folder) == os.path.normpath(gave["data.train_dir"]):
        return []
    return [key for key in SPLIT_NAMES if gave[key] and get_path(raw, key) == gave[key]]
