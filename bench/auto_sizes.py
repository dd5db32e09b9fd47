"""A user's own run of one network at one size on the photo JPEGs (issue #68): `main.py train` with a 1.7-minute
train.budget (2 minutes less a planning's share), the test set and export inside it (train.finish_images), one-cycle
AdamW; its test top-1. What Auto's size floor was chosen by (docs/benchmarks.md, "Auto keeps its promise").

    python bench/auto_sizes.py resnet9@96 resnet9@128 resnet18@96
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml
from auto import DATA
from common import REPO, photo_jpegs


def run(name: str, size: int, folder: Path) -> str:
    with tempfile.TemporaryDirectory(prefix=f"bench-auto-sizes-{name}-{size}-") as tmp:
        work = Path(tmp)
        raw = {"model": {"name": name},
               "data": {"image_size": size, "batch_size": 64 if size <= 96 else 32, "train_dir": str(folder / "train"),
                        "val_dir": str(folder / "val"), "test_dir": str(folder / "test"),
                        "augment": {"hflip": False, "random_resized_crop": True, "crop_scale_min": 0.5}},
               "optimizer": {"name": "adamw", "lr": 0.002, "weight_decay": 0.05, "norm_weight_decay": 0.0},
               "scheduler": {"name": "onecycle"}, "loss": {"label_smoothing": 0.1},
               "train": {"epochs": 10, "replan": True, "budget": 1.7, "finish_images": 4000},
               "export": {"formats": ["onnx"]}}
        (work / "config.yaml").write_text(yaml.safe_dump(raw))
        start = time.time()
        done = subprocess.run([sys.executable, str(REPO / "main.py"), "train", str(work / "config.yaml"), "--runs-dir",
                               str(work / "runs")], capture_output=True, text=True, cwd=REPO)
        wall = time.time() - start
        if done.returncode:
            return f"{name}@{size}: failed: {done.stderr.strip().splitlines()[-1:]}"
        (run_dir,) = (work / "runs").iterdir()
        test = json.loads((run_dir / "eval" / "test" / "metrics.json").read_text())["accuracy"]
        status = json.loads((run_dir / "status.json").read_text())
        return (f"{name}@{size}: test {100 * test:.1f}%, {status.get('epoch')} epochs, best val "
                f"{100 * (status.get('best_acc') or 0):.1f}%, wall {wall:.0f} s")


def main() -> None:
    folder = photo_jpegs(DATA / "photo_jpegs")
    for item in sys.argv[1:]:
        name, _, size = item.partition("@")
        print(run(name, int(size), folder), flush=True)


if __name__ == "__main__":
    main()
