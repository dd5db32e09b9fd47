"""The run directory: the unit of history shared by the trainer, the CLI and the app.

Torch-free. Layout:
    config.yaml     fully resolved config
    events.jsonl    event stream (docs/events.md)
    status.json     {state, pid, message, epoch, step, best_acc, ...}, replaced atomically
    train.log       human log
    output.log      the trainer's stdout/stderr when launched by the app
    checkpoints/    last.pt, best.pt and numbered checkpoints
"""

from __future__ import annotations

import datetime as dt
import json
import os
import re
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

STATES = ("starting", "running", "completed", "stopped", "failed", "diverged")
FINAL_STATES = ("completed", "stopped", "failed", "diverged")


def pid_alive(pid: int | None) -> bool:
    if not pid:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # A zombie (exited, not yet reaped by its parent) still answers kill(0).
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().split(b") ", 1)[1][:1] != b"Z"
    except (OSError, IndexError):
        return True


@dataclass
class RunDir:
    path: Path

    def __post_init__(self):
        self.path = Path(self.path)

    @property
    def config(self) -> Path:
        return self.path / "config.yaml"

    @property
    def events(self) -> Path:
        return self.path / "events.jsonl"

    @property
    def status_file(self) -> Path:
        return self.path / "status.json"

    @property
    def log(self) -> Path:
        return self.path / "train.log"

    @property
    def output_log(self) -> Path:
        return self.path / "output.log"

    @property
    def checkpoints(self) -> Path:
        return self.path / "checkpoints"

    @property
    def name(self) -> str:
        return self.path.name

    def create(self) -> RunDir:
        self.checkpoints.mkdir(parents=True, exist_ok=True)
        return self

    def read_status(self) -> dict[str, Any]:
        try:
            return json.loads(self.status_file.read_text(encoding="utf-8"))
        except (OSError, json.JSONDecodeError):
            return {}

    def write_status(self, **fields: Any) -> dict[str, Any]:
        """Merge `fields` into status.json, atomically (readers never see a half-written file)."""
        status = self.read_status()
        status.update(fields)
        status["updated"] = time.time()
        tmp = self.status_file.with_name(f".status.json.tmp-{os.getpid()}")
        tmp.write_text(json.dumps(status, indent=1), encoding="utf-8")
        os.replace(tmp, self.status_file)
        return status

    def effective_state(self) -> str:
        """The state, with a 'running' run whose process is gone reported as failed."""
        status = self.read_status()
        state = status.get("state", "unknown")
        if state in ("running", "starting") and not pid_alive(status.get("pid")):
            return "failed"
        return state

    def tail_log(self, lines: int = 20) -> str:
        for path in (self.log, self.output_log):
            try:
                with open(path, "rb") as f:
                    f.seek(0, os.SEEK_END)
                    f.seek(max(0, f.tell() - 16384))
                    text = f.read().decode("utf-8", "replace")
                if text.strip():
                    return "\n".join(text.splitlines()[-lines:])
            except OSError:
                continue
        return ""


def new_run_dir(runs_dir: str | os.PathLike, label: str) -> RunDir:
    """A fresh, uniquely named run directory under runs_dir (created)."""
    runs_dir = Path(runs_dir)
    runs_dir.mkdir(parents=True, exist_ok=True)
    stamp = dt.datetime.now().strftime("%Y%m%d-%H%M%S")
    safe = re.sub(r"[^A-Za-z0-9_.-]+", "_", label)[:40] or "run"
    for i in range(1000):
        path = runs_dir / (f"{stamp}-{safe}" + (f"-{i}" if i else ""))
        try:
            path.mkdir()
        except FileExistsError:
            continue
        return RunDir(path).create()
    raise RuntimeError(f"{runs_dir}: could not create a new run directory")


def list_runs(runs_dir: str | os.PathLike) -> list[RunDir]:
    """Run directories under runs_dir, newest first."""
    runs_dir = Path(runs_dir)
    if not runs_dir.is_dir():
        return []
    runs = [RunDir(p) for p in runs_dir.iterdir() if p.is_dir() and (p / "config.yaml").exists()]
    return sorted(runs, key=lambda r: r.path.stat().st_mtime, reverse=True)


def default_runs_dir() -> Path:
    return Path(os.environ.get("TRAINDECK_RUNS", Path.cwd() / "runs"))
