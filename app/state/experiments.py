"""The runs directory as a table of experiments, without Qt: one row per run with its hyper-parameters (flattened
config), best and final metrics, duration, sweep, tags and notes; which hyper-parameters differ between runs; the
user's tags and notes (RUN_DIR/notes.json, written by the app only).
"""

from __future__ import annotations

import datetime as dt
import json
from pathlib import Path

import yaml

from trainer.core.files import atomic_write_text
from trainer.core.rundir import UNFINISHED_STATES, RunDir, read_run_json
from trainer.data.manifest import read_manifest
from trainer.data.scan import DataError

NOTES = "notes.json"
SAFE_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)  # libyaml's: ten times faster on 500 configs
# keys that differ between runs without being hyper-parameters (paths, rendezvous, where the cache lives)
NOT_HYPERPARAMETERS = {"data.train_dir", "data.val_dir", "data.test_dir", "data.cache_dir", "data.exclude",
                       "device.master_addr", "device.master_port", "device.node_rank", "device.init_file"}
SHORT = {"optimizer.lr": "lr", "data.batch_size": "batch", "model.name": "model", "model.weights": "weights",
         "train.epochs": "epochs", "optimizer.name": "optimizer", "optimizer.weight_decay": "wd",
         "scheduler.name": "schedule", "data.image_size": "size", "data.image_width": "width",
         "train.seed": "seed", "train.amp": "precision"}
# the runs' metrics, column name: what it is
METRICS = {"test acc": "test-set accuracy (of best.pt, where a test set was evaluated)",
           "best val acc": "best validation accuracy", "last val acc": "final validation accuracy"}


def flatten(raw: dict, prefix: str = "") -> dict:
    """{'optimizer': {'lr': 0.1}} -> {'optimizer.lr': 0.1}; parameter groups as people say them, other lists as
    their text."""
    out = {}
    for key, value in raw.items():
        path = f"{prefix}{key}"
        if path == "optimizer.groups" and isinstance(value, list):
            out[path] = groups_text(value) or "none"
        elif isinstance(value, dict):
            out.update(flatten(value, path + "."))
        else:
            out[path] = value if isinstance(value, (int, float, str, bool)) or value is None else json.dumps(value)
    return out


def groups_text(groups: list) -> str:
    """Parameter groups as people say them: `fc 1e-3, layer4.* 1e-4 wd 0, features.* frozen`."""
    parts = []
    for g in groups:
        if not isinstance(g, dict):
            continue
        words = [str(g.get("pattern") or "?")]
        if g.get("freeze"):
            words.append("frozen")
        else:
            words += [f"{g['lr']:g}" if isinstance(g.get("lr"), (int, float)) else "lr"]
            words += [f"{name} {g[key]:g}" for key, name in (("weight_decay", "wd"), ("momentum", "momentum"))
                      if isinstance(g.get(key), (int, float))]
        parts.append(" ".join(words))
    return ", ".join(parts)


def test_accuracy(run: RunDir) -> float | None:
    try:
        value = read_run_json(run.metrics_file("test"), "evaluation").get("accuracy")
    except (OSError, ValueError, AttributeError):
        return None
    return value if isinstance(value, (int, float)) else None


def dataset_label(train_dir: str | None) -> str:
    """A dataset name people recognise: the folder and its parent (`photos/train`, not `train`)."""
    if not train_dir:
        return "?"
    parts = Path(train_dir).parts
    return "/".join(parts[-2:]) if len(parts) >= 2 else parts[-1]


