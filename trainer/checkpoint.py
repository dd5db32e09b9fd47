"""Checkpoints written atomically, loaded safely, found again on resume.

Each save writes `ckpt-e{epoch}-s{step}.pt` to a temporary file in the same folder (fsync, rename,
fsync the folder), then points `last.pt` (and `best.pt` when it is the best) at it with a hard link,
also replaced atomically. A kill or a full disk at any moment leaves the previous files intact.

During training the fsyncs run on a background thread (`BackgroundSync`): the file is complete and in
place before training goes on, so a crash of the trainer cannot lose it; only protection against a power
cut arrives a moment later, and until it has, the previous checkpoint is kept.
"""

from __future__ import annotations

import logging
import os
import re
import tempfile
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import torch

log = logging.getLogger(__name__)

NUMBERED = re.compile(r"^ckpt-e(\d+)-s(\d+)\.pt$")


class UnsafeFileError(ValueError):
    """A file that cannot be loaded with weights_only=True (it would need full unpickling)."""


class CorruptCheckpointError(ValueError):
    """Every checkpoint in a folder failed to load."""


def _fsync_dir(folder: Path) -> None:
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _fsync_file(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def atomic_save(obj: Any, path: Path, durable: bool = True) -> None:
    """torch.save to a temp file beside `path`, fsync, rename over `path`; nothing partial survives.

    `durable=False` leaves the fsyncs to the caller (the file is complete either way).
    """
    path = Path(path)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            torch.save(obj, f)
            f.flush()
            if durable:
                os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    if durable:
        _fsync_dir(path.parent)


class BackgroundSync:
    """Runs the fsyncs of saved checkpoints on one background thread, in order.

    `wait` blocks until all are done and raises the first error; `save_checkpoint` waits before writing
    the next checkpoint, and the trainer waits before it reports a run finished.
    """

    def __init__(self):
        self._pool: ThreadPoolExecutor | None = None
        self._pending: list[Future] = []

    def submit(self, work: Callable[[], None]) -> None:
        if self._pool is None:
            self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="checkpoint-fsync")
        self._pending.append(self._pool.submit(work))

    def wait(self) -> None:
        pending, self._pending = self._pending, []
        for future in pending:
            future.result()

    def close(self) -> None:
        try:
            self.wait()
        finally:
            if self._pool is not None:
                self._pool.shutdown()


def atomic_link(src: Path, dst: Path, durable: bool = True) -> None:
    """Make dst another name for src, replacing dst atomically (falls back to a copy without hard links)."""
    tmp = dst.with_name(f".{dst.name}.{os.getpid()}.link")
    try:
        os.unlink(tmp)
    except FileNotFoundError:
        pass
    try:
        os.link(src, tmp)
        os.replace(tmp, dst)
    except OSError:
        atomic_save(load_weights_only(src), dst, durable)
    if durable:
        _fsync_dir(dst.parent)


def load_weights_only(path: str | Path, map_location: str = "cpu") -> Any:
    """torch.load with weights_only=True; a file that needs more is refused, never unpickled."""
    try:
        return torch.load(path, map_location=map_location, weights_only=True)
    except Exception as e:
        text = str(e)
        if "Weights only load failed" in text or "Unsupported global" in text or "Unsupported operand" in text:
            raise UnsafeFileError(f"{path}: refused, it needs full unpickling (which can run arbitrary code); "
                                  f"only plain tensors and containers are loaded. Save a state_dict or use safetensors.") from e
        raise


def remove_stale_temporaries(folder: Path) -> None:
    """Temp files of a writer that was killed mid-save (one writer per run: rank 0 of one launch)."""
    for path in list(folder.glob(".*.tmp")) + list(folder.glob(".*.link")):
        path.unlink(missing_ok=True)


def save_checkpoint(folder: Path, state: dict, *, is_best: bool, keep_last: int,
                    sync: BackgroundSync | None = None) -> Path:
    """Write a numbered checkpoint, update last.pt (and best.pt), prune old numbered ones.

    With `sync`, the fsyncs (and then the pruning, so the previous checkpoint stays until this one is
    durable) run on its background thread; the file is complete and in place when this returns.
    """
    if sync is not None:
        sync.wait()
    folder.mkdir(parents=True, exist_ok=True)
    remove_stale_temporaries(folder)
    path = folder / f"ckpt-e{state['epoch']:04d}-s{state['step']:08d}.pt"
    durable = sync is None
    atomic_save(state, path, durable)
    atomic_link(path, folder / "last.pt", durable)
    if is_best:
        atomic_link(path, folder / "best.pt", durable)

    def make_durable_and_prune() -> None:
        if not durable:
            _fsync_file(path)
            _fsync_dir(folder)
        for old in numbered_checkpoints(folder)[keep_last:]:
            old.unlink(missing_ok=True)

    if sync is None:
        make_durable_and_prune()
    else:
        sync.submit(make_durable_and_prune)
    return path


def numbered_checkpoints(folder: Path) -> list[Path]:
    """Numbered checkpoints, newest first."""
    if not folder.is_dir():
        return []
    found = [(tuple(int(x) for x in m.groups()), p) for p in folder.iterdir() if (m := NUMBERED.match(p.name))]
    return [p for _, p in sorted(found, reverse=True)]


def load_latest(folder: Path) -> tuple[dict, Path] | None:
    """The newest checkpoint that loads: last.pt, else the numbered ones newest first.

    None when the folder has no checkpoint at all; CorruptCheckpointError when some exist but none load.
    """
    if folder.is_dir():
        remove_stale_temporaries(folder)
    candidates = [folder / "last.pt"] if (folder / "last.pt").exists() else []
    candidates += numbered_checkpoints(folder)
    if not candidates:
        return None
    failures = []
    for path in candidates:
        try:
            state = load_weights_only(path)
            if not isinstance(state, dict) or "model" not in state or "epoch" not in state:
                raise ValueError("not a TrainDeck checkpoint (no model/epoch)")
        except Exception as e:  # noqa: BLE001 - every failure means "try the previous one"
            failures.append(f"{path.name}: {type(e).__name__}: {e}")
            log.warning("checkpoint %s cannot be loaded (%s); trying the previous one", path, e)
            continue
        return state, path
    raise CorruptCheckpointError(f"{folder}: no checkpoint loads: " + "; ".join(failures))
