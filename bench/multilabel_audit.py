"""Label issues in multi-label data (issue #49): of the images a test gave one wrong or one missing label, how many
does `main.py audit` put at the top of its list, and does it suggest the planted change back?

    python bench/multilabel_audit.py [--seeds 0 1 2] [--share 0.05] [--epochs 8] [--busy 0 2]
    python bench/multilabel_audit.py --missing-only --images 3000 --loss asl   # issue #69's construct

1,500 2x2 mosaics of scikit-learn's real handwritten digits (2-4 a mosaic, its labels the digits shown; the tests'
builder), `share` of them given one wrong label (a digit shown replaced by one not shown) or one missing, alternately
(tests/helpers.py: plant_label_set_errors); a small_cnn run (32 px, AdamW 3e-3, bce, `epochs`, augmentation as auto
decides), then the audit: precision at the number planted (= recall there), precision and recall of the audit's whole
list, the share of planted images found whose suggested label set is the real one (and whose add/remove names the
planted label), and the audit's time. `--missing-only`: every planted error is one shown digit's label removed (issue
#69's construct: 3,000 mosaics, 150 planted, asl); `--busy N`: N spinning programs beside the run and the audit.
"""

from __future__ import annotations

import argparse
import csv
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml
from common import REPO, machine, save_result

sys.path.insert(0, str(REPO / "tests"))
from helpers import OtherPrograms, digit_mosaics, plant_label_set_errors  # noqa: E402 - the tests' own builders


def main_py(*args) -> float:
    start = time.perf_counter()
    done = subprocess.run([sys.executable, str(REPO / "main.py"), *map(str, args)], capture_output=True, text=True,
                          cwd=REPO)
    if done.returncode:
        raise SystemExit(f"main.py {' '.join(map(str, args))} failed:\n{done.stderr[-3000:]}")
    return time.perf_counter() - start


def one(share: float, epochs: int, seed: int, images: int = 1500, missing_only: bool = False, loss: str = "bce",
        busy: int = 0) -> dict:
    with tempfile.TemporaryDirectory(prefix="bench-ml-audit-") as tmp, OtherPrograms(busy):
        tmp = Path(tmp)
        labels = digit_mosaics(tmp / "mosaics", images, seed=seed)
        planted = plant_label_set_errors(labels, share, seed, missing_only=missing_only)
        config = tmp / "config.yaml"
        config.write_text(yaml.safe_dump({
            "data": {"train_dir": str(labels.parent), "labels": str(labels), "image_size": 32, "batch_size": 64,
                     "num_workers": 0},
            "model": {"name": "small_cnn"}, "loss": {"name": loss}, "optimizer": {"name": "adamw", "lr": 0.003},
            "train": {"epochs": epochs, "seed": seed, "early_stop": {"metric": "val_map"}}}))
        train_s = main_py("train", config, "--run-dir", tmp / "run")
        audit_s = main_py("audit", tmp / "run")
        rows = list(csv.DictReader((tmp / "run" / "audit" / "label_issues.csv").open()))
    return {"share": share, "epochs": epochs, "seed": seed, "images": images, "missing_only": missing_only,
            "loss": loss, "busy": busy, "train_s": train_s, "audit_s": audit_s, **score(rows, planted)}


def score(rows: list[dict], planted: dict[str, dict]) -> dict:
    """How the audit's list (label_issues.csv's rows, in order) found the planted label errors."""
    real = [os.path.realpath(r["path"]) for r in rows]
    top = set(real[:len(planted)])
    found = [(r, planted[p]) for r, p in zip(rows, real) if p in planted]

    def names_planted(row, plant) -> bool:
        true, given = set(plant["true"].split(";")), set(plant["given"].split(";"))
        add, remove = set(filter(None, row["add"].split(";"))), set(filter(None, row["remove"].split(";")))
        return bool(add & (true - given)) or bool(remove & (given - true))

    return {"planted": len(planted), "listed": len(rows),
            "precision_at_planted": len(top & set(planted)) / len(planted),
            "list_precision": len(found) / max(1, len(rows)), "list_recall": len(found) / len(planted),
            "suggestion_right": sum(r["suggested"] == p["true"] for r, p in found) / max(1, len(found)),
            "change_names_planted": sum(names_planted(r, p) for r, p in found) / max(1, len(found))}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--share", type=float, default=0.05)
    parser.add_argument("--epochs", type=int, default=8)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--images", type=int, default=1500)
    parser.add_argument("--missing-only", action="store_true", help="every planted error a label removed")
    parser.add_argument("--loss", default="bce", choices=("bce", "asl"))
    parser.add_argument("--busy", type=int, nargs="+", default=[0], help="spinning programs beside each run and audit")
    parser.add_argument("--name", default="multilabel_audit", help="the results file: bench/results/NAME.json")
    args = parser.parse_args()
    results = []
    for seed in args.seeds:
        for busy in args.busy:
            r = one(args.share, args.epochs, seed, args.images, args.missing_only, args.loss, busy)
            print(r, flush=True)
            results.append(r)
            save_result(args.name, {"machine": machine(), "results": results})
    print(f"\n{machine()}")
    print("| seed | busy | planted | precision at the number planted | the whole list: precision / recall | "
          "suggested set is the real one | change names the planted label | audit s |")
    print("|---|---|---|---|---|---|---|---|")
    for r in results:
        print(f"| {r['seed']} | {r['busy']} | {r['planted']} | {r['precision_at_planted']:.0%} | "
              f"{r['list_precision']:.0%} / {r['list_recall']:.0%} | {r['suggestion_right']:.0%} | "
              f"{r['change_names_planted']:.0%} | {r['audit_s']:.1f} |")


if __name__ == "__main__":
    main()
