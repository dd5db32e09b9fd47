import atexit
import os
import shutil
import sys
import tempfile
from collections import Counter
from pathlib import Path

import pytest

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
# The decoded-image cache of every run started by the tests (in-process or as subprocesses) goes here, not ~/.cache.
os.environ["XDG_CACHE_HOME"] = tempfile.mkdtemp(prefix="traindeck-test-cache-")
atexit.register(shutil.rmtree, os.environ["XDG_CACHE_HOME"], ignore_errors=True)
# ... and the user's settings (the trust list of own model code among them), not ~/.config.
os.environ["XDG_CONFIG_HOME"] = tempfile.mkdtemp(prefix="traindeck-test-config-")
atexit.register(shutil.rmtree, os.environ["XDG_CONFIG_HOME"], ignore_errors=True)

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
pytest_plugins = ["suite_guard"]  # a timeout reaches a test waiting in Qt; a dead worker never stalls the session


def pytest_configure(config):
    """torch's threads (OMP_NUM_THREADS, unless set): with `-n 2` (pytest-xdist, the README's command) each worker's
    share of the cores, so two workers' training does not oversubscribe them (two threads each on two cores made every
    step wait). Decided here, in the process that starts the workers, before they inherit its environment."""
    workers = config.getoption("numprocesses", None)
    workers = workers if isinstance(workers, int) and workers > 0 else 1
    os.environ.setdefault("OMP_NUM_THREADS", str(max(1, min(2, (os.cpu_count() or 1) // workers))))
    if not hasattr(config, "workerinput"):
        # TrainDeck's own modules compiled once, before the ~330 `main.py` processes the suite starts: where
        # PYTHONDONTWRITEBYTECODE is set (this machine's environment), each process compiled them again
        import compileall

        for package in ("trainer", "app"):
            compileall.compile_dir(REPO / package, quiet=1)


# The modules whose tests take the one-node test cluster for themselves (the `slurm` fixture's lock): one unit of work,
# so they run one after another on one worker while the other works on, instead of a worker waiting on the lock.
ONE_CLUSTER = ("tests/remote/test_slurm_runs.py", "tests/remote/test_slurm_requeue.py", "tests/app/test_remote_app.py")


def unit_of(nodeid: str) -> str:
    """The unit of work a test belongs to: its module, or the modules that share the test cluster."""
    module = nodeid.split("::")[0]
    return "the test cluster's modules" if module in ONE_CLUSTER else module


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config, items):
    """The units with the most slow tests first (`--dist loadfile --no-loadscope-reorder`: each module, or the test
    cluster's modules together, one unit of work for a worker, in this order), so the long ones start early and the
    two workers end together."""
    unit = {item: unit_of(item.nodeid) for item in items}
    slow = Counter(unit[item] for item in items if item.get_closest_marker("slow"))
    items.sort(key=lambda item: -slow[unit[item]])


def pytest_xdist_make_scheduler(config, log):
    """xdist's loadfile scheduling, with the test cluster's modules one unit (`unit_of`)."""
    if config.getoption("dist") != "loadfile":
        return None  # another mode asked for: xdist's own
    from xdist.scheduler import LoadFileScheduling

    class Scheduling(LoadFileScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return unit_of(nodeid)

    return Scheduling(config, log)


@pytest.fixture(scope="session")
def shapes_dir(tmp_path_factory) -> Path:
    """A small generated ImageFolder (4 shape classes, 30 images each, 24 px)."""
    from trainer.data.demo_data import write_demo_dataset

    return write_demo_dataset(tmp_path_factory.mktemp("shapes") / "train", per_class=30, size=24, seed=1)


@pytest.fixture(scope="session")
def flipped_digits_run(tmp_path_factory, worker_id):
    """(run, flipped path -> the digit it shows, config, photo crops, copies): a short run on scikit-learn's 1,797
    real handwritten digits with 5% of them filed under another digit (the label errors the audit must find), four
    crops of a photograph among them (the outliers), 15 a class moved to a test folder and 30 of those copied back
    into training as exact, resized and JPEG copies (the leaks; copy -> (test image, kind)).

    Trained once for the whole run (`-n 2`: by the first worker to ask, the other waits on a lock); each worker gets
    its own copy of the run directory and config (the tests write the audit's files and the manifest there) beside a
    link to the one digits folder, which no test changes."""
    import json
    import shutil

    from filelock import FileLock

    from trainer.core.rundir import RunDir

    shared = tmp_path_factory.getbasetemp() if worker_id == "master" else tmp_path_factory.getbasetemp().parent
    made = shared / "flipped" / "made.json"
    with FileLock(str(shared / "flipped.lock")):
        if not made.exists():
            _train_flipped_digits(shared / "flipped")
    facts = json.loads(made.read_text())
    mine = tmp_path_factory.mktemp("flipped")
    (mine / "digits").symlink_to(shared / "flipped" / "digits")
    config = shutil.copy(shared / "flipped" / "config.yaml", mine / "config.yaml")
    run = shutil.copytree(shared / "flipped" / "runs" / facts["run"], mine / "runs" / facts["run"], symlinks=True)
    copies = {copy: tuple(of) for copy, of in facts["copies"].items()}
    return RunDir(run), facts["flipped"], Path(config), facts["crops"], copies


def _train_flipped_digits(tmp: Path) -> None:
    import json

    from helpers import digits_with_flipped_labels, photo_crops_among, split_off_test_with_copies, train_here, write_config

    flipped = digits_with_flipped_labels(tmp / "digits", 0.05)
    crops = photo_crops_among(tmp / "digits", 4)
    copies = split_off_test_with_copies(tmp / "digits", tmp / "test", per_class=15, copies=30, keep=flipped)
    config = write_config(tmp, tmp / "digits", data={"image_size": 32, "batch_size": 64, "test_dir": str(tmp / "test"),
                                                     # the network the audit's bounds were measured on (auto now
                                                     # crops digits from 80%: 51 outliers of 1,681, not under 50)
                                                     "augment": {"crop_scale_min": 0.6}},
                          optimizer={"name": "adamw", "lr": 0.003}, train={"epochs": 4, "seed": 0})
    run, code = train_here(config, tmp / "runs")
    assert code == 0, run.tail_log()
    (tmp / "made.json").write_text(json.dumps({"run": run.path.name, "flipped": flipped, "crops": crops,
                                               "copies": copies}))


@pytest.fixture
def torch_home(tmp_path, monkeypatch):
    """An empty torch hub cache (TORCH_HOME) for this test: pretrained weights are only what the test seeds there,
    under torchvision's own file names."""
    home = tmp_path / "torch_home"
    (home / "hub" / "checkpoints").mkdir(parents=True)
    monkeypatch.setenv("TORCH_HOME", str(home))
    return home


@pytest.fixture
def simulated(monkeypatch):
    """This test's trainers (here, in subprocesses, the app's, and on the test hosts, whose command passes it on)
    time their work on a simulated device (trainer/core/clock.py): 10 s per megapixel of training images, so a
    budget's decisions are the same on a busy machine as on a quiet one."""
    from helpers import simulated_device

    spec = simulated_device(10)
    monkeypatch.setenv("TRAINDECK_SIMULATED_DEVICE", spec)
    return spec


from remote_servers import hosts, slurm, slurm_started, sshd  # noqa: E402,F401 - real sshd and SLURM for the remote tests
