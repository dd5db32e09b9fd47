"""A run's event stream in a form made for reading: `events.summary.jsonl`, beside `events.jsonl`.

Torch-free. The full `events.jsonl` stays the record; a long run's is too big to read whenever a run is opened (10^6
steps are over a gigabyte). The summary holds, in the file's order and as the same JSON lines, every event that
describes the run (run_start, epoch, replan, checkpoint, test, export, error, run_end) and a fixed budget of the
frequent ones per series (step, grad_stats, system, each histogram's layer and kind, warning, prepare): the
series' positions are cut into at most BUDGET buckets, which double in width as the run grows, and each bucket keeps
its event with the lowest and the highest value (a step's loss: a one-step spike stays), or its last; the series'
newest event is always kept. Its first line says how much of `events.jsonl` it covers (`offset`), with a fingerprint
of that file's start; a reader takes the summary, then the events after `offset` (`EventTail(..., summary=True)`).

`SummaryKeeper` keeps it up to date as events are appended (the trainer's `EventWriter`, a remote run's mirror),
rewriting it atomically every WRITE_EVERY_S and when closed; restarted on a file that has one (a resumed run), it
takes up the summary and the events written after it, so the file is read whole at most once. Documented in
docs/events.md.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

from trainer.core.files import BoundedLines, atomic_write_bytes, open_regular, read_user_file

SUMMARY_NAME = "events.summary.jsonl"
SUMMARY_VERSION = 1
WHOLE = ("run_start", "epoch", "replan", "checkpoint", "test", "export", "error", "run_end")
BUDGET = {"step": 2000, "grad_stats": 500, "system": 1000, "histogram": 50, "warning": 500, "prepare": 100}
# a line the EventWriter wrote for a grad_stats event: its series is its event's name alone, so a file read without a
# summary takes it unparsed (`json.loads` of its per-layer tables was a third of `main.py summarize`'s time)
BY_NAME_ALONE = '{"event": "grad_stats", '
VALUE = {"step": "loss"}  # a series whose buckets keep their lowest and highest event by this field (else the last)
WRITE_EVERY_S = 10.0
PARTIAL_EVERY_S = 2.0  # `main.py summarize` writes what it has this often: a reader shows the run while the rest is read
READ_CHUNK = 8 << 20  # bytes of events read at a time when a summary is built or taken up
PRUNE_SLACK = 20_000  # thinned events' positions held beyond what the series keep before they are pruned
MAX_EVENT_LINE = 64 << 20  # an event's line: an epoch's confusion matrix of 1,000 classes is about 4 MB; longer is
# not an event, and is skipped (never held, never copied into the summary)
MAX_SUMMARY_BYTES = 256 << 20  # a summary keeps a fixed budget of lines (BUDGET): far less
HEAD_BYTES = 256  # of events.jsonl, fingerprinted: a summary of another file (rewritten, truncated) is not used

log = logging.getLogger(__name__)


def summary_path(events_path: str | os.PathLike) -> Path:
    return Path(events_path).with_name(SUMMARY_NAME)


def fingerprint(events_path: str | os.PathLike, size: int = HEAD_BYTES) -> str:
    """Of the file's first `size` bytes."""
    try:
        with open(events_path, "rb") as f:
            head = f.read(size)
    except OSError:
        head = b""
    return hashlib.sha1(head).hexdigest()[:16]


def series_of(record: dict) -> str | None:
    """The thinned series an event belongs to (None: kept whole)."""
    kind = record.get("event")
    if kind == "histogram":
        return f"histogram/{record.get('layer')}/{record.get('kind')}"
    return kind if kind in BUDGET else None


