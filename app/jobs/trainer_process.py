"""TrainerProcess: starts the headless trainer as a process tree of its own and stops that whole tree.

The trainer writes everything to its run directory (output goes to `output.log`, never a pipe that
could fill up), so the app can quit and the run goes on; a later app re-attaches by pid. Stop asks the
tree to stop (trainer/core/system.py's stop channel: the trainer checkpoints and exits), then after a grace
period kills the tree and every process seen in it (torchrun puts DDP workers in sessions of their own).
All waiting is done by timers: nothing here blocks the GUI thread.

With `keep_standby`, a `main.py standby` process (trainer/runs/standby.py) is kept ready between runs: it has
imported torch and the training code already, and the next train or resume command is handed to it instead of
starting a fresh interpreter. Which commands it takes is the trainer's rule (`STANDBY_COMMANDS`).
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
from pathlib import Path

import psutil
from PySide6.QtCore import QObject, QTimer, Signal

from trainer.core.system import detached, kill_tree, pid_alive, stop_tree
from trainer.runs.commands import Standby
from trainer.runs.launch import main_command
from trainer.runs.standby import STANDBY_COMMANDS

log = logging.getLogger(__name__)

GRACE_MS = 15_000


class TrainerProcess(QObject):
    ended = Signal(int)  # exit code (or -1 when re-attached and unknown)

    def __init__(self, parent: QObject | None = None, grace_ms: int = GRACE_MS):
        super().__init__(parent)
        self.grace_ms = self.default_grace_ms = self.last_grace_ms = grace_ms
        self.popen: subprocess.Popen | None = None
        self.pid: int | None = None
        self._tree: dict[int, psutil.Process] = {}  # descendants seen while running (pid -> process)
        self._poll = QTimer(self)
        self._poll.setInterval(200)
        self._poll.timeout.connect(self._check)
        self._kill_timer = QTimer(self)
        self._kill_timer.setSingleShot(True)
        self._kill_timer.timeout.connect(self.kill)
        self.forced = False  # the last process was killed after Stop's grace period
        self.standby: subprocess.Popen | None = None
        self._standby_cwd: str | None = None

    def start(self, command: list[str], output_log: Path, cwd: str | None = None) -> None:
        """Start `command` (or hand it to the standby trainer) with its output going to `output_log`."""
        self.popen = self._hand_to_standby(command, output_log, cwd)
        if self.popen is None:
            output = open(output_log, "ab")
            try:
                self.popen = subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=output,
                                              stderr=subprocess.STDOUT, cwd=cwd,
                                              **detached(dict(os.environ, PYTHONUNBUFFERED="1")))
            finally:
                output.close()
        self.pid = self.popen.pid
        self.forced = False
        self._tree.clear()
        log.info("started trainer pid %d: %s", self.pid, " ".join(command))
        self._poll.start()

    # ---- the standby trainer ------------------------------------------------------------------
    def keep_standby(self, cwd: str) -> None:
        """From now on keep a standby trainer ready whenever no run is going (started now, and after each run)."""
        self._standby_cwd = cwd
        self._spawn_standby()

    def close_standby(self) -> None:
        """Let the unused standby go now: its input closes and it is told to end (SIGTERM), so it does not linger
        the ~20 s its imports can take (it holds nothing: no run was handed to it)."""
        standby, self.standby, self._standby_cwd = self.standby, None, None
        if standby is None:
            return
        if standby.stdin is not None:
            try:
                standby.stdin.close()
            except OSError:
                pass
        if standby.poll() is None:
            standby.terminate()

    def _spawn_standby(self) -> None:
        if self._standby_cwd is None or self.running or (self.standby is not None and self.standby.poll() is None):
            return
        self.standby = subprocess.Popen(main_command(*Standby().argv()), stdin=subprocess.PIPE, stdout=subprocess.DEVNULL,
                                        stderr=subprocess.DEVNULL, cwd=self._standby_cwd,
                                        **detached(dict(os.environ, PYTHONUNBUFFERED="1")))
        log.info("standby trainer pid %d started", self.standby.pid)

    def _hand_to_standby(self, command: list[str], output_log: Path, cwd: str | None) -> subprocess.Popen | None:
        """The standby, now running `command`; None when it cannot take it (none alive, another folder, a command
        it does not run): the caller starts a fresh process."""
        standby = self.standby
        argv = command[2:] if command[:2] == main_command() else []
        if (standby is None or standby.poll() is not None or cwd != self._standby_cwd or not argv
                or argv[0] not in STANDBY_COMMANDS):
            return None
        self.standby = None
        try:
            standby.stdin.write((json.dumps({"argv": argv, "output": str(output_log)}) + "\n").encode())
            standby.stdin.close()
        except OSError as e:  # it died in the meantime
            log.warning("standby trainer pid %d unusable (%s): starting a new process", standby.pid, e)
            standby.kill()
            return None
        log.info("run handed to standby trainer pid %d", standby.pid)
        return standby

    def attach(self, pid: int) -> None:
        """Follow a trainer started by an earlier app session (not our child: liveness by pid)."""
        self.popen = None
        self.pid = pid
        self.forced = False
        self._poll.start()

    def detach(self) -> None:
        """Stop following the trainer without signalling it (it goes on; a later app re-attaches)."""
        self._poll.stop()
        self._kill_timer.stop()

    @property
    def running(self) -> bool:
        return self._poll.isActive()

    def stop(self, grace_ms: int | None = None) -> None:
        """Graceful stop of the whole process tree, forced after the grace period (`grace_ms`, else the default
        for this kind of run)."""
        if not self.running:
            return
        try:
            stop_tree(self.pid)  # the trainer roots its tree: its stop file, its process group
        except PermissionError as e:
            log.error("cannot stop trainer %s: %s", self.pid, e)
        self.last_grace_ms = grace_ms or self.grace_ms
        self._kill_timer.start(self.last_grace_ms)

    def kill(self) -> None:
        if self.running:
            log.warning("trainer pid %s did not stop in time: killing its processes", self.pid)
            self.forced = True
            self._kill_tree(self.pid)

    def _check(self) -> None:
        if self.popen is not None:
            code = self.popen.poll()
            if code is None:
                self._remember_tree()
                return
        elif pid_alive(self.pid):
            self._remember_tree()
            return
        else:
            code = -1
        self._poll.stop()
        self._kill_timer.stop()
        self._kill_tree(None)  # workers left behind by a launcher that died (e.g. it was SIGKILLed)
        self.ended.emit(code)
        self._spawn_standby()  # ready for the next run

    def _remember_tree(self) -> None:
        try:
            for child in psutil.Process(self.pid).children(recursive=True):
                self._tree.setdefault(child.pid, child)
        except psutil.Error:
            pass

    def _kill_tree(self, root: int | None) -> None:
        kill_tree(root, also=list(self._tree.values()))
        self._tree.clear()
