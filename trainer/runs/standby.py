"""A trainer process started before it is needed.

`python main.py standby` imports what every run needs (torch, the training modules) and then waits for one command
on stdin. The app keeps one ready while the user is still choosing, so pressing Start skips those seconds
(docs/benchmarks.md, "Start-up").

The command is one JSON line: `{"argv": ["train", CONFIG, "--run-dir", RUN], "output": "RUN/output.log"}`. The
process then sends its output to that file, reads nothing more from stdin, and runs the command exactly as
`python main.py ARGV` would; its exit code is the command's. End of input before a command (the app quit) exits 0.
Only the commands in `STANDBY_COMMANDS` are taken; this module imports nothing heavy until `serve` runs.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Callable
from typing import TextIO

STANDBY_COMMANDS = ("train", "resume")


def warm_imports() -> None:
    import torch  # noqa: F401

    import trainer.runs.runner  # noqa: F401
    import trainer.train.engine  # noqa: F401
    import trainer.train.preflight  # noqa: F401


def serve(entry: Callable[[list[str]], int], stdin: TextIO = sys.stdin) -> int:
    """Warm up, wait for one command and run it through `entry` (the CLI's `main`, handed in: this module sits below
    the CLI and does not import it)."""
    import signal

    # told to go (SIGTERM) before a command came: leave at once, quietly, even in the middle of the imports
    signal.signal(signal.SIGTERM, lambda *_: os._exit(0))
    warm_imports()
    line = stdin.readline()
    if not line.strip():
        return 0
    try:
        request = json.loads(line)
        argv, output = list(request["argv"]), str(request["output"])
    except (ValueError, KeyError, TypeError) as e:
        print(f"error: standby: not a command: {line.strip()[:200]!r} ({e})", file=sys.stderr)
        return 2
    signal.signal(signal.SIGTERM, signal.SIG_DFL)  # a command from here on: the run installs its own stop handling
    if not argv or argv[0] not in STANDBY_COMMANDS:
        print(f"error: standby: runs {' or '.join(STANDBY_COMMANDS)}, not {argv[:1]}", file=sys.stderr)
        return 2
    fd = os.open(output, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    sys.stdout.flush()
    sys.stderr.flush()
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.close(null)
    return entry(argv)
