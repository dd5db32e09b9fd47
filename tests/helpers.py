"""In-process training for tests (the CLI path is covered by subprocess tests)."""

import logging
import signal
from pathlib import Path

from trainer.config import load_config, save_config
from trainer.rundir import RunDir, new_run_dir


def train_here(config_path: Path, runs_dir: Path, overrides=None, run: RunDir | None = None,
               resume: bool = False) -> tuple[RunDir, int]:
    from trainer.runner import launch

    cfg = load_config(config_path, overrides)
    if run is None:
        run = new_run_dir(runs_dir, "test")
        save_config(cfg, run.config)
    saved = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT)}
    root = logging.getLogger()
    handlers = list(root.handlers)
    try:
        code = launch(run, load_config(run.config), resume=resume)
    finally:
        for s, h in saved.items():
            signal.signal(s, h)
        for h in list(root.handlers):
            if h not in handlers:
                root.removeHandler(h)
                h.close()
        for h in handlers:
            if h not in root.handlers:
                root.addHandler(h)
    return run, code
