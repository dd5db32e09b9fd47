"""The paths Windows and macOS take, taken here: the stop channel without signals, locks, process trees, names.

`TRAINDECK_PORTABLE=1` makes a process take them (trainer/core/system.py); these tests set it for the processes
they start and patch it for the one sending the stop, so no signal carries any stop here. The whole fast tier runs
in that mode too: `TRAINDECK_PORTABLE=1 pytest -m "not slow"` (docs/portability.md).
"""

import os
import subprocess
import sys
import textwrap
import time

import psutil
import pytest
from helpers import REPO, process_tree_gone, wait_for_event, write_config

from trainer.core import system
from trainer.core.events import read_events
from trainer.core.rundir import RunDir, planned_run_dir
from trainer.model.checkpoint import load_weights_only

PORTABLE_ENV = dict(os.environ, TRAINDECK_PORTABLE="1", PYTHONPATH=str(REPO))
WINDOWS_FORBIDS = set('<>:"/\\|?*')


@pytest.fixture
def portable(monkeypatch):
    monkeypatch.setattr(system, "PORTABLE", True)  # this process sends no signal either


def wait_until(predicate, timeout=60.0, said=lambda: ""):
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"timed out {said()}"
        time.sleep(0.05)


def python_child(code: str, marker, *args, **popen) -> subprocess.Popen:
    """A Python process running `code` (with `marker` and `args` as sys.argv[1:])."""
    return subprocess.Popen([sys.executable, "-c", textwrap.dedent(code), str(marker), *map(str, args)], **popen)


# One process of a tree: it claims the tree's stop file (or joins the one it inherited), starts the children asked
# for (`same` shares its tree, `own` roots a tree of its own), writes its pid to them and waits; told to stop by its
# stop channel, it writes "stopped: WHY" to its marker file and ends.
TREE_MEMBER = """
    import os, subprocess, sys, time
    from trainer.core import system
    marker, kinds = sys.argv[1], sys.argv[2:]
    system.claim_stop_file()
    done = []
    system.on_stop(lambda why: done.append(why))
    children = [subprocess.Popen([sys.executable, "-c", f"CODE = {CODE!r}\\n{CODE}", f"{marker}.{i}"],
                                 **(system.detached() if kind == "own" else {})) for i, kind in enumerate(kinds)]
    open(marker + ".pid", "w").write(str(os.getpid()))
    deadline = time.time() + 120  # never left behind for long, whatever the test did
    while not done and time.time() < deadline:
        time.sleep(0.05)
    open(marker, "w").write("stopped: " + (done[0] if done else "nothing: timed out"))
"""


def tree_member_code() -> str:
    code = textwrap.dedent(TREE_MEMBER)
    return f"CODE = {code!r}\n{code}"


def test_a_stop_request_reaches_its_whole_tree_and_only_it(tmp_path, portable):
    marker = tmp_path / "root"
    root = python_child(tree_member_code(), marker, "same", "own", **system.detached(PORTABLE_ENV))
    try:
        for name in ("root", "root.0", "root.1"):
            wait_until(lambda name=name: (tmp_path / f"{name}.pid").exists())
        assert system.stop_tree(root.pid)
        wait_until(lambda: (tmp_path / "root").exists() and (tmp_path / "root.0").exists(), 20,
                   lambda: (os.listdir(tmp_path), system.stop_file(root.pid).exists(), root.poll()))
        assert (tmp_path / "root").read_text() == "stopped: a stop request"
        assert (tmp_path / "root.0").read_text() == "stopped: a stop request"  # inherited the root's stop file
        time.sleep(4 * system.POLL_S)
        assert not (tmp_path / "root.1").exists(), "a child with a tree of its own was told to stop"
        own = int((tmp_path / "root.1.pid").read_text())
        assert system.stop_tree(own)
        wait_until(lambda: (tmp_path / "root.1").exists())
    finally:
        system.kill_tree(root.pid)
        for pid_file in tmp_path.glob("*.pid"):  # members whose root ended before them
            system.kill_tree(int(pid_file.read_text()))


def test_a_child_told_to_watch_its_parent_stops_when_the_parent_is_killed(tmp_path, portable):
    parent = python_child(f"""
        import os, subprocess, sys, time
        child = subprocess.Popen([sys.executable, "-c", {textwrap.dedent('''
            import sys, time
            from trainer.core import system
            done = []
            system.on_stop(done.append)
            open(sys.argv[1] + ".ready", "w").close()
            deadline = time.time() + 120
            while not done and time.time() < deadline:
                time.sleep(0.05)
            open(sys.argv[1], "w").write(done[0] if done else "timed out")
        ''')!r}, sys.argv[1]], env=dict(os.environ, {system.WATCH_PARENT_ENV}=str(os.getpid())))
        open(sys.argv[1] + ".child", "w").write(str(child.pid))
        time.sleep(600)
    """, tmp_path / "child", env=PORTABLE_ENV)
    wait_until(lambda: (tmp_path / "child.ready").exists())
    parent.kill()
    parent.wait()
    wait_until(lambda: (tmp_path / "child").exists(), timeout=30)
    assert (tmp_path / "child").read_text() == f"the launcher (pid {parent.pid}) is gone"
    psutil.Process(int((tmp_path / "child.child").read_text())).wait(timeout=30)


