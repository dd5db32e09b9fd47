"""Where the window's runs are written and listed (issue #71): the folder given with --runs-dir, else the one the user
chose on the Runs page last time, else TrainDeck's own data folder's runs/ (the trainer's answer,
`trainer.core.rundir.user_runs_dir`). Never the folder the app happened to be started from, unless it is the one chosen.

One object, read at each use: choosing another folder moves every part of the window at once."""

from __future__ import annotations

import os
from pathlib import Path

from trainer.core.rundir import user_runs_dir

SETTING = "runs_dir"  # the remembered choice, in the window's settings


class RunsFolder:
    def __init__(self, path: str | os.PathLike):
        self.path = Path(path).expanduser()

    @classmethod
    def at_start(cls, given: str | os.PathLike | None, remembered: object) -> RunsFolder:
        """--runs-dir (`given`) wins; then the remembered folder, if it is still a folder; then the default."""
        if given:
            return cls(given)
        if isinstance(remembered, str) and remembered and Path(remembered).expanduser().is_dir():
            return cls(remembered)
        return cls(user_runs_dir())
