"""`data.augment: auto` (the defaults, issue #47) against augmentation off and the old fixed defaults (flip on, crops
from 60%), on the two cases where the fixed defaults lost: real handwritten digits (a mirrored 2 is another glyph) and
multi-label mosaics of them (a 60% crop cuts a tile out, and its label with it). Each is a real `main.py train`, so
what `auto` becomes is the trainer's own decision (its run_start says it).

- digits: scikit-learn's 1,797 digit scans at 32 px (bench/auto.py's split: train / val / test), resnet18, SGD 0.05,
  5 epochs, batch 64: the best validation top-1;
- mosaics: 1,500 2x2 mosaics of 2-4 digits (the tests' builder), small_cnn at 32 px, asl, 8 epochs: the best
  validation mAP.

python bench/augment_auto.py [--seeds 0 1 2] [--cases digits mosaics]
"""

import argparse
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import yaml
from common import REPO, machine, save_result

sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "tests"))
from auto import DATA, digits  # noqa: E402 - bench/auto.py's digit folders
from helpers import digit_mosaics  # noqa: E402 - the tests' own mosaic builder

from trainer.core.events import read_events  # noqa: E402

SETTINGS = {"auto (default)": {},
            "off": {"hflip": False, "random_resized_crop": False},
            "flip + crop 60% (old default)": {"hflip": True, "random_resized_crop": True, "crop_scale_min": 0.6}}


def train(raw: dict, folder: Path) -> tuple[float, list]:
    """The best validation figure of one run, and what its run_start says auto became."""
    config = folder / "config.yaml"
    config.write_text(yaml.safe_dump(raw))
    run = folder / "run"
    done = subprocess.run([sys.executable, str(REPO / "main.py"), "train", str(config), "--run-dir", str(run)],
                          capture_output=True, text=True, cwd=REPO)
    if done.returncode != 0:
        raise RuntimeError(done.stderr[-3000:])
    events = read_events(run / "events.jsonl")
    start = next(e for e in events if e["event"] == "run_start")
    metric = "val_map" if raw["data"].get("labels") else "val_acc"
    return max(e[metric] for e in events if e["event"] == "epoch"), start.get("augment", [])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--cases", nargs="+", choices=("digits", "mosaics"), default=["digits", "mosaics"])
    parser.add_argument("--settings", nargs="+", choices=[s.split()[0] for s in SETTINGS],
                        default=[s.split()[0] for s in SETTINGS], help="the rows to measure (the first word of each)")
    args = parser.parse_args()
    digit_folder = digits(DATA / "auto-digits")
    results = {"machine": machine(), "seeds": args.seeds, "rows": []}
    with tempfile.TemporaryDirectory(prefix="bench-augment-") as tmp:
        labels = digit_mosaics(Path(tmp) / "mosaics", 1500)
        cases = {
            "digits (val top-1)": {
                "data": {"train_dir": str(digit_folder / "train"), "val_dir": str(digit_folder / "val"),
                         "image_size": 32, "batch_size": 64, "num_workers": 0},
                "model": {"name": "resnet18"}, "optimizer": {"name": "sgd", "lr": 0.05}, "train": {"epochs": 5}},
            "mosaics (val mAP)": {
                "data": {"train_dir": str(labels.parent), "labels": str(labels), "image_size": 32, "batch_size": 32,
                         "num_workers": 0},
                "model": {"name": "small_cnn"}, "loss": {"name": "asl"}, "optimizer": {"name": "adamw", "lr": 0.003},
                "train": {"epochs": 8, "early_stop": {"metric": "val_map"}}}}
        for case, base in cases.items():
            if case.split()[0] not in args.cases:
                continue
            for setting, augment in SETTINGS.items():
                if setting.split()[0] not in args.settings:
                    continue
                scores, said = [], []
                for seed in args.seeds:
                    raw = yaml.safe_load(yaml.safe_dump(base))
                    raw["data"]["augment"] = dict(augment)
                    raw["train"]["seed"] = seed
                    folder = Path(tmp) / f"{case[:6]}-{setting[:4]}-{seed}"
                    folder.mkdir()
                    score, decided = train(raw, folder)
                    scores.append(score)
                    said = decided
                row = {"case": case, "setting": setting, "scores": scores, "median": statistics.median(scores),
                       "auto_became": said}
                results["rows"].append(row)
                became = "; ".join(f"{c['key'].rsplit('.', 1)[1]} {c['value']}" for c in said)
                print(f"{case:20} {setting:30} median {100 * row['median']:.1f}% "
                      f"({', '.join(f'{100 * s:.1f}' for s in scores)}){'  auto: ' + became if became else ''}",
                      flush=True)
    save_result("augment_auto" if len(args.cases) == 2 else f"augment_auto_{args.cases[0]}", results)


if __name__ == "__main__":
    main()