def test_locks_hold_across_processes_and_end_with_their_holder(tmp_path):
    path = tmp_path / ".lock"
    holder = python_child("""
        import sys, time
        from trainer.core.system import try_lock
        held = try_lock(sys.argv[1])
        print("held" if held else "refused", flush=True)
        time.sleep(600)
    """, path, env=PORTABLE_ENV, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        assert system.try_lock(path) is None
    finally:
        holder.kill()  # never released: the OS lets go when its holder dies
        holder.wait()
    mine = system.try_lock(path)
    assert mine is not None
    assert system.try_lock(path) is None  # a second handle here is refused too
    mine.close()
    with system.locked(path):
        assert system.try_lock(path) is None


def test_pid_alive_and_kill_tree_use_no_signals_of_ours(tmp_path, portable):
    root = python_child("""
        import subprocess, sys, time
        child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
        print(child.pid, flush=True)
        time.sleep(600)
    """, tmp_path, stdout=subprocess.PIPE, text=True, env=PORTABLE_ENV)
    child = int(root.stdout.readline())
    assert system.pid_alive(root.pid) and system.pid_alive(child)
    system.kill_tree(root.pid)
    root.wait(timeout=30)
    wait_until(lambda: not system.pid_alive(child))
    assert not system.pid_alive(root.pid) and not system.pid_alive(None)


def test_run_names_are_ones_windows_allows(tmp_path):
    for label in ("timm:vit_base_patch16_224.augreg", 'my "model" <v2>/a\\b|c?*', ""):
        name = planned_run_dir(tmp_path, label).path.name
        assert not WINDOWS_FORBIDS & set(name) and name == name.strip(" .") and len(name) < 100, name


@pytest.mark.slow
def test_stop_without_signals_checkpoints_a_training_run(shapes_dir, tmp_path, portable):
    """What the app's Stop does on Windows: the stop file alone; the run checkpoints mid-epoch, ends `stopped`,
    and its whole tree is gone."""
    cfg = write_config(tmp_path, shapes_dir, data={"batch_size": 4, "num_workers": 1, "cache": "none"}, train={"epochs": 4},
                       monitor={"log_every": 1})
    run_dir = tmp_path / "run"
    proc = subprocess.Popen([sys.executable, str(REPO / "main.py"), "train", str(cfg), "--run-dir", str(run_dir)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, cwd=REPO,
                            **system.detached(PORTABLE_ENV))
    wait_for_event(run_dir, lambda e: e["event"] == "step" and e["step"] >= 3, proc=proc)
    assert RunDir(run_dir).read_status()["pgid"] == proc.pid  # what the app and the queue stop
    workers = [p for p in psutil.Process(proc.pid).children(recursive=True)
               if "multiprocessing.spawn" in " ".join(p.cmdline())]
    assert workers, "the DataLoader's worker was not started by spawn, as on Windows and macOS"
    assert system.stop_tree(proc.pid)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err
    assert "a stop request: stopping after the current step" in err
    assert RunDir(run_dir).read_status()["state"] == "stopped"
    assert load_weights_only(run_dir / "checkpoints" / "last.pt")["step"] >= 3
    events = read_events(run_dir / "events.jsonl")
    assert events[-1]["event"] == "run_end" and events[-1]["status"] == "stopped"
    assert process_tree_gone(proc.pid, also=workers)


@pytest.mark.parametrize("squatted", ["a file", "a link", "open to all"])
def test_a_stop_folder_someone_else_made_first_is_passed_over_with_one_warning(tmp_path, monkeypatch, caplog,
                                                                               squatted):
    """Issue #67: on a shared /tmp anyone can make TEMP/traindeck-USER first; every command then died with a
    NotADirectoryError. A place that is not a folder of this user's alone is passed over for the user's own state
    folder, said once; a folder of ours that others could enter is closed to them."""
    import getpass
    import logging
    import tempfile

    from trainer.core import system

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "tmp"))
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    monkeypatch.setattr(system, "_warned_stop_dirs", set())
    monkeypatch.delenv("TRAINDECK_STOP_FILE", raising=False)
    (tmp_path / "tmp").mkdir()
    base = tmp_path / "tmp" / f"traindeck-{getpass.getuser()}"
    if squatted == "a file":
        base.write_text("mine")
    elif squatted == "a link":
        (tmp_path / "elsewhere").mkdir()
        base.symlink_to(tmp_path / "elsewhere")
    else:
        base.mkdir(mode=0o777)
        base.chmod(0o777)
    with caplog.at_level(logging.WARNING):
        path = system.claim_stop_file()
        again = system.stop_file(12345)
    if squatted == "open to all":  # ours: closed to the others, and used
        assert path.parent == base / "stop" and base.stat().st_mode & 0o077 == 0
        assert not caplog.records
    else:
        assert path.parent == tmp_path / "state" / "traindeck" / "stop" == again.parent
        assert path.parent.stat().st_mode & 0o077 == 0
        assert len([r for r in caplog.records if "not a folder of this user's alone" in r.getMessage()]) == 1
    assert system.stop_tree(999999) is False and again.parent.joinpath("999999").exists(), "a stop is still asked"
