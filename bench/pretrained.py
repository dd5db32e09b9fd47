"""From scratch, linear probe and fine-tuning from a pretrained backbone, side by side on the same small dataset.

No real ImageNet weights can be downloaded here, so the "pretrained" network is a stand-in, named as such: resnet18
pretrained by TrainDeck on one generated dataset (the drawn shapes), then trained on a different generated dataset
(drawn letters, few images per class). What this shows: the recipes work end to end through `main.py train` (local
weights file, head resized, frozen backbone, parameter groups), and how much a backbone that has learned edges and
blobs helps a small dataset. What it does not show: figures for ImageNet weights on real photos, where the gap to
training from scratch is usually far larger.

    .venv/bin/python bench/pretrained.py [--seeds 3] [--epochs 10]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import BENCH_OPTIMIZER, REPO, machine, save_result, small_dataset  # noqa: E402

from trainer.core.recipes import FINE_TUNE_BACKBONE_SHARE, apply_recipe  # noqa: E402

LETTERS = ("A", "E", "H", "K", "R")


def letters_dataset(root: Path, per_class: int = 100, size: int = 32, seed: int = 4) -> Path:
    """Letters drawn in a random colour, size, position and rotation over noise: a task unlike the shapes."""
    from PIL import Image, ImageDraw, ImageFont

    if (root / ".done").exists():
        return root
    rng = np.random.default_rng(seed)
    for letter in LETTERS:
        (root / letter).mkdir(parents=True, exist_ok=True)
        for i in range(per_class):
            big = size * 4
            background = tuple(int(v) for v in rng.integers(0, 110, 3))
            img = Image.new("RGB", (big, big), background)
            font = ImageFont.load_default(size=int(big * rng.uniform(0.45, 0.65)))
            draw = ImageDraw.Draw(img)
            x, y = rng.uniform(0.15, 0.35) * big, rng.uniform(0.05, 0.2) * big
            draw.text((x, y), letter, font=font, fill=tuple(int(v) for v in rng.integers(150, 256, 3)))
            img = img.rotate(rng.uniform(-30, 30), resample=Image.Resampling.BILINEAR, fillcolor=background)
            img = img.resize((size, size), Image.Resampling.BILINEAR)
            pixels = np.asarray(img, dtype=np.int16) + rng.normal(0, 12, (size, size, 3)).astype(np.int16)
            Image.fromarray(np.clip(pixels, 0, 255).astype(np.uint8)).save(root / letter / f"{i:04d}.png")
    (root / ".done").write_text("")
    return root


def train(config: dict, folder: Path, name: str) -> list[float]:
    """`main.py train` on `config`; validation accuracy per epoch."""
    import subprocess

    from trainer.core.events import read_events

    path = folder / f"{name}.yaml"
    path.write_text(yaml.safe_dump(config))
    run = folder / name
    out = subprocess.run([sys.executable, str(REPO / "main.py"), "train", str(path), "--run-dir", str(run)],
                         capture_output=True, text=True, cwd=REPO)
    if out.returncode != 0:
        raise RuntimeError(out.stderr[-3000:])
    return [e["val_acc"] for e in read_events(run / "events.jsonl") if e["event"] == "epoch"]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--epochs", type=int, default=12)
    parser.add_argument("--pretrain-epochs", type=int, default=8)
    args = parser.parse_args()
    data = REPO / "bench" / ".data"
    shapes = small_dataset(data / "shapes")
    letters = letters_dataset(data / "letters")
    base = {"data": {"image_size": 32, "batch_size": 16}, "model": {"name": "resnet18"},
            "optimizer": dict(BENCH_OPTIMIZER), "scheduler": {"name": "cosine"}, "monitor": {"grad_stats": False}}
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        started = time.perf_counter()
        weights = data / f"pretrained-shapes-{args.pretrain_epochs}.pt"  # the stand-in backbone, made once
        if not weights.exists():
            pre = train({**base, "data": {**base["data"], "train_dir": str(shapes)},
                         "train": {"epochs": args.pretrain_epochs}}, tmp, "pretrain")
            import shutil

            shutil.copy(tmp / "pretrain" / "checkpoints" / "best.pt", weights)
            (data / f"{weights.stem}.json").write_text(json.dumps({"val_acc": max(pre)}))
        pretrain_acc = json.loads((data / f"{weights.stem}.json").read_text())["val_acc"]
        print(f"pretrained resnet18 on the shapes: val_acc {pretrain_acc:.3f} ({time.perf_counter() - started:.0f} s)",
              flush=True)
        lr = BENCH_OPTIMIZER["lr"]
        start = {"model": {"weights": str(weights)}, "optimizer": {"lr": lr}}
        recipes = {  # the Optimizer page's recipes, applied by the same function (trainer.core.recipes)
            "from scratch": {},
            "linear probe": apply_recipe("linear_probe", start, "fc"),
            f"fine-tune (backbone at {FINE_TUNE_BACKBONE_SHARE:g}x lr)": apply_recipe("fine_tune", start, "fc"),
        }
        curves: dict[str, list[list[float]]] = {name: [] for name in recipes}
        for seed in range(args.seeds):  # interleaved: every recipe once per seed
            for name, extra in recipes.items():
                cfg = json.loads(json.dumps(base))
                cfg["data"]["train_dir"] = str(letters)
                cfg["train"] = {"epochs": args.epochs, "seed": seed}
                cfg["model"].update(extra.get("model", {}))
                cfg["optimizer"].update(extra.get("optimizer", {}))
                curves[name].append(train(cfg, tmp, f"{name.split()[0]}-{seed}"))
                print(f"seed {seed} {name}: " + " ".join(f"{a:.2f}" for a in curves[name][-1]), flush=True)

    def to_90(curve: list[float]) -> int | None:
        return next((i + 1 for i, a in enumerate(curve) if a >= 0.9), None)

    rows = {}
    for name, runs in curves.items():
        reached = [to_90(c) for c in runs]
        rows[name] = {"acc_1": statistics.median(c[0] for c in runs), "acc_3": statistics.median(c[2] for c in runs),
                      "acc_last": statistics.median(c[-1] for c in runs),
                      "epochs_to_90": statistics.median(r for r in reached) if all(reached) else None,
                      "reached_90": sum(1 for r in reached if r), "runs": len(runs), "curves": runs}
    result = {"machine": machine(), "command": "python bench/pretrained.py", "seeds": args.seeds,
              "epochs": args.epochs, "pretrain_val_acc": pretrain_acc, "target": f"letters {len(LETTERS)} classes, "
              f"100 images each (80 train / 20 val), 32 px, batch 16", "recipes": rows}
    lines = [f"{'recipe':34} {'acc@1':>6} {'acc@3':>6} {f'acc@{args.epochs}':>7} {'epochs to 90%':>14}"]
    for name, r in rows.items():
        to90 = f"{r['epochs_to_90']:.0f}" if r["epochs_to_90"] else f">{args.epochs} ({r['reached_90']}/{r['runs']})"
        lines.append(f"{name:34} {r['acc_1']:6.3f} {r['acc_3']:6.3f} {r['acc_last']:7.3f} {to90:>14}")
    text = "\n".join(lines)
    print(text)
    (REPO / "bench" / "results" / "pretrained.txt").write_text(f"{machine()}\n{text}\n")
    save_result("pretrained", result)


if __name__ == "__main__":
    main()
