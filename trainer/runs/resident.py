"""The resident worker: one long-lived process that answers the app's questions (describe a model, probe the
devices, Grad-CAM, predict, the learning-rate finder) with torch already imported, so an answer takes a second, not a
fresh interpreter and a torch import (issue #51; docs/architecture.md).

`python main.py resident` imports torch and the model code, then reads one request a line on stdin:
`{"id": N, "argv": ["describe-model", "resnet18"], "env": {...}, "cwd": "..."}`, runs it exactly as
`python main.py ARGV` would in that environment and folder, and writes one reply a line:
`{"id": N, "code": EXIT_CODE, "stdout": "...", "stderr": "..."}`; before it, each line the command writes to its
stderr as it goes, `{"id": N, "progress": "LINE"}` (the learning-rate finder's points, drawn as they come). Only the
commands in `RESIDENT_COMMANDS` are taken. The replies go out on a descriptor of their own: whatever a model's code
prints (even from C) goes to stderr, never into the replies. End of input ends the process. Like `standby`, this
module imports nothing heavy until `serve` runs, and it is handed the CLI's entry point (it sits below the CLI).
"""

from __future__ import annotations

import contextlib
import io
import json
import logging
import os
import signal
import sys
from collections.abc import Callable
from typing import TextIO

RESIDENT_COMMANDS = ("describe-model", "probe-devices", "grad-cam", "predict", "lr-find", "augment-preview")
LONG_COMMANDS = ("lr-find",)  # minutes, not seconds: given up by restarting the worker (nothing else stops them)


class _Lines(io.StringIO):
    """A captured stream that also hands on each complete line as it is written."""

    def __init__(self, on_line: Callable[[str], None]):
        super().__init__()
        self.on_line = on_line
        self._partial = ""

    def write(self, text: str) -> int:
        *lines, self._partial = (self._partial + text).split("\n")
        for line in lines:
            if line.strip():
                self.on_line(line)
        return super().write(text)


class _CurrentStderr(logging.StreamHandler):
    """A log handler writing to whatever sys.stderr is at the time (each request's captured stderr)."""

    @property
    def stream(self):
        return sys.stderr

    @stream.setter
    def stream(self, value) -> None:
        pass


def warm_imports() -> None:
    import torch  # noqa: F401
    import torchvision.models  # noqa: F401

    import trainer.data.preview  # noqa: F401
    import trainer.deploy.export  # noqa: F401
    import trainer.deploy.gradcam  # noqa: F401
    import trainer.model.models  # noqa: F401
    import trainer.train.lr_find  # noqa: F401


def handled_elsewhere() -> tuple:
    """The signals a command handles besides SIGTERM and SIGINT: SLURM's warning (PREEMPT_SIGNAL), where it exists."""
    from trainer.core.system import PREEMPT_SIGNAL

    return (getattr(signal, PREEMPT_SIGNAL),) if hasattr(signal, PREEMPT_SIGNAL) else ()


def run_captured(entry: Callable[[list[str]], int], argv: list[str], env: dict | None = None,
                 cwd: str | None = None, echo_log: bool = False,
                 on_line: Callable[[str], None] | None = None) -> tuple[int, str, str]:
    """(exit code, stdout, stderr) of `entry(argv)` run here as `python main.py ARGV` would run, in `env` and `cwd`
    (`echo_log`: its log lines on its stderr, as in a terminal; `on_line`: told each stderr line as it is written);
    the process's environment, folder, signal handlers and log handlers are as they were afterwards (the tests'
    `run_here` is this too)."""
    out, err = io.StringIO(), (_Lines(on_line) if on_line else io.StringIO())
    saved_env, saved_cwd = dict(os.environ), os.getcwd()
    saved_signals = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT, *handled_elsewhere())}
    root = logging.getLogger()
    saved_handlers, saved_level = list(root.handlers), root.level
    echo = None
    if echo_log:
        echo = _CurrentStderr()
        echo.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(message)s", "%H:%M:%S"))
        root.addHandler(echo)
    try:
        if env is not None:
            os.environ.clear()
            os.environ.update(env)
        if cwd:
            os.chdir(cwd)
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                code = entry([str(a) for a in argv])
            except SystemExit as e:  # argparse's usage errors
                code = e.code if isinstance(e.code, int) else 2
    finally:
        os.chdir(saved_cwd)
        os.environ.clear()
        os.environ.update(saved_env)
        for s, handler in saved_signals.items():
            signal.signal(s, handler)
        for handler in list(root.handlers):
            if handler not in saved_handlers:
                root.removeHandler(handler)
                if handler is not echo:
                    handler.close()
        for handler in saved_handlers:  # one the command took away
            if handler not in root.handlers:
                root.addHandler(handler)
        root.setLevel(saved_level)
    return int(code or 0), out.getvalue(), err.getvalue()


def serve(entry: Callable[[list[str]], int], stdin: TextIO = sys.stdin) -> int:
    """Warm up, then answer requests until stdin ends (see the module's docstring)."""
    from trainer.core.system import on_stop

    # told to go, or the app gone (even killed): at once, even mid-import
    on_stop(lambda why: os._exit(0), watch_parent=True)
    replies = os.fdopen(os.dup(1), "w", encoding="utf-8")
    os.dup2(2, 1)  # fd 1 is stderr from here on: a stray print, even from C, never lands in the replies
    sys.stdout = sys.stderr
    root = logging.getLogger()
    handler = _CurrentStderr()
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(message)s", "%H:%M:%S"))
    root.addHandler(handler)  # the CLI's basicConfig then adds none; each request's log lines go to its stderr
    root.setLevel(logging.INFO)
    warm_imports()
    replies.write(json.dumps({"ready": True, "pid": os.getpid()}) + "\n")
    replies.flush()
    for line in stdin:
        if not line.strip():
            continue
        try:
            request = json.loads(line)
            ident, argv = request["id"], [str(a) for a in request["argv"]]
            env, cwd = request.get("env"), request.get("cwd")
        except (ValueError, KeyError, TypeError) as e:
            reply = {"id": None, "code": 2, "stdout": "", "stderr": f"error: resident: not a request ({e})\n"}
        else:
            if not argv or argv[0] not in RESIDENT_COMMANDS:
                reply = {"id": ident, "code": 2, "stdout": "",
                         "stderr": f"error: resident: answers {', '.join(RESIDENT_COMMANDS)}, not {argv[:1]}\n"}
            else:
                def progress(text: str, ident=ident) -> None:
                    replies.write(json.dumps({"id": ident, "progress": text}) + "\n")
                    replies.flush()

                code, out, err = run_captured(entry, argv, env, cwd, on_line=progress)
                reply = {"id": ident, "code": code, "stdout": out, "stderr": err}
        replies.write(json.dumps(reply) + "\n")
        replies.flush()
    return 0