def read_notes(run: RunDir) -> dict:
    try:
        notes = json.loads((run.path / NOTES).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {"tags": [], "notes": ""}
    return {"tags": list(notes.get("tags") or []), "notes": str(notes.get("notes") or "")}


def write_notes(run: RunDir, tags: list[str], notes: str) -> None:
    atomic_write_text(run.path / NOTES, json.dumps({"tags": tags, "notes": notes}, indent=1))


def summarize(run: RunDir) -> dict:
    """One row of the experiments table (run on the thread pool: small files only)."""
    status = run.read_status()
    try:
        cfg = yaml.load(run.config.read_text(encoding="utf-8"), Loader=SAFE_LOADER) or {}
    except (OSError, UnicodeDecodeError, yaml.YAMLError):
        cfg = {}
    started = status.get("started") or run.path.stat().st_mtime
    ended = status.get("ended") if status.get("state") not in UNFINISHED_STATES else None
    best, final, test = status.get("best_acc"), status.get("val_acc"), status.get("test_acc")
    if test is None and run.metrics_file("test").exists():  # runs from before test_acc
        test = test_accuracy(run)
    scores = {}
    if status.get("best_metric") == "val_map":  # multi-label: mAP, in a column of its own, not under accuracy
        test_map = status.get("test_map")
        scores["mAP best val / test"] = f"{100 * best:.1f}% / " + (f"{100 * test_map:.1f}%" if test_map else "—")
        best = final = test = None
    q = status.get("queue") or {}
    notes = read_notes(run)
    tags = notes["tags"] + ([q["sweep"]] if q.get("sweep") and q["sweep"] not in notes["tags"] else [])
    host = status.get("remote", {}).get("host") or (run.path.parent.name if run.is_remote else None)
    return {
        "path": str(run.path), "run": run.name + (f" @{host}" if host else ""), "status": run.effective_state(),
        "model": str(cfg.get("model", {}).get("name", "?")).split("/")[-1],
        "dataset": dataset_label(cfg.get("data", {}).get("train_dir")),
        "test acc": test if isinstance(test, (int, float)) else None,
        "best val acc": best if isinstance(best, (int, float)) else None,
        "last val acc": final if isinstance(final, (int, float)) else None,
        "trained": f"{status.get('epoch', 0)}/{cfg.get('train', {}).get('epochs', '?')} epochs",
        "duration": (status.get("earlier_s") or 0) + (ended - started) if ended and started else None,
        "started": dt.datetime.fromtimestamp(status.get("first_started") or started).strftime("%Y-%m-%d %H:%M"),
        "started_ts": status.get("first_started") or started, "sweep": q.get("sweep"), "tags": tags, "notes": notes["notes"],
        "params": flatten(cfg) | {"data changes": data_changes(run)} | scores, "pid": status.get("pid"),
        "reason": status.get("reason"), "requeues": status.get("requeues"), "requeue_lost_s": status.get("requeue_lost_s"),
    }


class RowCache:
    """Each run's row (`summarize`), made again only when one of the files it is read from changed: following one
    run's status among 1,000 reads one run, not all of them (2.5 s, with the interpreter lock held for the parsing)."""

    def __init__(self):
        self._rows: dict[str, tuple[tuple, dict]] = {}

    def rows(self, runs: list[RunDir]) -> list[dict]:
        out, kept = [], {}
        for run in runs:
            key = tuple(map(_mtime, sources(run)))
            cached = self._rows.get(str(run.path))
            live = cached is not None and cached[1]["status"] in UNFINISHED_STATES  # its process
            row = cached[1] if cached is not None and cached[0] == key and not live else summarize(run)  # may be gone
            kept[str(run.path)] = (key, row)
            out.append(row)
        self._rows = kept  # runs gone are forgotten
        return out


def sources(run: RunDir) -> tuple[Path, ...]:
    """The files `summarize` reads a run's row from."""
    return run.status_file, run.config, run.path / NOTES, run.manifest, run.metrics_file("test")


def _mtime(path: Path) -> int:
    try:
        return path.stat().st_mtime_ns
    except OSError:
        return 0


def data_changes(run: RunDir) -> str:
    """What the run's own copy of its manifest changed of the folder (a column when it differs between runs)."""
    if not run.manifest.is_file():
        return "none"
    try:
        m = read_manifest(run.manifest)
    except DataError:
        return "unreadable manifest"
    return f"−{len(m.exclude)} excluded, {len(m.relabel)} relabelled, +{len(m.add)} added"


def varying_keys(rows: list[dict]) -> list[str]:
    """The hyper-parameters whose values differ between the runs shown (in config order)."""
    if len(rows) < 2:
        return []
    keys: list[str] = []
    for r in rows:
        keys += [k for k in r["params"] if k not in keys]
    return [k for k in keys if k not in NOT_HYPERPARAMETERS and len({r["params"].get(k) for r in rows}) > 1]


def column_title(key: str) -> str:
    return SHORT.get(key, key.split(".", 1)[-1])


def format_duration(seconds: float | None) -> str:
    if seconds is None:
        return "—"
    minutes, s = divmod(int(seconds), 60)
    hours, m = divmod(minutes, 60)
    return f"{hours}h{m:02d}m" if hours else (f"{m}m{s:02d}s" if m else f"{s}s")


def extension_facts(run: RunDir) -> dict:
    """What the Continue dialog needs to show the schedule rule's effect: epochs trained, the schedule, the base
    learning rate and the steps per epoch (from the last run_start; read on the thread pool)."""
    from trainer.core.config import load_config

    cfg = load_config(run.config)
    start = run.last_events("run_start").get("run_start", {})
    return {"done": int(run.read_status().get("epoch") or 0), "scheduler": cfg.scheduler, "lr": cfg.optimizer.lr,
            "steps_per_epoch": start.get("steps_per_epoch"),
            "early_stopped": run.read_status().get("reason") == "early_stop"}
