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
from pathlib import Path
from typing import IO, Any

from trainer.core import clock
from trainer.core.files import BoundedLines, UserFileError, open_regular, read_user_file
from trainer.core.summary import (
    MAX_EVENT_LINE,
    MAX_SUMMARY_BYTES,
    WHOLE,
    CatchingUp,
    SummaryKeeper,
    check_header,
    needs_building,
    read_header,
    summary_path,
)

SCHEMA_VERSION = 1
EVENT_TYPES = ("prepare", "run_start", "restart", "step", "grad_stats", "histogram", "epoch", "replan", "checkpoint",
               "test", "export", "system", "warning", "error", "run_end")
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
    """Appends one JSON object per line and flushes it, so readers see each event at once; keeps the file's summary
    (`trainer.core.summary`) beside it."""

    def __init__(self, path: str | os.PathLike):
        self.path = Path(path)
        flags = os.O_WRONLY | os.O_APPEND | os.O_CREAT | getattr(os, "O_NOFOLLOW", 0)  # the run's own file, no link
        if needs_building(self.path):  # a long file no summary covers: taken up on a thread while the run goes on
            self._file = os.fdopen(os.open(self.path, flags, 0o644), "a", encoding="utf-8")
            if not _ends_a_line(self.path):  # a crash mid-line: that line ends here, malformed, the next one whole
                self._file.write("\n")
                self._file.flush()
            self.summary = CatchingUp(self.path, os.path.getsize(self.path))
            return
        self.summary = SummaryKeeper.resume(self.path)  # a resumed run's: taken up, not rebuilt
        self._file = os.fdopen(os.open(self.path, flags, 0o644), "a", encoding="utf-8")
        if self.summary.uncovered:  # a crash mid-line: that line ends here, malformed, and the next one is whole
            self._file.write("\n")
            self.summary.offset += self.summary.uncovered + 1
            self.summary.uncovered = 0

    def emit(self, event: str, **fields: Any) -> dict:
        if event not in EVENT_TYPES:  # the declared list is the contract (docs/events.md, the app's RunState)
            raise ValueError(f"event {event!r} is not one of EVENT_TYPES")
        record = {"event": event, "v": SCHEMA_VERSION, "time": round(clock.now(), 3), **fields}
        try:
            line = json.dumps(record, allow_nan=False)
        except ValueError:
            line = json.dumps(_finite(record))
        self._file.write(line + "\n")
        self._file.flush()
        self.summary.add(record, line)
        self.summary.maybe_write()
        return record

    def close(self) -> None:
        self._file.close()
        self.summary.write()


def _ends_a_line(path: Path) -> bool:
    """Whether the file is empty or its last byte ends a line."""
    with open(path, "rb") as f:
        f.seek(0, os.SEEK_END)
        if f.tell() == 0:
            return True
        f.seek(-1, os.SEEK_END)
        return f.read(1) == b"\n"


class NullEventWriter:
    """What ranks other than 0 get: events are written by rank 0 only."""

    def emit(self, event: str, **fields: Any) -> dict:
        if event not in EVENT_TYPES:  # the declared list is the contract (docs/events.md, the app's RunState)
            raise ValueError(f"event {event!r} is not one of EVENT_TYPES")
        return {"event": event, **fields}

    def close(self) -> None:
        pass


SCAN_BLOCK = 1 << 20  # bytes read at a time by `last_events_in`


def last_events_in(path: str | os.PathLike, names: tuple[str, ...]) -> dict[str, dict]:
    """The last event of each of `names` in the events file `path` ({} for one not there), read from the file's end
    backwards, a block at a time, until each is found: only the lines that begin as one of those events (the way
    EventWriter writes them) are parsed, so a run of 10^6 steps is a byte scan, never 10^6 JSON lines. A run folder is
    user input: a regular file of the run's own only (else {}), a line longer than MAX_EVENT_LINE is skipped, and a
    line that is not such an event is passed over. Where the run's summary describes the file, the scan stops at what
    it covers and the summary (which keeps every event of these kinds) answers for the rest: a run_start 10^6 steps
    back is not a scan of the whole file."""
    import re

    wanted = re.compile(rb'^\{"event": "(' + b"|".join(re.escape(n.encode()) for n in names) + rb')"[^\n]*', re.M)
    found: dict[str, dict] = {}
    header = read_header(summary_path(path), path) if set(names) <= set(WHOLE) else None
    floor = header["offset"] if header else 0  # below it, the summary answers
    try:
        f = os.fdopen(open_regular(path, "events file", follow_links=False), "rb")
    except (OSError, UserFileError):
        return found
    with f:
        end, carried = f.seek(0, 2), b""  # `carried`: the start of a line whose end the block before held
        while end > floor and len(found) < len(names):
            start = max(floor, end - SCAN_BLOCK)
            f.seek(start)
            block = f.read(end - start) + carried
            carried = b""
            if start > floor:
                cut = block.find(b"\n")
                if cut < 0:  # all inside one line: carried on, unless too long to be an event (never held whole)
                    carried, end = (block if len(block) <= MAX_EVENT_LINE else b""), start
                    continue
                carried, block = (block[:cut] if cut <= MAX_EVENT_LINE else b""), block[cut + 1:]
            for name in names:  # each name's last line in the block (a byte search: no regex over 10^6 steps)
                if name not in found:
                    _last_in_block(block, name, found)
            end = start
    if header and len(found) < len(names):
        _last_in_summary(path, wanted, found)
    return found


