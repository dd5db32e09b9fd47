"""The decoded-image cache: every image of a folder decoded once to uint8 at the training resolution, kept on disk.

An entry is keyed by the decoder version, the image size and every file's path, size and modification time,
so a changed, added or removed file gives a new key and the folder is decoded again; an unchanged folder is
decoded once and reused by every later run (and by every rank of a DDP run on the same machine, which wait
for the first to finish instead of decoding it again). Layout of an entry:

    <cache dir>/<key>/images.u8   N x 3 x S x S bytes, row i = file i of the folder listing
    <cache dir>/<key>/meta.json   the files, which rows are usable, the files that failed to decode and why

An entry is built in a temporary folder and renamed into place, so a half-written one is never read. Entries
not used for `MAX_AGE_DAYS` are removed when a new one is built.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from trainer.core.system import locked as _locked
from trainer.core.system import pid_alive, user_dir
from trainer.data.frame import Frame

log = logging.getLogger(__name__)

DECODER_VERSION = 2  # 2: EXIF orientation applied. Bump when decode_image's output changes: old entries then never match
MAX_AGE_DAYS = 30
Progress = Callable[[int, int], None]  # (done, total); may raise Interrupted to abandon the build


class Interrupted(Exception):
    """A stop was requested while images were being decoded (the half-built entry is discarded)."""


def default_cache_dir() -> Path:
    return user_dir("cache") / "images"


@dataclass
class ImageStore:
    """Decoded images of one folder listing: in memory (a tensor) or on disk (a read-only memory map)."""

    images: torch.Tensor | np.ndarray  # (N, 3, H, W) uint8
    rows: dict[str, int]  # path -> row, usable files only
    bad: list[tuple[str, str]]  # (path, reason) of files that failed to decode
    where: str  # "memory" or "disk"

    def take(self, rows: torch.Tensor) -> torch.Tensor:
        if isinstance(self.images, torch.Tensor):
            return self.images[rows.to(self.images.device)]
        return torch.from_numpy(self.images[rows.numpy()])  # fancy indexing copies out of the map


def _size_id(frame: Frame) -> int | str:
    """The frame as entries name it: the side alone for a centre-cropped square (what every entry before
    non-square frames holds, so those stay valid), else height x width and the fit."""
    if frame.height == frame.width and frame.fit == "crop":
        return frame.height
    return f"{frame.height}x{frame.width}-{frame.fit}"


def cache_key(paths: list[str], frame: Frame) -> str:
    h = hashlib.sha256(f"traindeck-decoded v{DECODER_VERSION} size={_size_id(frame)}\n".encode())
    for path in paths:
        st = os.stat(path)
        h.update(f"{path}\0{st.st_size}\0{st.st_mtime_ns}\n".encode())
    return h.hexdigest()[:32]


def open_store(paths: list[str], frame: Frame, where: str, cache_dir: Path | None, decode: Callable,
               workers: int, progress: Progress | None = None) -> ImageStore:
    """The decoded images of `paths`: from the cache entry when one matches, else decoded now (and kept).

    `where` is memory (read into RAM) or disk (memory-mapped). Without a usable cache directory, memory images
    are decoded for this run only, and disk raises OSError (the caller decides what to do instead).
    """
    entry = None
    if cache_dir is not None:
        try:
            entry = _ensure_entry(paths, frame, Path(cache_dir), decode, workers, progress)
        except OSError as e:
            if where == "disk":
                raise OSError(f"decoded-image cache {cache_dir} unusable: {e}") from e
            log.warning("decoded-image cache %s unusable (%s): decoding into memory for this run only", cache_dir, e)
    if entry is None:
        images = np.empty((len(paths), 3, *frame.shape), dtype=np.uint8)
        reasons = _decode_into(images, paths, frame, decode, workers, progress)
        return _store(torch.from_numpy(images), paths, reasons, "memory")
    meta = json.loads((entry / "meta.json").read_text())
    mapped = np.memmap(entry / "images.u8", dtype=np.uint8, mode="r", shape=(len(paths), 3, *frame.shape))
    os.utime(entry / "meta.json")  # last used: entries unused for MAX_AGE_DAYS are removed
    images = torch.from_numpy(np.array(mapped)) if where == "memory" else mapped
    return _store(images, paths, meta["reasons"], where)


def _store(images, paths: list[str], reasons: list[str | None], where: str) -> ImageStore:
    rows = {p: i for i, (p, r) in enumerate(zip(paths, reasons)) if r is None}
    bad = [(p, r) for p, r in zip(paths, reasons) if r is not None]
    return ImageStore(images, rows, bad, where)


def _ensure_entry(paths: list[str], frame: Frame, cache_dir: Path, decode: Callable, workers: int,
                  progress: Progress | None) -> Path:
    cache_dir.mkdir(parents=True, exist_ok=True)
    key = cache_key(paths, frame)
    entry = cache_dir / key
    with _locked(cache_dir / f"{key}.lock"):  # another rank or run building the same entry: wait for it
        if _valid(entry, len(paths), frame):
            log.info("decoded-image cache: reusing %s (%d images)", entry, len(paths))
            return entry
        if entry.exists():
            log.warning("decoded-image cache: %s is damaged; decoding again", entry)
            shutil.rmtree(entry, ignore_errors=True)
        need = len(paths) * 3 * frame.pixels
        free = shutil.disk_usage(cache_dir).free
        if need > 0.9 * free:
            raise OSError(f"needs {need / 2**20:.0f} MiB, {free / 2**20:.0f} MiB free")
        _remove_old_entries(cache_dir)
        log.info("decoded-image cache: decoding %d images at %s into %s", len(paths), frame, entry)
        tmp = cache_dir / f"{key}.tmp-{os.getpid()}"
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir()
        try:
            images = np.memmap(tmp / "images.u8", dtype=np.uint8, mode="w+", shape=(max(1, len(paths)), 3, *frame.shape))
            reasons = _decode_into(images, paths, frame, decode, workers, progress)
            images.flush()
            del images
            meta = {"version": DECODER_VERSION, "size": _size_id(frame), "count": len(paths), "paths": paths, "reasons": reasons,
                    "created": time.time()}
            (tmp / "meta.json").write_text(json.dumps(meta))
            os.replace(tmp, entry)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    return entry


def _valid(entry: Path, count: int, frame: Frame) -> bool:
    try:
        meta = json.loads((entry / "meta.json").read_text())
        return (meta.get("count") == count and meta.get("size") == _size_id(frame) and len(meta.get("reasons", [])) == count
                and (entry / "images.u8").stat().st_size == max(1, count) * 3 * frame.pixels)
    except (OSError, ValueError):
        return False


def _decode_into(images: np.ndarray, paths: list[str], frame: Frame, decode: Callable, workers: int,
                 progress: Progress | None) -> list[str | None]:
    """Decode every file into its row of `images`; the reason each failed file failed (None when decoded)."""
    def load(i: int) -> str | None:
        try:
            images[i] = decode(paths[i], frame).numpy()
            return None
        except Exception as e:  # noqa: BLE001 - any bad file is reported, never fatal here
            return f"cannot decode: {e}"

    reasons: list[str | None] = []
    total = len(paths)
    with ThreadPoolExecutor(max_workers=max(1, workers)) as pool:
        for reason in pool.map(load, range(total)):
            reasons.append(reason)
            if progress is not None:
                progress(len(reasons), total)
    return reasons


def _remove_old_entries(cache_dir: Path) -> None:
    cutoff = time.time() - MAX_AGE_DAYS * 86400
    for child in cache_dir.iterdir():
        try:
            if ".tmp-" in child.name:  # left by a build that was killed
                pid = child.name.rpartition("-")[2]
                if pid.isdigit() and not pid_alive(int(pid)):
                    shutil.rmtree(child, ignore_errors=True)
                continue
            if child.is_dir() and (child / "meta.json").stat().st_mtime < cutoff:
                log.info("decoded-image cache: removing %s (unused for %d days)", child, MAX_AGE_DAYS)
                shutil.rmtree(child, ignore_errors=True)
                (cache_dir / f"{child.name}.lock").unlink(missing_ok=True)
        except OSError:
            continue
