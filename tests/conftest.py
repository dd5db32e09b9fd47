import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
os.environ.setdefault("OMP_NUM_THREADS", "2")

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))


@pytest.fixture(scope="session")
def shapes_dir(tmp_path_factory) -> Path:
    """A small generated ImageFolder (4 shape classes, 30 images each, 24 px)."""
    from trainer.demo_data import write_demo_dataset

    return write_demo_dataset(tmp_path_factory.mktemp("shapes") / "train", per_class=30, size=24, seed=1)


def write_config(folder: Path, train_dir: Path, **sections) -> Path:
    """A config file for a fast run on `train_dir`; keyword arguments update sections."""
    raw = {
        "data": {"train_dir": str(train_dir), "image_size": 16, "batch_size": 16, "num_workers": 0},
        "model": {"name": "small_cnn"},
        "optimizer": {"name": "sgd", "lr": 0.05},
        "train": {"epochs": 2, "seed": 0},
        "monitor": {"log_every": 2},
    }
    for section, values in sections.items():
        raw.setdefault(section, {}).update(values)
    path = folder / "config.yaml"
    path.write_text(yaml.safe_dump(raw))
    return path


def run_main(*args, timeout=240, **kwargs) -> subprocess.CompletedProcess:
    """`python main.py ARGS` in a subprocess, as a user would run it."""
    return subprocess.run([sys.executable, str(REPO / "main.py"), *map(str, args)], capture_output=True, text=True,
                          timeout=timeout, cwd=kwargs.pop("cwd", REPO), **kwargs)


def process_tree_gone(pid: int) -> bool:
    """True when no process of the session started by `pid` is left."""
    import psutil

    for proc in psutil.process_iter(["pid"]):
        try:
            if os.getsid(proc.info["pid"]) == pid:
                return False
        except (ProcessLookupError, PermissionError):
            continue
    return True


def kill_session(pid: int) -> None:
    try:
        os.killpg(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
