"""Checkpoints written atomically, loaded safely, found again on resume.

Each save writes `ckpt-e{epoch}-s{step}.pt` to a temporary file in the same folder (fsync, rename,
fsync the folder), then points `last.pt` (and `best.pt` when it is the best) at it with a hard link,
also replaced atomically. A kill or a full disk at any moment leaves the previous files intact.

During training all of that runs on a background thread (`CheckpointWriter`) from a CPU snapshot taken at the
save point: training goes on while the file is written. The previous checkpoint stays the newest on disk until the
new one is durable; the trainer waits for the writer before it reports a run stopped or finished, and a writer
error surfaces at the next save (or at that wait) and ends the run as failed.
"""

from __future__ import annotations

import errno
import logging
import os
import random
import re
import shutil
import tempfile
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from trainer.core.errors import InputError
from trainer.data.frame import Frame

log = logging.getLogger(__name__)

NUMBERED = re.compile(r"^ckpt-e(\d+)-s(\d+)\.pt$")
FORMAT = "traindeck-checkpoint"
VERSION = 1  # bump when the layout below changes; a newer file is refused by an older TrainDeck


class UnsafeFileError(InputError, ValueError):
    """A file that cannot be loaded with weights_only=True (it would need full unpickling)."""


class CorruptCheckpointError(ValueError):
    """Every checkpoint in a folder failed to load."""


class CheckpointVersionError(InputError, ValueError):
    """A checkpoint written by a newer TrainDeck (its layout version is unknown here)."""


def rng_state() -> dict:
    np_state = np.random.get_state()
    state = {"python": random.getstate(), "torch": torch.get_rng_state(),
             "numpy": [np_state[0], torch.from_numpy(np_state[1].astype(np.int64)), *np_state[2:]]}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict) -> None:
    random.setstate(state["python"])
    torch.set_rng_state(state["torch"])
    kind, keys, *rest = state["numpy"]
    np.random.set_state((kind, keys.numpy().astype(np.uint32), *rest))
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


@dataclass
class TrainState:
    """Where a run is, and the one place that builds and reads the checkpoint layout.

    A checkpoint holds the unwrapped model (with train.ema: the averaged one, the trained one beside it), the
    optimizer, scheduler and loss-scaler states, this progress, every random generator, the resolved config, the
    classes and the preprocessing, under `format` and `version`.
    """

    epoch: int = 0  # epoch in progress (0-based)
    batch_in_epoch: int = 0  # micro-batches of `epoch` already trained
    step: int = 0  # optimizer steps so far
    best_acc: float = -1.0
    early_stop_best: float | None = None  # the watched metric's best value (train.early_stop)
    early_stop_wait: int = 0  # epochs since it last improved
    early_stopped: bool = False  # the run ended by early stopping (an extension gets its full patience again)
    budget: dict | None = None  # train.budget: its seconds spent, the epochs re-planned and the schedule's clock
    # the part of `epoch` trained before a mid-epoch checkpoint, every rank's summed: [loss x images, right, images],
    # so that a resumed epoch's train loss is the whole epoch's (none for a checkpoint at an epoch's end)
    epoch_so_far: list[float] | None = None

    def to_checkpoint(self, *, model, optimizer, scheduler, precision, aug_generator, config: dict,
                      classes: list[str], mean: list[float], std: list[float],
                      memory_format: torch.memory_format = torch.contiguous_format, trained=None) -> dict:
        """`model`: the network inference loads (with train.ema, the averaged one); `trained`: the network the
        optimizer trains, when that is another one (kept as `trained_model`, for resume)."""
        data = config["data"]
        extra = {"trained_model": trained.state_dict()} if trained is not None else {}
        return {
            "format": FORMAT, "version": VERSION, **extra,
            "model": model.state_dict(), "optimizer": optimizer.state_dict(), "scheduler": scheduler.state_dict(),
            "scaler": precision.state_dict(),
            "epoch": self.epoch, "batch_in_epoch": self.batch_in_epoch, "step": self.step, "best_acc": self.best_acc,
            "early_stop": {"best": self.early_stop_best, "wait": self.early_stop_wait, "stopped": self.early_stopped},
            "rng": rng_state(), "aug_rng": aug_generator.get_state(), **({"budget": self.budget} if self.budget else {}),
            **({"epoch_so_far": self.epoch_so_far} if self.batch_in_epoch and self.epoch_so_far else {}),
            "config": config, "classes": classes, "model_name": config["model"]["name"],
            "preprocess": {**Frame.of(data).to_record(), "mean": mean, "std": std,
                           # what inference runs as (trainer.deploy.inference), so it predicts as validation did
                           "precision": precision.amp, "memory_format": str(memory_format).removeprefix("torch."),
                           "tta": bool(config.get("eval", {}).get("tta", False))},
        }

    def restore(self, state: dict, *, model, optimizer, scheduler, precision, aug_generator, average=None) -> None:
        """Continue exactly where `state` was saved: weights (the trained ones, and the average into `average`),
        optimizer, schedule, scaler, progress, randomness."""
        model.load_state_dict(state.get("trained_model", state["model"]))
        if average is not None:
            average.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        scheduler.load_state_dict(state["scheduler"])
        precision.load_state_dict(state.get("scaler", {}))
        self.epoch, self.batch_in_epoch, self.step = state["epoch"], state["batch_in_epoch"], state["step"]
        self.best_acc = state.get("best_acc", -1.0)
        early = state.get("early_stop") or {}
        self.early_stop_best = early.get("best")
        self.early_stop_wait = 0 if early.get("stopped") else early.get("wait", 0)  # extended: full patience again
        self.budget = state.get("budget")
        so_far = state.get("epoch_so_far")
        self.epoch_so_far = ([float(v) for v in so_far] if self.batch_in_epoch and isinstance(so_far, list)
                             and len(so_far) == 3 and all(isinstance(v, (int, float)) for v in so_far) else None)
        set_rng_state(state["rng"])
        if state.get("aug_rng") is not None:
            aug_generator.set_state(state["aug_rng"])


