"""Multi-label: does an asymmetric loss (Ridnik et al., ASL: gamma- 4, gamma+ 0, probability margin 0.05) beat binary
cross-entropy (TrainDeck's `bce`, also with `class_weights: auto`) on real images? Issue #36 asks for it "as an option
if it measurably helps".

    python bench/multilabel_loss.py --seeds 0 1 2 --epochs 8

Mosaics of scikit-learn's real handwritten digits (the tests' builder, tests/helpers.py `digit_mosaics`): "dense",
2-4 digits on each image (each label on ~30% of the images), and "sparse", 1-2 digits (~15%); 1,500 images each,
small_cnn at 32 px, AdamW 3e-3, batch 64, the trainer's own loop (bench/common.py `trainer_loop`): loss.name bce,
bce with class_weights auto, asl. Reported: the best epoch's validation mAP (macro) and the last epoch's, median of
the seeds, both losses on the same folders, seeds and epochs.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from pathlib import Path

from common import REPO, machine, save_result, trainer_loop

sys.path.insert(0, str(REPO / "tests"))
from helpers import digit_mosaics  # noqa: E402 - the tests' own folder builder


def one(labels: Path, loss: str, seed: int, epochs: int) -> dict:
    raw = {"data": {"train_dir": str(labels.parent), "labels": str(labels), "image_size": 32, "batch_size": 64,
                    "num_workers": 0},
           "model": {"name": "small_cnn"}, "loss": {"name": "bce"}, "optimizer": {"name": "adamw", "lr": 0.003},
           "train": {"epochs": epochs, "seed": seed, "early_stop": {"metric": "val_map"}}}
    if loss == "bce+weights":
        raw["loss"]["class_weights"] = "auto"  # each label's positives weighted by its negatives over its positives
    if loss == "asl":
        raw["loss"]["name"] = "asl"  # trainer.train.optim.AsymmetricLoss
    _, parts, loop = trainer_loop(raw, "td-ml-loss-")
    maps = []
    for _ in range(epochs):
        loop.train_one_epoch()
        loop.state.epoch += 1
        loop.state.batch_in_epoch = 0
        maps.append(loop.validation.evaluate(loop.state.epoch)["val_map"])
    return {"best": max(maps), "last": maps[-1]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--epochs", type=int, default=8)
    args = parser.parse_args()
    results = {"machine": machine(), "epochs": args.epochs, "seeds": args.seeds, "rows": []}
    with tempfile.TemporaryDirectory(prefix="bench-ml-loss-") as tmp:
        for name, per_image in (("dense", (2, 4)), ("sparse", (1, 2))):
            labels = digit_mosaics(Path(tmp) / name, 1500, digits_per_image=per_image)
            for loss in ("bce", "bce+weights", "asl"):
                runs = [one(labels, loss, seed, args.epochs) for seed in args.seeds]
                row = {"data": name, "loss": loss, "best": [r["best"] for r in runs], "last": [r["last"] for r in runs]}
                results["rows"].append(row)
                print(f"{name:6} {loss:11}: best val mAP median {100 * statistics.median(row['best']):.1f}% "
                      f"({', '.join(f'{100 * v:.1f}' for v in row['best'])}), last {100 * statistics.median(row['last']):.1f}%",
                      flush=True)
    save_result("multilabel_loss", results)


if __name__ == "__main__":
    main()
