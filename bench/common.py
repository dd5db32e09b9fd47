"""Shared by the benchmarks: generated datasets, the plain loop a user would write, timing helpers."""

from __future__ import annotations

import atexit
import json
import os
import platform
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parent.parent
# The optimizer of every benchmark run, plain loop and trainer alike: resnet18 from scratch learns the generated
# data with it in a few epochs (SGD at lr 0.05 stayed near chance), so final accuracies mean something.
BENCH_OPTIMIZER = {"name": "adamw", "lr": 0.002, "weight_decay": 0.05}
sys.path.insert(0, str(REPO))


def scratch(prefix: str) -> Path:
    """A temporary folder for one benchmark's runs and data, removed when the benchmark exits (the GPU smoke run's
    checkpoints alone are 1.6 GB)."""
    work = Path(tempfile.mkdtemp(prefix=prefix))
    atexit.register(shutil.rmtree, work, ignore_errors=True)
    return work


def machine() -> str:
    import torch

    cpu = "unknown CPU"
    try:
        cpu = next(line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo") if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "no GPU"
    return (f"{cpu}, {os.cpu_count()} cores, {gpu}; Python {platform.python_version()}, torch {torch.__version__}")


def photo_dataset(root: Path, per_class: int = 150, classes: int = 4, size=(400, 300), seed: int = 0) -> Path:
    """Photo-like JPEGs (smooth gradients, blobs and noise), decode-heavy: the class is the blob shape."""
    from PIL import Image

    from trainer.data.demo_data import CLASSES, draw_shape

    if (root / ".done").exists():
        return root
    rng = np.random.default_rng(seed)
    for c in CLASSES[:classes]:
        (root / c).mkdir(parents=True, exist_ok=True)
        for i in range(per_class):
            shape = draw_shape(c, 96, rng).resize(size, Image.Resampling.BILINEAR)
            arr = np.asarray(shape, dtype=np.int16) + rng.normal(0, 8, (size[1], size[0], 3)).astype(np.int16)
            Image.fromarray(np.clip(arr, 0, 255).astype(np.uint8)).save(root / c / f"{i:04d}.jpg", quality=90)
    (root / ".done").write_text("")
    return root


def small_dataset(root: Path, per_class: int = 300) -> Path:
    from trainer.data.demo_data import write_demo_dataset

    if not (root / ".done").exists():
        write_demo_dataset(root, per_class=per_class, size=32, seed=1)
        (root / ".done").write_text("")
    return root


def bench_datasets() -> dict[str, tuple[Path, int]]:
    """The generated datasets of the speed and precision benchmarks: label -> (folder, training image size)."""
    return {"photos 400x300 JPEG @64px": (photo_dataset(REPO / "bench" / ".data" / "photos"), 64),
            "small PNG @32px": (small_dataset(REPO / "bench" / ".data" / "shapes"), 32)}


def bench_config(path: Path, data: Path, size: int, model: str, batch: int, epochs: int) -> Path:
    """A `main.py train` config for a benchmark run: the benchmark optimizer, TrainDeck defaults for the rest."""
    import yaml

    path.write_text(yaml.safe_dump({"data": {"train_dir": str(data), "image_size": size, "batch_size": batch},
                                    "model": {"name": model}, "train": {"epochs": epochs},
                                    "optimizer": BENCH_OPTIMIZER}))
    return path


def run_json(args: list[str], timeout: int = 1800) -> dict:
    """Run a python snippet/script that prints one JSON line last; return it."""
    out = subprocess.run([sys.executable, *args], capture_output=True, text=True, cwd=REPO, timeout=timeout)
    if out.returncode != 0:
        raise RuntimeError(out.stderr[-3000:])
    return json.loads(out.stdout.strip().splitlines()[-1])


def train_cli(config: Path, run_dir: Path, sets: list[str]) -> dict:
    """`main.py train` end to end; wall time, and the run's own numbers from its events."""
    from trainer.core.events import read_events

    start = time.perf_counter()
    out = subprocess.run([sys.executable, str(REPO / "main.py"), "train", str(config), "--run-dir", str(run_dir),
                          *(["--set", *sets] if sets else [])], capture_output=True, text=True, cwd=REPO)
    wall = time.perf_counter() - start
    if out.returncode != 0:
        raise RuntimeError(out.stderr[-3000:])
    events = read_events(run_dir / "events.jsonl")
    steps = [e["images_per_s"] for e in events if e["event"] == "step"]
    epochs = [e for e in events if e["event"] == "epoch"]
    start_ev = next(e for e in events if e["event"] == "run_start")
    end_ev = next(e for e in events if e["event"] == "run_end")
    return {"wall_s": wall, "training_s": end_ev["time"] - start_ev["time"],
            "step_images_per_s": statistics.median(steps[len(steps) // 4:]) if steps else None,
            "final_acc": epochs[-1]["val_acc"], "best_acc": max(e["val_acc"] for e in epochs),
            "train_images": start_ev["train_size"] * len(epochs),
            "precision": start_ev["precision"], "memory_format": start_ev["memory_format"], "cache": start_ev["cache"]}


def median_spread(values: list[float]) -> str:
    med = statistics.median(values)
    return f"{med:.0f} ({min(values):.0f}–{max(values):.0f})"


def save_result(name: str, data: dict) -> Path:
    """Keep a benchmark's raw numbers in bench/results/NAME.json (read by bench/plots.py)."""
    path = REPO / "bench" / "results" / f"{name}.json"
    path.parent.mkdir(exist_ok=True)
    path.write_text(json.dumps(data, indent=1))
    print(f"raw numbers: {path}")
    return path


def trainer_loop(raw: dict, prefix: str):
    """The trainer's own Loop for `raw` (a config as a dict), built in this process as `main.py train` builds it,
    with its events in a temporary run directory: (cfg, parts, loop)."""
    import yaml

    from trainer.core.config import load_config
    from trainer.core.rundir import RunDir
    from trainer.device.strategy import make_strategy
    from trainer.train.engine import StopRequest, seed_everything
    from trainer.train.loop import Loop
    from trainer.train.parts import build
    from trainer.train.reporter import reporter_for

    work = scratch(prefix)
    (work / "cfg.yaml").write_text(yaml.safe_dump(raw))
    cfg = load_config(work / "cfg.yaml")
    run = RunDir(work / "run").create()
    strategy = make_strategy(cfg)
    reporter = reporter_for(run.events, True, cfg.monitor.system_every_s)
    seed_everything(cfg.train.seed)
    parts = build(cfg, strategy, reporter, should_stop=lambda: False)
    return cfg, parts, Loop(run, cfg, strategy, parts, reporter, StopRequest())


SCIKIT_IMAGE_PHOTOS = ("astronaut", "chelsea", "coffee", "rocket")  # shipped in scikit-image's wheel
SCIKIT_LEARN_PHOTOS = ("china", "flower")
MORE_PHOTOS = ("brick", "grass", "gravel", "hubble_deep_field", "immunohistochemistry", "retina")  # scikit-image's too


def photographs(names=SCIKIT_IMAGE_PHOTOS + SCIKIT_LEARN_PHOTOS) -> dict:
    """Real photographs that come with scikit-image and scikit-learn (no download), as RGB arrays."""
    from skimage import data as sk

    out = {}
    for name in names:
        if name in SCIKIT_LEARN_PHOTOS:
            from sklearn.datasets import load_sample_image

            out[name] = load_sample_image(f"{name}.jpg")
        else:
            out[name] = getattr(sk, name)()
    return {k: np.asarray(v)[..., :3] if np.asarray(v).ndim == 3 else np.stack([np.asarray(v)] * 3, axis=-1)
            for k, v in out.items()}  # grey photographs as RGB


def _band_crops(root: Path, per_class: tuple[int, int, int], seed: int, names, cut) -> Path:
    """One class per photograph, the splits (train, val, test folders) from separate vertical bands of each
    photograph, so the test images are regions never trained on; `cut(photo, rng, x0, x1, path)` writes one image of
    the band x0..x1 to `path`."""
    from PIL import Image

    if (root / ".done").exists():
        return root
    rng = random.Random(seed)
    bands = {"train": (0.0, 0.55), "val": (0.55, 0.72), "test": (0.72, 1.0)}
    for name, pixels in photographs(names).items():
        w = pixels.shape[1]
        photo = Image.fromarray(pixels)
        for (split, (lo, hi)), count in zip(bands.items(), per_class):
            folder = root / split / name
            folder.mkdir(parents=True, exist_ok=True)
            for i in range(count):
                cut(photo, rng, int(lo * w), int(hi * w), folder / f"{i:04d}.jpg")
    (root / ".done").write_text("")
    return root


def photos(root: Path, per_class=(120, 30, 50), seed: int = 0, names=SCIKIT_IMAGE_PHOTOS + SCIKIT_LEARN_PHOTOS) -> Path:
    """Crops (56-96 px, saved at 96 px) of real photographs, by band (`_band_crops`)."""
    from PIL import Image

    def cut(photo, rng, x0, x1, path):
        side = rng.randint(56, min(96, x1 - x0, photo.height))
        x = rng.randint(x0, x1 - side)
        y = rng.randint(0, photo.height - side)
        photo.crop((x, y, x + side, y + side)).resize((96, 96), Image.BILINEAR).save(path, quality=92)

    return _band_crops(root, per_class, seed, names, cut)


def photo_jpegs(root: Path, per_class=(300, 40, 40), seed: int = 0, names=SCIKIT_IMAGE_PHOTOS) -> Path:
    """Colour JPEGs of mixed sizes (200x150 to 640x480, landscape and portrait, quality 80-95) cut from real
    photographs, by band (`_band_crops`): what a user's folder of camera pictures looks like to the trainer (#68)."""
    from PIL import Image

    def cut(photo, rng, x0, x1, path):
        side = rng.randint(min(64, x1 - x0), min(x1 - x0, photo.height))
        x, y = rng.randint(x0, x1 - side), rng.randint(0, photo.height - side)
        long = rng.randint(200, 640)
        size = (long, long * 3 // 4) if rng.random() < 0.7 else (long * 3 // 4, long)
        photo.crop((x, y, x + side, y + side)).resize(size, Image.BILINEAR).save(path, quality=rng.randint(80, 95))

    return _band_crops(root, per_class, seed, names, cut)