class _Series:
    """One series' buckets: position // width -> its kept entries (index in the file's events, value, line)."""

    def __init__(self, budget: int, by_value: bool, width: int = 1, count: int = 0):
        self.budget, self.by_value, self.width, self.count = budget, by_value, width, count
        self.buckets: dict[int, list[tuple[int, float | None, str]]] = {}
        self.newest: tuple[int, float | None, str] | None = None

    def add(self, index: int, value: float | None, line: str, position: int | None = None) -> None:
        position = self.count if position is None else position
        self.count = max(self.count, position + 1)
        entry = (index, value, line)
        self.newest = entry
        bucket = self.buckets.setdefault(position // self.width, [])
        bucket.append(entry)
        if len(bucket) > 1:
            self.buckets[position // self.width] = self._keep(bucket)
        while len(self.buckets) > self.budget:
            self.width *= 2
            merged: dict[int, list] = {}
            for b, entries in self.buckets.items():
                merged.setdefault(b // 2, []).extend(entries)
            self.buckets = {b: self._keep(entries) for b, entries in merged.items()}

    def _keep(self, entries: list) -> list:
        if not self.by_value:
            return [max(entries)]  # the last
        valued = [e for e in entries if isinstance(e[1], (int, float))]
        if not valued:
            return [max(entries)]
        low = min(valued, key=lambda e: e[1])
        high = max(valued, key=lambda e: e[1])
        return [low] if low is high else sorted((low, high))

    def kept(self) -> list[tuple[int, float | None, str]]:
        out = [e for entries in self.buckets.values() for e in entries]
        if self.newest is not None and self.newest not in out:
            out.append(self.newest)
        return out


class SummaryKeeper:
    """The summary of an event file being appended to: `add` each event's line as written; `write` saves it."""

    def __init__(self, events_path: str | os.PathLike):
        self.events_path = Path(events_path)
        self.path = summary_path(events_path)
        self.count = 0  # events seen
        self.offset = 0  # bytes of events.jsonl covered
        self.whole: list[tuple[int, str]] = []
        self.series: dict[str, _Series] = {}
        self._positions: dict[int, tuple[str, int]] = {}  # a thinned entry's series and position, for the header
        self._prune_at = PRUNE_SLACK
        self.uncovered = 0  # bytes after the last complete line (appended bytes cut mid-line)
        self._lines = BoundedLines(MAX_EVENT_LINE)
        self._written = time.monotonic()
        self._dirty = False

    # ---- taking events in -----------------------------------------------------------------------------------
    def add(self, record: dict, line: str) -> None:
        """One event and its JSON line (without the newline, ASCII as json.dumps writes it), as appended."""
        self.offset += len(line) + 1
        self._take(record, line)

    def _take(self, record: dict, line: str) -> None:
        index = self.count
        self.count += 1
        self._dirty = True
        name = series_of(record)
        if name is None:
            self.whole.append((index, line))
            return
        kind = name.split("/")[0]
        series = self.series.get(name)
        if series is None:
            series = self.series[name] = _Series(BUDGET[kind], kind in VALUE)
        value = record.get(VALUE[kind]) if kind in VALUE else None
        self._positions[index] = (name, series.count)
        series.add(index, _number(value), line)
        if len(self._positions) > self._prune_at:  # the thinned-out events' positions go: memory stays bounded
            self._prune_positions()

    def _prune_positions(self) -> None:
        """Keep the positions of the entries the series still hold (a resume reading 10^6 events without a summary
        kept one per event until it wrote, issue #72)."""
        kept = {index for series in self.series.values() for index, _, _ in series.kept()}
        self._positions = {index: where for index, where in self._positions.items() if index in kept}
        self._prune_at = 2 * len(self._positions) + PRUNE_SLACK

    def _take_line(self, raw: bytes) -> None:
        if not raw.strip():
            return
        text = raw.decode("utf-8", "replace")
        if text.startswith(BY_NAME_ALONE) and text.rstrip().endswith("}"):
            self._take({"event": "grad_stats"}, text)  # its series is its name: not parsed (half the file's bytes)
            return
        try:
            record = json.loads(text)
        except ValueError:
            return  # a malformed line: readers skip it too
        if isinstance(record, dict) and isinstance(record.get("event"), str):
            self._take(record, text)

    def add_appended(self, data: bytes) -> None:
        """Bytes as appended to the file, cut anywhere (a mirror's copy): the complete lines taken (a line longer than
        an event may be is skipped, never held or copied), the start of the next one counted in `uncovered`."""
        cut = data.rfind(b"\n") + 1
        lines = self._lines.feed(data)
        if cut:
            self.offset += self.uncovered + cut
            self.uncovered = len(data) - cut
        else:
            self.uncovered += len(data)
        for raw in lines:
            self._take_line(raw)

    def maybe_write(self) -> None:
        if self._dirty and time.monotonic() - self._written >= WRITE_EVERY_S:
            self.write()

    # ---- the file ---------------------------------------------------------------------------------------------
    def lines(self) -> list[tuple[int, str]]:
        kept = list(self.whole)
        for series in self.series.values():
            kept += [(index, line) for index, _, line in series.kept()]
        kept.sort()
        return kept

    def write(self) -> None:
        kept = self.lines()
        head = min(HEAD_BYTES, self.offset)
        header = {"summary": SUMMARY_VERSION, "offset": self.offset, "head": [head, fingerprint(self.events_path, head)],
                  "events": self.count,
                  "series": {name: [s.width, s.count] for name, s in self.series.items()},
                  "positions": [self._positions.get(index, (None, 0)) + (index,) for index, _ in kept]}
        text = json.dumps(header) + "\n" + "".join(line + "\n" for _, line in kept)
        try:
            atomic_write_bytes(self.path, text.encode("utf-8"))
        except OSError as e:  # the summary is a convenience: the record is events.jsonl
            log.warning("cannot write %s: %s", self.path, e)
        self._written = time.monotonic()
        self._dirty = False
        self._positions = {index: self._positions[index] for index, _ in kept if index in self._positions}

    @classmethod
    def resume(cls, events_path: str | os.PathLike, write_every_s: float | None = None,
               until: int | None = None) -> SummaryKeeper:
        """The keeper of a file that may already hold events: its summary taken up where valid, and the events after
        it (or the whole file, where there is none) read once, as a stream; with `write_every_s`, the summary of what
        is read so far is written that often on the way (a valid summary of the file's start: a reader can show it,
        and a pass cut short goes on from it); with `until`, the file's first `until` bytes alone (what it held
        when a writer began appending). A last line cut short is `pending`: the rest of it may still come (a
        mirror), or never (a crashed writer: `EventWriter` ends it)."""
        keeper = cls(events_path)
        if not os.path.lexists(keeper.events_path):
            return keeper
        events = os.fdopen(open_regular(keeper.events_path, "events file", follow_links=False), "rb")  # or refused
        if os.fstat(events.fileno()).st_size == 0:
            events.close()
            return keeper
        header = read_header(keeper.path, keeper.events_path)
        if header is not None:
            try:
                keeper._restore(header)
            except (ValueError, KeyError, TypeError, IndexError) as e:  # a damaged summary: the file read whole
                log.warning("%s: not used (%s)", keeper.path, e)
                keeper = cls(events_path)
        with events as f:
            f.seek(keeper.offset)
            left = None if until is None else max(0, until - keeper.offset)
            while chunk := f.read(READ_CHUNK if left is None else min(READ_CHUNK, left)):
                if left is not None:
                    left -= len(chunk)
                keeper.add_appended(chunk)
                if write_every_s is not None and time.monotonic() - keeper._written >= write_every_s:
                    keeper.write()
        keeper._dirty = True
        return keeper

    def _restore(self, header: dict) -> None:
        text = read_user_file(self.path, MAX_SUMMARY_BYTES, "summary of events", follow_links=False)
        lines = text.decode("utf-8").splitlines()[1:]
        positions = header["positions"]
        if len(positions) != len(lines):
            log.warning("%s: not used (its lines and positions differ)", self.path)
            return
        for name, (width, count) in header["series"].items():
            kind = name.split("/")[0]
            if kind in BUDGET:
                self.series[name] = _Series(BUDGET[kind], kind in VALUE, int(width), int(count))
        for (name, position, index), line in zip(positions, lines):
            series = self.series.get(name) if name else None
            if series is None:
                self.whole.append((index, line))
                continue
            value = json.loads(line).get(VALUE.get(name.split("/")[0], ""))
            count = series.count
            series.add(index, _number(value), line, position)
            series.count = count
            self._positions[index] = (name, position)
        self.count, self.offset = int(header["events"]), int(header["offset"])


def _number(value) -> float | None:
    """A value buckets compare (a NaN loss, written as null, is none)."""
    return value if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) else None


BUILD_ABOVE = 4 << 20  # bytes of events a summary does not cover: above this, a reader has it built first


class CatchingUp:
    """A keeper whose file held more events than its summary covers when a writer began appending (a resumed run from
    before summaries): the file as it was is read on a thread of its own, so that the run's first step does not wait
    for it (`resume` of a 10^6-step run waited 20 s), and the events appended meanwhile are taken in their order once
    it is done. `write` waits for it."""

    def __init__(self, events_path: str | os.PathLike, until: int):
        self._lock = threading.Lock()
        self._pending: list[tuple[dict, str]] = []
        self._keeper: SummaryKeeper | None = None
        self._thread = threading.Thread(target=self._catch_up, args=(events_path, until), daemon=True,
                                        name="summary catching up")
        self._thread.start()

    def _catch_up(self, events_path, until: int) -> None:
        try:  # the pass in a process of its own (this thread only waits: the run keeps the interpreter), then its
            # summary taken up here (its few thousand lines, not the file)
            done = subprocess.run([sys.executable, "-m", "trainer.core.summary", str(events_path), str(until)],
                                  stdin=subprocess.DEVNULL, capture_output=True, text=True)
            if done.returncode != 0:
                log.warning("%s: the summary's own pass failed (%s): taken up here", events_path,
                            done.stderr.strip()[-300:])
            keeper = SummaryKeeper.resume(events_path, until=until)
        except Exception as e:  # noqa: BLE001 - the summary is a convenience: the run goes on without one
            log.warning("%s: the summary was not taken up (%s): none is kept for this run", events_path, e)
            keeper = None
        with self._lock:
            for record, line in self._pending if keeper is not None else []:
                keeper.add(record, line)
            self._pending = []
            self._keeper = keeper or _NoKeeper()

    @property
    def caught_up(self) -> bool:
        return self._keeper is not None

    def add(self, record: dict, line: str) -> None:
        with self._lock:
            if self._keeper is None:
                self._pending.append((record, line))
            else:
                self._keeper.add(record, line)

    def maybe_write(self) -> None:
        with self._lock:
            if self._keeper is not None:
                self._keeper.maybe_write()

    def write(self) -> None:
        self._thread.join()
        self._keeper.write()


class _NoKeeper:
    def add(self, record: dict, line: str) -> None:
        pass

    def maybe_write(self) -> None:
        pass

    def write(self) -> None:
        pass


def needs_building(events_path: str | os.PathLike) -> bool:
    """Whether a reader of a finished run should have its summary built (`main.py summarize`, a process of its own)
    before it reads: more than BUILD_ABOVE bytes of events that no summary covers (a run from before summaries, one
    copied without its summary, one whose trainer was killed long after its last summary)."""
    try:
        size = os.stat(events_path).st_size
    except OSError:
        return False
    header = read_header(summary_path(events_path), events_path) if size > BUILD_ABOVE else None
    return size - (header["offset"] if header else 0) > BUILD_ABOVE


def read_header(path: str | os.PathLike, events_path: str | os.PathLike) -> dict | None:
    """The summary's first line, when it summarises `events_path` as it is now (None: no summary, another file's,
    one of a file since cut short, or not readable)."""
    try:
        with os.fdopen(open_regular(path, "summary of events", follow_links=False), "rb") as f:
            return check_header(f.readline(MAX_EVENT_LINE), events_path)
    except OSError:
        return None


def check_header(line: bytes, events_path: str | os.PathLike) -> dict | None:
    """`read_header` of a summary's first line, read by the caller."""
    try:
        header = json.loads(line)
        size = Path(events_path).stat().st_size
    except (OSError, ValueError):
        return None
    if not isinstance(header, dict) or header.get("summary") != SUMMARY_VERSION:
        return None
    if not isinstance(header.get("offset"), int) or not 0 < header["offset"] <= size:
        return None
    head = header.get("head")
    if not (isinstance(head, list) and len(head) == 2 and isinstance(head[0], int)
            and head[1] == fingerprint(events_path, head[0])):
        return None
    return header


if __name__ == "__main__":  # python -m trainer.core.summary EVENTS_FILE UNTIL: CatchingUp's pass, in its own process
    logging.basicConfig(level=logging.WARNING)
    SummaryKeeper.resume(sys.argv[1], until=int(sys.argv[2])).write()
