"""The event stream between the trainer and its viewers: JSON lines in `events.jsonl`.

Torch-free. The trainer (rank 0 only) appends with `EventWriter`; the app and tools read with `EventTail`,
which returns only complete lines, so a reader never sees half an event. Documented in docs/events.md. The one
progress line a command streams for the app to draw (`LR_POINT`) is declared here too.
"""

from __future__ import annotations

import json
import logging
import math
import os
import time
from pathlib import Path
from typing import Any

SCHEMA_VERSION = 1
EVENT_TYPES = ("prepare", "run_start", "step", "grad_stats", "histogram", "epoch", "replan", "checkpoint", "test", "export",
               "system", "warning", "error", "run_end")
# Not an event of a run: `main.py lr-find --json` writes "lr-find: point LR LOSS" on stderr at each step of its sweep,
# for a viewer that draws the curve as it grows (the app's finder); the whole curve is the JSON answer.
LR_POINT = "lr-find: point"

log = logging.getLogger(__name__)


def _finite(obj: Any) -> Any:
    """JSON has no NaN/inf: non-finite floats become null."""
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {k: _finite(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_finite(v) for v in obj]
    return obj


class EventWriter:
    """Appends one JSON object per line and flushes it, so readers see each event at once."""

    def __init__(self, path: str | os.PathLike):
        self.path = Path(path)
        self._file = open(self.path, "a", encoding="utf-8")

    def emit(self, event: str, **fields: Any) -> dict:
        if event not in EVENT_TYPES:  # the declared list is the contract (docs/events.md, the app's RunState)
            raise ValueError(f"event {event!r} is not one of EVENT_TYPES")
        record = {"event": event, "v": SCHEMA_VERSION, "time": round(time.time(), 3), **fields}
        try:
            line = json.dumps(record, allow_nan=False)
        except ValueError:
            line = json.dumps(_finite(record))
        self._file.write(line + "\n")
        self._file.flush()
        return record

    def close(self) -> None:
        self._file.close()


class NullEventWriter:
    """What ranks other than 0 get: events are written by rank 0 only."""

    def emit(self, event: str, **fields: Any) -> dict:
        if event not in EVENT_TYPES:  # the declared list is the contract (docs/events.md, the app's RunState)
            raise ValueError(f"event {event!r} is not one of EVENT_TYPES")
        return {"event": event, **fields}

    def close(self) -> None:
        pass


class EventTail:
    """Reads the events appended to a file since the last call; partial trailing lines wait for the next."""

    def __init__(self, path: str | os.PathLike):
        self.path = Path(path)
        self._offset = 0
        self._partial = b""

    @property
    def offset(self) -> int:
        """Bytes of the file read so far."""
        return self._offset

    def read_new(self, max_bytes: int = 8 << 20) -> list[dict]:
        try:
            with open(self.path, "rb") as f:
                f.seek(self._offset)
                chunk = f.read(max_bytes)
        except FileNotFoundError:
            return []
        if not chunk:
            return []
        self._offset += len(chunk)
        data = self._partial + chunk
        lines = data.split(b"\n")
        self._partial = lines.pop()
        lines = [line for line in lines if line.strip()]
        try:  # one parse for the whole chunk is several times faster than one per line
            return json.loads(b"[" + b",".join(lines) + b"]")
        except json.JSONDecodeError:
            pass
        events = []
        for line in lines:
            try:
                events.append(json.loads(line))
            except json.JSONDecodeError:
                log.warning("%s: skipping a malformed event line: %.80r", self.path, line)
        return events


def read_events(path: str | os.PathLike) -> list[dict]:
    """Every complete event in a file."""
    out: list[dict] = []
    tail = EventTail(path)
    while batch := tail.read_new():
        out.extend(batch)
    return out
