"""What differs between operating systems, in one place: file locks, whether a process lives, starting a process
tree of its own, asking it to stop and ending it. Torch-free (the app uses it too).

**The stop channel.** Every process that `main.py` starts for a command is the root of a process tree or a member
of one. A root's *stop file* is `stop_file(its pid)`, named in the environment (`TRAINDECK_STOP_FILE`), so every
process it starts (torchrun, the DDP ranks, a spawned worker) inherits it; `stop_tree(root)` creates that file and
each process of the tree that handles a stop (`on_stop`) sees it within `POLL_S` and stops as if told by SIGTERM:
the trainer checkpoints and ends. This works on every OS; where the OS has signals (POSIX) `stop_tree` also sends
SIGTERM to the root's process group, as before, and `kill_tree` ends what does not stop (psutil, every OS).

`TRAINDECK_PORTABLE=1` makes Linux take the paths Windows must take (no signals sent, no sessions, DataLoader workers
started by `spawn`), so the test suite runs them here; locks (filelock) and process trees (psutil) are the same
code on every OS anyway.
"""

from __future__ import annotations

import contextlib
import getpass
import logging
import os
import signal
import stat
import subprocess
import tempfile
import threading
from collections.abc import Callable
from pathlib import Path

import filelock
import psutil

log = logging.getLogger(__name__)

PORTABLE = os.name != "posix" or os.environ.get("TRAINDECK_PORTABLE") == "1"
STOP_FILE_ENV = "TRAINDECK_STOP_FILE"
WATCH_PARENT_ENV = "TRAINDECK_WATCH_PARENT"  # a child started with this set to its parent's pid stops when it ends
POLL_S = 0.2  # how often a process looks at its stop file (and its parent)


# ---- folders -------------------------------------------------------------------------------------------------
def user_dir(kind: str) -> Path:
    """TrainDeck's folder of `kind` (cache, data, config or state) for this user, where the OS keeps such folders
    (platformdirs): $XDG_CACHE_HOME/traindeck etc. on Linux (~/.cache, ~/.local/share, ~/.config, ~/.local/state),
    ~/Library/... on macOS, %LOCALAPPDATA%\\traindeck on Windows."""
    import platformdirs

    return Path(getattr(platformdirs, f"user_{kind}_dir")("traindeck", appauthor=False))


# ---- locks ---------------------------------------------------------------------------------------------------
@contextlib.contextmanager
def locked(path: str | os.PathLike):
    """An exclusive lock on the file `path` for the block, waiting for it (released by the OS if we die)."""
    lock = filelock.FileLock(path, thread_local=False)
    with lock:
        yield


class HeldLock:
    """A lock taken by `try_lock`, held until `close()` (or the process ends)."""

    def __init__(self, lock: filelock.BaseFileLock):
        self._lock = lock

    def close(self) -> None:
        self._lock.release(force=True)


def try_lock(path: str | os.PathLike) -> HeldLock | None:
    """An exclusive lock on `path` held until the returned handle is closed (or the process ends), or None when
    another process (or another handle here) holds it. The lock file itself stays empty: on Windows a locked file
    cannot be read by others, so what a holder wants known goes in a file beside it."""
    lock = filelock.FileLock(path, thread_local=False)
    try:
        lock.acquire(timeout=0)
    except filelock.Timeout:
        return None
    return HeldLock(lock)


# ---- processes -----------------------------------------------------------------------------------------------
def pid_alive(pid: int | None) -> bool:
    """Whether process `pid` runs (a zombie, exited but not yet reaped, does not)."""
    if not pid:
        return False
    try:
        return psutil.Process(int(pid)).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False
    except psutil.AccessDenied:  # another user's: it exists
        return True


def open_by(path: str | os.PathLike) -> list[int]:
    """The pids of the processes that hold `path` open (a lock's holder), as far as this user may see."""
    target = os.path.realpath(path)
    found = []
    for proc in psutil.process_iter():
        try:
            if any(f.path == target for f in proc.open_files()):
                found.append(proc.pid)
        except psutil.Error:
            continue
    return found


def stop_file(root: int) -> Path:
    """The file whose existence asks process tree `root` to stop."""
    return stop_dir() / str(root)


_warned_stop_dirs: set[str] = set()


