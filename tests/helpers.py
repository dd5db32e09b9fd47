"""Helpers shared by the tests: configs, running main.py, in-process training, process checks."""

import atexit
import logging
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import yaml

from trainer.core.config import load_config, save_config
from trainer.core.events import read_events
from trainer.core.rundir import RunDir, new_run_dir

REPO = Path(__file__).resolve().parent.parent


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


def run_here(*args, env=None, cwd=None, **_ignored) -> subprocess.CompletedProcess:
    """`main.py ARGS` in this process (what `run_main` does, without paying 3-6 s of interpreter and imports):
    for the commands whose answer a subprocess proves nothing more about (refusals, describe, queue edits, short
    in-process runs). The exit code, and what the command printed to stdout and stderr (its log lines included)."""
    from trainer import cli
    from trainer.runs.resident import run_captured

    code, out, err = run_captured(cli.main, list(args), env, cwd, echo_log=True)
    return subprocess.CompletedProcess(list(args), code, out, err)


def process_tree_gone(pid: int, also=()) -> bool:
    """True when no process of the session started by `pid` is left, nor any of the processes `also`.

    Zombies (exited, waiting to be reaped by a parent that may be a container's PID 1) do not count.
    """
    import psutil

    def alive(p: psutil.Process) -> bool:
        try:
            return p.is_running() and p.status() != psutil.STATUS_ZOMBIE
        except psutil.Error:
            return False

    if any(alive(p) for p in also):
        return False
    for proc in psutil.process_iter(["pid"]):
        try:
            if os.getsid(proc.info["pid"]) == pid and alive(proc):
                return False
        except (ProcessLookupError, PermissionError):
            continue
    return True


