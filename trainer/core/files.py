"""Reading the user's small files safely (a regular file, bounded in size) and writing small text files so that a
reader never sees half of one. Torch-free (the app reads and writes with it too)."""

from __future__ import annotations

import os
import stat
from pathlib import Path

from trainer.core.errors import InputError


def is_regular_file(path: str | os.PathLike) -> bool:
    """A plain file (through links): not a FIFO, a device, a socket or a folder, which a reader would hang on or
    fail at; False for a broken link."""
    try:
        return stat.S_ISREG(os.stat(path).st_mode)
    except (OSError, ValueError):
        return False


class UserFileError(InputError, OSError):
    """A file the user named that is not read: not a regular file, too large, missing or unreadable. Its message
    names the file and says why in words."""


def open_regular(path: str | os.PathLike, what: str = "file", follow_links: bool = True) -> int:
    """A descriptor of `path` opened for reading, only when it is a regular file (a FIFO would wait for ever,
    /dev/zero would fill the memory), else UserFileError naming it. Opened without blocking and checked on the open
    file, so a path swapped for a FIFO meanwhile cannot hang. With `follow_links` False a link is refused too: a run
    folder's own files are its own, never another run's through a link."""
    flags = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | (0 if follow_links else getattr(os, "O_NOFOLLOW", 0))
    try:
        fd = os.open(path, flags)
    except FileNotFoundError as e:
        raise UserFileError(f"{path}: no such {what}") from e
    except OSError as e:
        if not follow_links and os.path.islink(path):
            raise UserFileError(f"{path}: is a link, not the run's own {what} (a run folder's files are not links)") \
                from e
        raise UserFileError(f"{path}: cannot read the {what} ({e.strerror})") from e
    try:
        info = os.fstat(fd)
        if stat.S_ISDIR(info.st_mode):
            raise UserFileError(f"{path}: is a folder, not a {what}")
        if not stat.S_ISREG(info.st_mode):
            kind = "a FIFO" if stat.S_ISFIFO(info.st_mode) else "a device" if stat.S_ISCHR(info.st_mode) or \
                stat.S_ISBLK(info.st_mode) else "a socket" if stat.S_ISSOCK(info.st_mode) else "not a regular file"
            raise UserFileError(f"{path}: is {kind}, not a {what} (only regular files are read)")
        if hasattr(os, "set_blocking"):
            os.set_blocking(fd, True)
    except BaseException:
        os.close(fd)
        raise
    return fd


def read_user_file(path: str | os.PathLike, max_bytes: int, what: str = "file", follow_links: bool = True) -> bytes:
    """The bytes of a file the user gave (a config, manifest, labels file, sweep) or a run folder's own file: only a
    regular file (`open_regular`), at most `max_bytes` of it, else UserFileError."""
    fd = open_regular(path, what, follow_links)
    try:
        size = os.fstat(fd).st_size
        if size > max_bytes:
            raise UserFileError(f"{path}: {size:,} bytes, more than a {what} may be ({max_bytes:,})")
        with os.fdopen(fd, "rb", closefd=True) as f:
            fd = -1
            data = f.read(max_bytes + 1)
    except OSError as e:
        if isinstance(e, UserFileError):
            raise
        raise UserFileError(f"{path}: cannot read the {what} ({e.strerror or e})") from e
    finally:
        if fd >= 0:
            os.close(fd)
    if len(data) > max_bytes:  # it grew while being read
        raise UserFileError(f"{path}: more than a {what} may be ({max_bytes:,} bytes)")
    return data


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


class BoundedLines:
    """Complete lines out of bytes fed in chunks cut anywhere, each at most `max_line` bytes: a longer line is skipped
    (counted in `skipped`) without being held, however long it is; an incomplete last line waits for the next
    chunk."""

    def __init__(self, max_line: int):
        self.max_line = max_line
        self.pending = b""
        self.skipping = False  # inside a line already too long: dropped up to its newline
        self.skipped = 0

    def feed(self, chunk: bytes) -> list[bytes]:
        data = self.pending + chunk
        lines = data.split(b"\n")
        rest = lines.pop()
        if self.skipping and lines:  # the rest of the long line ends here
            lines.pop(0)
            self.skipping = False
        if self.skipping:
            rest = b""
        kept = []
        for line in lines:
            if len(line) > self.max_line:
                self.skipped += 1
            else:
                kept.append(line)
        if len(rest) > self.max_line:
            self.skipped += 1
            self.skipping, rest = True, b""
        self.pending = rest
        return kept