def _private_dir(path: Path) -> bool:
    """`path` is, or is now made, a folder of this user's alone: a folder (not a link to one), owned by this user,
    open to nobody else. On a shared /tmp anyone could have made it first, as a file, a link or a folder of theirs."""
    try:
        path.mkdir(mode=0o700, exist_ok=True)
        info = os.lstat(path)
        if not stat.S_ISDIR(info.st_mode):
            return False
        if os.name != "nt":
            if info.st_uid != os.getuid():
                return False
            if info.st_mode & 0o077:
                os.chmod(path, 0o700)
    except OSError:
        return False
    return True


def stop_dir() -> Path:
    """Where stop files live: TEMP/traindeck-USER/stop, a folder of this user's alone; when that place is not one (a
    file or someone else's folder there), the user's own state folder, said once."""
    try:
        user = getpass.getuser()
    except (KeyError, OSError):  # no name for this user id (a container)
        user = str(os.getuid()) if hasattr(os, "getuid") else "user"
    base = Path(tempfile.gettempdir()) / f"traindeck-{user}"
    if _private_dir(base) and _private_dir(base / "stop"):
        return base / "stop"
    fallback = user_dir("state") / "stop"
    if str(base) not in _warned_stop_dirs:
        _warned_stop_dirs.add(str(base))
        log.warning("%s is not a folder of this user's alone (a file, a link or another user's): stop requests go "
                    "to %s instead", base, fallback)
    try:
        fallback.mkdir(parents=True, exist_ok=True, mode=0o700)
    except OSError as e:
        log.warning("cannot make %s: %s", fallback, e)
    return fallback


def claim_stop_file() -> Path:
    """This process's stop file: the one it inherited, or, for the root of a tree, `stop_file(its pid)` (one an
    earlier process of this pid left is removed). It stays when the root ends, so the members that outlive it
    still see it. Called first thing by `main.py`."""
    inherited = os.environ.get(STOP_FILE_ENV)
    if inherited:
        return Path(inherited)
    path = stop_file(os.getpid())
    path.unlink(missing_ok=True)
    os.environ[STOP_FILE_ENV] = str(path)
    return path


def process_group() -> int:
    """The root of this process's tree: what `stop_tree` is given to stop it (on POSIX, its process group)."""
    if not PORTABLE:
        return os.getpgid(0)
    inherited = os.environ.get(STOP_FILE_ENV, "")
    name = Path(inherited).name
    return int(name) if name.isdigit() else os.getpid()


def detached(env: dict | None = None, own_tree: bool = True) -> dict:
    """subprocess.Popen's keyword arguments for a child in a tree of its own, which `stop_tree(child.pid)` stops and
    a stop of ours does not reach: a session of its own on POSIX, a new process group on Windows (Ctrl+C in our
    console stays ours). With `own_tree` (a `main.py` command) it roots a stop channel of its own; without, it
    shares ours (a launcher we pass stops on, like torchrun: on POSIX it is SIGTERMed once, by us)."""
    env = dict(os.environ if env is None else env)
    if own_tree:
        env.pop(STOP_FILE_ENV, None)
    kwargs: dict = {"env": env}
    if os.name == "nt":
        kwargs["creationflags"] = subprocess.CREATE_NEW_PROCESS_GROUP
    elif not PORTABLE:
        kwargs["start_new_session"] = True
    return kwargs


def stop_tree(root: int) -> bool:
    """Ask process tree `root` to stop: it checkpoints and ends (`kill_tree` ends what does not). False when nothing
    of it is left to ask."""
    path = stop_file(root)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.touch()
    except OSError as e:
        log.warning("cannot write the stop request %s: %s", path, e)
    if PORTABLE:
        return pid_alive(root)
    try:
        os.killpg(root, signal.SIGTERM)
    except ProcessLookupError:
        return pid_alive(root)
    return True


def pass_stop_on(pid: int) -> None:
    """Pass a stop this process was asked for on to a child that shares its stop file (torchrun, spawned ranks):
    SIGTERM where there are signals (the child is in a session of its own); elsewhere it reads the same file."""
    if PORTABLE:
        return
    try:
        os.kill(pid, signal.SIGTERM)
    except ProcessLookupError:
        pass


