"""What differs between operating systems, in one place: file locks, whether a process lives, process groups and
their signals, dying with a parent. Torch-free (the app uses it too). A port to another OS replaces this module.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import signal
from typing import IO


@contextlib.contextmanager
def locked(path: str | os.PathLike):
    """An exclusive lock on the file `path` for the block, waiting for it (released by the OS if we die)."""
    with open(path, "a+") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def try_lock(path: str | os.PathLike) -> IO | None:
    """An exclusive lock on `path` held until the returned handle is closed (or the process ends), or None when
    another process holds it."""
    handle = open(path, "a+")
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        handle.close()
        return None
    return handle


def pid_alive(pid: int | None) -> bool:
    """Whether process `pid` runs (a zombie, exited but not yet reaped, does not)."""
    if not pid:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().split(b") ", 1)[1][:1] != b"Z"
    except (OSError, IndexError):
        return True


def process_group() -> int:
    """This process's group id (what Stop signals)."""
    return os.getpgid(0)


def signal_group(pgid: int, sig: int = signal.SIGTERM) -> bool:
    """Send `sig` to every process of group `pgid`; False when the group is gone."""
    try:
        os.killpg(pgid, sig)
    except ProcessLookupError:
        return False
    return True


def signal_process(pid: int, sig: int = signal.SIGTERM) -> bool:
    try:
        os.kill(pid, sig)
    except ProcessLookupError:
        return False
    return True


def die_with_parent() -> None:
    """In a child, before exec: SIGTERM when its parent dies (Linux: PR_SET_PDEATHSIG), and a session of its own,
    so an orphaned trainer checkpoints and stops."""
    try:
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except OSError:
        pass
    os.setsid()