def kill_session(pid: int) -> None:
    try:
        os.killpg(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def train_here(config_path: Path, runs_dir: Path, overrides=None, run: RunDir | None = None,
               resume: bool = False) -> tuple[RunDir, int]:
    from trainer.runs.runner import launch

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


POISONED_MODEL = """
import os
import torch
from torch import nn

class Net(nn.Module):
    '''A small net that turns {what} to {value} on training steps {steps}{on_rank}.'''

    def __init__(self, num_classes):
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3)
        self.head = nn.Linear(8, num_classes)
        self.calls = 0
        if {poison_grad}:
            self.head.weight.register_hook(lambda g: torch.full_like(g, float("{value}")) if self.poisoned() else g)

    def poisoned(self):
        return self.calls in {steps} and os.environ.get("RANK", "0") in {ranks}

    def forward(self, x):
        if self.training:
            self.calls += 1
        out = self.head(self.conv(x).relu().mean((2, 3)))
        if not {poison_grad} and self.training and self.poisoned():
            out = out * float("{value}")
        return out
"""


def simulated_device(s_per_mpixel: float | dict = 25.0, **more) -> str:
    """TRAINDECK_SIMULATED_DEVICE for a test (trainer/core/clock.py): the trainer's clock moves by what its work would
    cost on that device (seconds per megapixel of a training image, by network or "*"), not by this machine's
    seconds, so every decision it takes from time (budget, re-plan, annealing, Auto's probe) is the same here busy
    or quiet."""
    import json

    rates = s_per_mpixel if isinstance(s_per_mpixel, dict) else {"*": s_per_mpixel}
    return json.dumps({"s_per_mpixel": rates, **more})


def trusted_model(path: Path, source: str, cls: str = "Net") -> str:
    """Your own model file, written and trusted as `--model-code` or the app's Own model file… trusts it; its
    model.name."""
    from trainer.core.user_code import grant

    path.write_text(source)
    return grant(f"{path}:{cls}")


def poisoned_model(folder: Path, value: str, steps: tuple[int, ...], where: str = "grad",
                   rank: int | None = None) -> str:
    """A model file whose head's gradient (where='grad') or logits (where='output') become `value` ('nan', 'inf')
    on the given training steps (counted from 1), on every rank or only on `rank`; returns its model.name."""
    ranks = ("0", "1", "2", "3") if rank is None else (str(rank),)
    source = POISONED_MODEL.format(what="the head's gradient" if where == "grad" else "the logits", value=value,
                                   steps=tuple(steps), on_rank="" if rank is None else f" on rank {rank} only",
                                   poison_grad=where == "grad", ranks=ranks)
    return trusted_model(folder / "net.py", source)


def build_parts(config_path: Path, overrides=None):
    """(cfg, parts): what a run of the config trains with, built in this process as the trainer builds it."""
    import tempfile

    from trainer.device.strategy import make_strategy
    from trainer.train.engine import seed_everything
    from trainer.train.parts import build
    from trainer.train.reporter import reporter_for

    cfg = load_config(config_path, overrides)
    run = RunDir(Path(tempfile.mkdtemp(prefix="traindeck-parts-"))).create()
    atexit.register(shutil.rmtree, run.path, ignore_errors=True)
    strategy = make_strategy(cfg)
    seed_everything(cfg.train.seed)
    return cfg, build(cfg, strategy, reporter_for(run.events, True, cfg.monitor.system_every_s), lambda: False)


def wait_for_event(run_dir: Path, predicate, timeout: float = 120, proc: subprocess.Popen | None = None) -> dict:
    """The first event of the run in `run_dir` that `predicate` accepts, as the trainer writes it. A hang guard:
    TimeoutError after `timeout` s; with `proc`, its stderr as soon as it exits without one."""
    import time

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if (run_dir / "events.jsonl").exists():
            for e in read_events(run_dir / "events.jsonl"):
                if predicate(e):
                    return e
        if proc is not None and proc.poll() is not None:
            raise AssertionError(f"the trainer exited ({proc.returncode}) first: {proc.communicate()[1][-2000:]}")
        time.sleep(0.05)
    raise TimeoutError(f"no matching event in {run_dir} in {timeout:g} s")


def digits_with_flipped_labels(root, share: float, seed: int = 0) -> dict[str, str]:
    """scikit-learn's 1,797 handwritten digits as 32 px PNGs in root/DIGIT/, `share` of them filed under another
    digit; the path of each of those -> the digit it shows."""
    import random

    from PIL import Image
    from sklearn.datasets import load_digits

    digits = load_digits()
    rng = random.Random(seed)
    flipped = set(rng.sample(range(len(digits.target)), round(share * len(digits.target))))
    paths = {}
    for i, (pixels, label) in enumerate(zip(digits.images, digits.target)):
        filed = rng.choice([d for d in range(10) if d != label]) if i in flipped else int(label)
        folder = root / str(filed)
        folder.mkdir(parents=True, exist_ok=True)
        path = folder / f"{i:04d}.png"
        Image.fromarray((pixels * 255 / 16).astype("uint8")).resize((32, 32), Image.BILINEAR).convert("RGB").save(path)
        if i in flipped:
            paths[str(path)] = str(label)
    return paths


class OtherPrograms:
    """`count` processes spinning on the CPU that are not this process's children (another program busy on the
    machine, which a process's own live children are not): started through a shell that leaves them behind."""

    def __init__(self, count: int):
        self.count, self.pids = count, []

    def __enter__(self) -> "OtherPrograms":
        for _ in range(self.count):
            out = subprocess.run(["sh", "-c", f"{sys.executable} -c 'while True: pass' >/dev/null 2>&1 & echo $!"],
                                 capture_output=True, text=True, check=True).stdout
            self.pids.append(int(out.strip()))
        return self

    def __exit__(self, *exc) -> None:
        for pid in self.pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


def photo_crops_among(root, count: int) -> list[str]:
    """`count` 32 px crops of a real photograph (scikit-image's astronaut), one into each of the first class folders
    of `root`: images like none of the others; their paths."""
    from PIL import Image
    from skimage import data

    photo = Image.fromarray(data.astronaut())
    folders = sorted(p for p in root.iterdir() if p.is_dir())
    paths = []
    for i, folder in enumerate(folders[:count]):
        path = folder / f"photo-{i}.png"
        photo.crop((100 * i, 50, 100 * i + 200, 250)).resize((32, 32), Image.BILINEAR).save(path)
        paths.append(str(path))
    return paths


def split_off_test_with_copies(root, test_root, per_class: int, copies: int, keep=(), seed: int = 0) -> dict[str, tuple]:
    """Moves `per_class` images of each class folder of `root` (none of `keep`) into test_root/CLASS/, then copies
    `copies` of those back into `root`'s class folders in turn as exact copies, resized copies (45 px, bicubic) and
    JPEG copies (quality 60): leaks the audit must find. Each copy's path -> (the test image, its kind)."""
    import random

    from PIL import Image

    rng = random.Random(seed)
    tests = []
    for folder in sorted(p for p in root.iterdir() if p.is_dir()):
        files = sorted(p for p in folder.iterdir() if p.suffix == ".png" and str(p) not in keep)
        (test_root / folder.name).mkdir(parents=True, exist_ok=True)
        for path in rng.sample(files, per_class):
            tests.append(Path(shutil.move(path, test_root / folder.name / path.name)))
    made = {}
    for i, source in enumerate(rng.sample(tests, copies)):
        kind = ("exact", "resized", "jpeg")[i % 3]
        copy = root / source.parent.name / f"copy-{kind}-{source.stem}{'.jpg' if kind == 'jpeg' else '.png'}"
        if kind == "exact":
            shutil.copyfile(source, copy)
        else:
            image = Image.open(source).convert("RGB")
            (image.resize((45, 45), Image.BICUBIC) if kind == "resized" else image).save(copy, quality=60)
        made[str(copy)] = (str(source), kind)
    return made


def digit_mosaics(root, count: int, seed: int = 0, cell: int = 16, digits_per_image: tuple[int, int] = (2, 4)) -> Path:
    """`count` multi-label images from scikit-learn's real handwritten digits: each a 2x2 grid of `cell` px cells
    holding 2-4 digits (`digits_per_image`; the other cells black), its labels the set of digits shown, in
    root/images/ with root/labels.csv (`file,labels`, `;` between labels); the labels file's path."""
    import random

    from PIL import Image
    from sklearn.datasets import load_digits

    digits = load_digits()
    by_digit: dict[int, list[int]] = {}
    for i, d in enumerate(digits.target):
        by_digit.setdefault(int(d), []).append(i)
    rng = random.Random(seed)
    (root / "images").mkdir(parents=True, exist_ok=True)
    lines = ["file,labels"]
    for n in range(count):
        shown = rng.sample(range(10), rng.randint(*digits_per_image))
        canvas = Image.new("L", (2 * cell, 2 * cell))
        for place, digit in zip(rng.sample(range(4), len(shown)), shown):
            pixels = digits.images[rng.choice(by_digit[digit])] * 255 / 16
            tile = Image.fromarray(pixels.astype("uint8")).resize((cell, cell), Image.BILINEAR)
            canvas.paste(tile, ((place % 2) * cell, (place // 2) * cell))
        canvas.convert("RGB").save(root / "images" / f"{n:05d}.png")
        lines.append(f"images/{n:05d}.png,{';'.join(str(d) for d in sorted(shown))}")
    labels = root / "labels.csv"
    labels.write_text("\n".join(lines) + "\n")
    return labels


def plant_label_set_errors(labels_file, share: float, seed: int = 0, missing_only: bool = False) -> dict[str, dict]:
    """Rewrites a mosaics labels file (digit_mosaics) with `share` of its images given one wrong label (a digit shown
    replaced by one not shown) or one missing (a digit shown dropped; an image keeps at least one), alternately;
    `missing_only`: one missing each, drawn among the images of two digits or more.
    Each such image's real path -> {"kind", "true": its real label set, "given": the planted one} (sets as `3;7`)."""
    import random

    rng = random.Random(seed)
    lines = Path(labels_file).read_text().splitlines()
    rows = [line.split(",", 1) for line in lines[1:]]
    planted = {}
    pool = [i for i, row in enumerate(rows) if not missing_only or ";" in row[1]]
    for n, i in enumerate(sorted(rng.sample(pool, round(share * len(rows))))):
        true = sorted(int(d) for d in rows[i][1].split(";"))
        given = list(true)
        if not missing_only and (n % 2 == 0 or len(true) == 1):
            given[rng.randrange(len(given))] = rng.choice([d for d in range(10) if d not in true])
            kind = "wrong"
        else:
            given.remove(rng.choice(true))
            kind = "missing"
        rows[i][1] = ";".join(str(d) for d in sorted(given))
        path = os.path.realpath(Path(labels_file).parent / rows[i][0])
        planted[path] = {"kind": kind, "true": ";".join(map(str, true)), "given": rows[i][1]}
    Path(labels_file).write_text("\n".join([lines[0]] + [",".join(r) for r in rows]) + "\n")
    return planted


WIDE = (96, 48)  # the images' width x height


def wide_images(root, per_class: int, seed: int = 0):
    """Two classes told apart only at the images' ends: a bright disc in the left or the right quarter of a noisy
    96 x 48 px image (a square centre crop cuts both quarters off)."""
    import numpy as np
    from PIL import Image

    rng = np.random.default_rng(seed)
    yy, xx = np.mgrid[0:WIDE[1], 0:WIDE[0]]
    for name, centre in (("left", 12), ("right", 84)):
        (root / name).mkdir(parents=True)
        for i in range(per_class):
            pixels = rng.normal(90, 25, (WIDE[1], WIDE[0], 3))
            cx, cy = centre + rng.integers(-4, 5), 24 + rng.integers(-8, 9)
            pixels[(xx - cx) ** 2 + (yy - cy) ** 2 < 64] = 230
            Image.fromarray(pixels.clip(0, 255).astype(np.uint8)).save(root / name / f"{i:03d}.png")
    return root


def read_all(model) -> None:
    """Every event written so far taken in by the app's RunModel: one poll takes what fits its time budget, which on a
    busy machine is not all of it."""
    model.poll()
    while model.catching_up:
        model.poll()


# Runs an export's model-card snippet (its own lines, as a user would paste them) in a Python without TrainDeck.
ROUND_TRIP = r"""
import sys
import numpy as np, torch
snippet, batch_path, out_path, as_numpy = sys.argv[1:5]
x = torch.load(batch_path, weights_only=True)
if as_numpy == "1":
    x = x.numpy()
namespace = {"x": x}
exec(snippet, namespace)
logits = namespace.get("logits")
if logits is None:  # the weights-only snippets end with the model loaded
    with torch.no_grad():
        logits = namespace["model"](torch.as_tensor(x))
assert not any(m == "trainer" or m.startswith(("trainer.", "app")) for m in sys.modules), "TrainDeck was imported"
torch.save(torch.as_tensor(np.asarray(logits.detach() if hasattr(logits, "detach") else logits)), out_path)
"""
NUMPY_IN = ("onnx", "openvino", "litert")  # the export formats whose snippets take a numpy array


def run_card_snippet(out: Path, x, tmp_path: Path):
    """The logits of `x` (a tensor) from the card's Python snippet for `out`, run in a clean Python in the export's
    folder."""
    import json

    import torch

    card = json.loads(Path(f"{out}.json").read_text())
    (snippet,) = [code for consumer, code in card["load"].items() if "Python" in consumer and "macOS" not in consumer]
    torch.save(x, tmp_path / "x.pt")
    clean_env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    result = subprocess.run([sys.executable, "-c", ROUND_TRIP, snippet, str(tmp_path / "x.pt"), str(tmp_path / "y.pt"),
                             "1" if card["format"].startswith(NUMPY_IN) else "0"], capture_output=True, text=True,
                            cwd=out.parent, env=clean_env, timeout=180)
    assert result.returncode == 0, result.stderr[-3000:]
    return torch.load(tmp_path / "y.pt", weights_only=True)