def kill_tree(root: int | None, also: list[psutil.Process] = ()) -> None:
    """End process `root` (None: none), its descendants and `also` now (SIGKILL; TerminateProcess on Windows). A
    process of `also` whose pid another process took since is left alone."""
    procs = list(also)
    try:
        top = psutil.Process(root) if root else None
        procs += [top, *top.children(recursive=True)] if top else []
    except psutil.Error:
        pass
    if not PORTABLE and procs[len(also):]:  # it still runs: not a group of a pid reused since
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(root, signal.SIGKILL)  # also its session's processes whose parent is gone
    for proc in procs:
        with contextlib.suppress(psutil.Error):
            if proc.is_running():  # compares the start time too
                proc.kill()


# ---- being stopped -------------------------------------------------------------------------------------------
PREEMPT_SIGNAL = "SIGUSR1"  # SLURM's warning before a job's time limit or its preemption (sbatch --signal)
_warned = threading.Event()  # it came before a trainer in this process listened for it


def hold_preempt_signal() -> None:
    """SLURM's warning signal reaches every process of the job step (launchers, torchrun, ranks): it ends none of
    them, and one that came before the trainer listens for it (`preempt_signalled`) is kept for it. Where there is
    no such signal (Windows) nothing is done."""
    if hasattr(signal, PREEMPT_SIGNAL) and threading.current_thread() is threading.main_thread():
        signal.signal(getattr(signal, PREEMPT_SIGNAL), lambda signum, frame: _warned.set())


def ignore_preempt_signal() -> None:
    """From here on SLURM's warning is ignored: a command's end. (Python gives a signal it handled back its default
    action as the interpreter finalizes, and SLURM's warning arriving then ended a job whose run had completed.)"""
    if hasattr(signal, PREEMPT_SIGNAL) and threading.current_thread() is threading.main_thread():
        signal.signal(getattr(signal, PREEMPT_SIGNAL), signal.SIG_IGN)


def ignoring_preempt_signal() -> dict:
    """subprocess.Popen's keyword arguments for a launcher we start (torchrun) that must outlive SLURM's warning
    signal: it ignores it (its ranks handle it). Nothing where there is no such signal."""
    if not hasattr(signal, PREEMPT_SIGNAL) or os.name != "posix":
        return {}
    return {"preexec_fn": lambda: signal.signal(getattr(signal, PREEMPT_SIGNAL), signal.SIG_IGN)}


def preempt_signalled() -> bool:
    """Whether SLURM's warning came to this process before anything listened for it (`hold_preempt_signal`)."""
    return _warned.is_set()


def on_stop(handler: Callable[[str], None], watch_parent: bool = False) -> Callable[[], None]:
    """Call `handler(why)` when this process is asked to stop: SIGTERM or SIGINT, or its tree's stop file (looked
    at every POLL_S by a daemon thread); with `watch_parent` (or when started with WATCH_PARENT_ENV naming its
    parent), also when its parent ends: a launched worker does not outlive its launcher. Returns a function that
    undoes it (the previous signal handlers back, the thread ended). Call it from the main thread."""
    previous = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT)}
    for s in previous:
        signal.signal(s, lambda signum, frame: handler(signal.Signals(signum).name))
    ended = threading.Event()
    path = os.environ.get(STOP_FILE_ENV)
    parent = None
    if watch_parent or os.environ.get(WATCH_PARENT_ENV) == str(os.getppid()):
        with contextlib.suppress(psutil.Error):
            parent = psutil.Process(os.getppid())

    def watch() -> None:
        while not ended.wait(POLL_S):
            if path and os.path.exists(path):
                handler("a stop request")
                return
            if parent is not None and (not parent.is_running() or os.getppid() != parent.pid):  # gone, or a zombie
                handler(f"the launcher (pid {parent.pid}) is gone")
                return

    if path or parent is not None:
        threading.Thread(target=watch, name="stop-channel", daemon=True).start()

    def undo() -> None:
        ended.set()
        for s, h in previous.items():
            signal.signal(s, h)

    return undo


def worker_start_method() -> str | None:
    """How DataLoader workers start: None (the OS's default, fork on Linux); `spawn` where there is no fork (and in
    the portable mode, so the tests meet what Windows and macOS do: everything a worker gets must pickle)."""
    return "spawn" if PORTABLE else None
