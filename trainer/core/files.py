"""Writing small text files so that a reader never sees half of one. Torch-free (the app writes with it too)."""

from __future__ import annotations

import os
import stat
from pathlib import Path


def is_regular_file(path: str | os.PathLike) -> bool:
    """A plain file (through links): not a FIFO, a device, a socket or a folder, which a reader would hang on or
    fail at; False for a broken link."""
    try:
        return stat.S_ISREG(os.stat(path).st_mode)
    except (OSError, ValueError):
        return False


def atomic_write_text(path: str | os.PathLike, text: str) -> Path:
    """Write `text` to a temporary file beside `path`, then rename it over `path`: readers see the old file or
    the new one, never a part. A failure (a full disk) leaves no temporary behind and raises."""
    return atomic_write_bytes(path, text.encode("utf-8"))


def atomic_write_bytes(path: str | os.PathLike, data: bytes) -> Path:
    """`atomic_write_text` for bytes as they are."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        tmp.write_bytes(data)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    return path