def check_layout(state: Any, path: str | Path) -> dict:
    """`state` if it is a TrainDeck checkpoint this version can read; else a clear error naming the file."""
    if not isinstance(state, dict) or "model" not in state or "epoch" not in state:
        raise ValueError(f"{path}: not a TrainDeck checkpoint (no model/epoch)")
    version = state.get("version", 1)
    if not isinstance(version, int) or version > VERSION:
        raise CheckpointVersionError(f"{path}: written by a newer TrainDeck (checkpoint version {version}; this one "
                                     f"reads up to {VERSION}); update TrainDeck to use it")
    return state


def read_checkpoint(path: str | Path) -> dict:
    """A TrainDeck checkpoint file, loaded safely and checked (layout and version)."""
    return check_layout(load_weights_only(path), path)


class CheckpointWriteError(OSError):
    """A checkpoint could not be written; the message says why in words (full disk, permissions, ...)."""


TORCH_WRITE_FAILURES = ("inline_container", "PytorchStreamWriter", "file write failed", "unexpected pos")


def is_write_failure(e: BaseException) -> bool:
    """An OSError, or torch.save's own words for a write that failed (`[enforce fail at inline_container.cc:672]
    unexpected pos ...` on a full disk)."""
    return isinstance(e, OSError) or (isinstance(e, RuntimeError) and any(w in str(e) for w in TORCH_WRITE_FAILURES))


def describe_write_failure(e: BaseException, folder: str | Path) -> str:
    """A failed write as a user reads it: 'no space left on device in FOLDER', not an errno or a torch assert
    (torch.save reports a full disk as `[enforce fail at inline_container.cc]`)."""
    full = getattr(e, "errno", None) == errno.ENOSPC
    if not full:
        try:
            full = shutil.disk_usage(folder).free < (1 << 20)
        except OSError:
            full = False
    if full:
        return f"no space left on device in {folder}"
    return f"{folder}: {getattr(e, 'strerror', None) or e}"


def _fsync_dir(folder: Path) -> None:
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def atomic_save(obj: Any, path: Path) -> None:
    """torch.save to a temp file beside `path`, fsync, rename over `path`, fsync the folder; nothing partial
    survives."""
    path = Path(path)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            torch.save(obj, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException as e:
        # said before the partial file goes: with it gone the disk has room again, and a full one would not look it
        said = describe_write_failure(e, path.parent) if is_write_failure(e) else None
        try:
            os.unlink(tmp)
        except OSError:
            pass
        if said is not None:
            raise CheckpointWriteError(f"cannot save {path.name}: {said}") from e
        raise
    _fsync_dir(path.parent)


class CheckpointWriter:
    """Writes checkpoints on one background thread, in order, as `torch.distributed.checkpoint.async_save` and
    Lightning's `AsyncCheckpointIO` do: the state is copied to CPU memory at the save point (pinned, from a GPU), and
    the write, fsync and rename happen while training goes on. With `background=False` every write happens at once,
    in the caller's thread, from the live state (no copy).

    `wait` blocks until every write is done and raises the first error; `save_checkpoint` waits before the next
    save (so at most one is in flight), and the trainer waits before it reports a run stopped or finished.
    """

    def __init__(self, background: bool = True):
        self.background = background
        self._pool: ThreadPoolExecutor | None = None
        self._pending: list[Future] = []

    def submit(self, work: Callable[[], None]) -> None:
        if not self.background:
            work()
            return
        if self._pool is None:
            self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="checkpoint-writer")
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