def _last_in_block(block: bytes, name: str, found: dict[str, dict]) -> None:
    """The last line of `block` (which starts at a line's start) that is a whole `name` event, into `found`."""
    needle, at = b'{"event": "' + name.encode() + b'"', len(block)
    while (at := block.rfind(needle, 0, at)) >= 0:
        if at == 0 or block[at - 1] == 0x0A:  # a line's start
            end = block.find(b"\n", at)
            line = block[at:] if end < 0 else block[at:end]
            if len(line) <= MAX_EVENT_LINE:
                try:
                    event = json.loads(line)
                except ValueError:
                    event = None
                if isinstance(event, dict) and event.get("event") == name:
                    found[name] = event
                    return


def _last_in_summary(path, wanted, found: dict[str, dict]) -> None:
    """The last of each wanted event not `found` yet, from the run's summary (bounded, read as a run file is)."""
    try:
        text = read_user_file(summary_path(path), MAX_SUMMARY_BYTES, "summary of events", follow_links=False)
    except (OSError, UserFileError):
        return
    for match in reversed(list(wanted.finditer(text))):
        name = match.group(1).decode()
        if name in found:
            continue
        try:
            event = json.loads(match.group(0))
        except ValueError:
            continue
        if isinstance(event, dict) and event.get("event") == name:
            found[name] = event


class EventTail:
    """Reads the events appended to a file since the last call; partial trailing lines wait for the next.

    With `summary`, a long run is read through its summary (`trainer.core.summary`): first the summary's events (the
    run's description and a fixed budget of thinned steps), then the file's events after what it covers. Readers
    that need every step (a CSV export) read without it.

    A run folder is user input: the files are opened only when they are regular files (a FIFO, a device or a link is
    `problem`, and nothing is read), a line longer than MAX_EVENT_LINE is skipped without being held, and a line
    that is not an event (a JSON object naming one) is skipped; `skipped` counts both."""

    def __init__(self, path: str | os.PathLike, summary: bool = False, summary_only: bool = False):
        """`summary_only`: the summary's events and nothing after them (a summary still being built shown as it is:
        the file itself is not read)."""
        self.path = Path(path)
        self.summary_only = summary_only
        self._offset = 0
        self._lines = BoundedLines(MAX_EVENT_LINE)
        self._summary: IO[bytes] | None = None
        self.at_end = False  # the last read reached the end of the file (what is there now is read)
        self.problem = ""  # why the file is not read (not a regular file)
        self.not_events = 0
        if summary or summary_only:
            self._open_summary()

    @property
    def skipped(self) -> int:
        """Lines skipped so far: too long, or not an event."""
        return self._lines.skipped + self.not_events

    def _open_summary(self) -> None:
        """The summary, held open while read (the trainer replaces it as it goes: the one opened is read through)."""
        try:
            f = os.fdopen(open_regular(summary_path(self.path), "summary of events", follow_links=False), "rb")
        except OSError:
            return
        header = check_header(f.readline(MAX_EVENT_LINE), self.path)
        if header is None:
            f.close()
            return
        self._summary, self._summary_offset = f, header["offset"]

    @property
    def from_summary(self) -> bool:
        """Whether the events read so far, or next, come from the summary."""
        return self._summary is not None

    @property
    def offset(self) -> int:
        """Bytes of the file read so far."""
        return self._offset

    def read_new(self, max_bytes: int = 8 << 20) -> list[dict]:
        """The events complete in the next `max_bytes` of the file ([] with `at_end` when there is nothing more)."""
        self.at_end = False
        while self._summary is not None:
            chunk = self._summary.read(max_bytes)
            if not chunk:  # the summary is read: the file's events after it
                self._summary.close()
                self._summary = None
                self._offset, self._lines = self._summary_offset, BoundedLines(MAX_EVENT_LINE)
                break
            if events := self._parse(chunk):
                return events
        if self.problem or self.summary_only:  # not read, or the summary alone was asked for
            self.at_end = True
            return []
        try:
            fd = open_regular(self.path, "events file", follow_links=False)
        except UserFileError as e:
            if self.path.exists() or self.path.is_symlink():
                self.problem = str(e)
            self.at_end = True
            return []
        with os.fdopen(fd, "rb") as f:
            f.seek(self._offset)
            chunk = f.read(max_bytes)
        if len(chunk) < max_bytes:
            self.at_end = True
        if not chunk:
            return []
        self._offset += len(chunk)
        return self._parse(chunk)

    def _parse(self, chunk: bytes) -> list[dict]:
        lines = [line for line in self._lines.feed(chunk) if line.strip()]
        try:  # one parse for the whole chunk is several times faster than one per line
            events = json.loads(b"[" + b",".join(lines) + b"]")
        except json.JSONDecodeError:
            events = []
            for line in lines:
                try:
                    events.append(json.loads(line))
                except json.JSONDecodeError:
                    log.warning("%s: skipping a malformed event line: %.80r", self.path, line)
                    self.not_events += 1
        kept = [e for e in events if isinstance(e, dict) and isinstance(e.get("event"), str)]
        self.not_events += len(events) - len(kept)
        return kept


def read_events(path: str | os.PathLike, summary: bool = False) -> list[dict]:
    """Every complete event in a file (with `summary`: through its summary, EventTail's)."""
    out: list[dict] = []
    tail = EventTail(path, summary)
    while not tail.at_end:
        out.extend(tail.read_new())
    return out