def writes_in_background(choice: str, device: torch.device, local_processes: int = 1) -> bool:
    """`checkpoint.writer`: background, sync, or auto = in the background when training leaves the CPU room for it
    (it runs on a GPU, or its processes' compute threads leave a core free) and synchronously when training keeps
    every core busy: there a writer thread stalls the compute threads (each parallel op waits for its slowest thread)
    and slows training by more than the write itself takes (docs/benchmarks.md, "Checkpoints")."""
    if choice != "auto":
        return choice == "background"
    if device.type == "cuda":
        return True
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return torch.get_num_threads() * local_processes < cores


def snapshot(obj: Any) -> Any:
    """A copy of `obj` whose tensors live in CPU memory of their own (pinned when copied from a GPU), so training
    can go on changing the originals while the copy is written."""
    copies_from_gpu = []

    def copy(x: Any) -> Any:
        if isinstance(x, torch.Tensor):
            if x.device.type == "cuda":
                out = torch.empty(x.shape, dtype=x.dtype, pin_memory=True)
                out.copy_(x.detach(), non_blocking=True)
                copies_from_gpu.append(out)
                return out
            return x.detach().clone()
        if isinstance(x, dict):
            out = type(x)((k, copy(v)) for k, v in x.items())
            if hasattr(x, "_metadata"):  # a state_dict's version records
                out._metadata = x._metadata
            return out
        if isinstance(x, (list, tuple)):
            return type(x)(copy(v) for v in x)
        return x

    result = copy(obj)
    if copies_from_gpu:
        torch.cuda.synchronize()  # the non-blocking copies are complete before the writer reads them
    return result


def atomic_link(src: Path, dst: Path) -> None:
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
        atomic_save(load_weights_only(src), dst)
    _fsync_dir(dst.parent)


def load_weights_only(path: str | Path, map_location: str = "cpu") -> Any:
    """torch.load with weights_only=True; a file that needs more is refused, never unpickled, and a file that is not
    a PyTorch file at all is said to be so."""
    try:
        with open(path, "rb") as f:
            head = f.read(4)
    except OSError:
        head = b"PK\x03\x04"  # torch.load names the file and the error
    if head != b"PK\x03\x04" and not head.startswith(b"\x80"):  # neither torch.save's zip nor a legacy pickle
        raise UnsafeFileError(f"{path}: not a checkpoint (not a file torch.save writes: it starts with {head!r})")
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
                    writer: CheckpointWriter | None = None) -> Path:
    """Write a numbered checkpoint, update last.pt (and best.pt), prune old numbered ones; its path.

    With `writer`, a CPU snapshot is taken now and everything else happens on the writer's thread: the file is
    written, fsynced and renamed into place, then last.pt/best.pt point at it, then older ones are pruned. So the
    previous checkpoint stays the newest one on disk until this one is durable, and a crash inside that window
    loses this checkpoint alone. Without `writer`, the same happens before this returns.
    """
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"ckpt-e{state['epoch']:04d}-s{state['step']:08d}.pt"

    def write(snap: dict) -> None:
        remove_stale_temporaries(folder)
        atomic_save(snap, path)
        atomic_link(path, folder / "last.pt")
        if is_best:
            atomic_link(path, folder / "best.pt")
        for old in numbered_checkpoints(folder)[keep_last:]:
            old.unlink(missing_ok=True)

    if writer is None or not writer.background:
        write(state)
    else:
        writer.wait()  # the previous write is done (and its error, if any, raised here)
        snap = snapshot(state)
        writer.submit(lambda: write(snap))
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
            state = read_checkpoint(path)
        except CheckpointVersionError:
            raise  # a newer file is not corrupt: falling back to an older one would silently lose it
        except Exception as e:  # noqa: BLE001 - every failure means "try the previous one"
            failures.append(f"{path.name}: {type(e).__name__}: {e}")
            log.warning("checkpoint %s cannot be loaded (%s); trying the previous one", path, e)
            continue
        return state, path
    raise CorruptCheckpointError(f"{folder}: no checkpoint loads: " + "; ".join(failures))
