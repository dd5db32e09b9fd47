"""Label errors (issue #35): how many of the labels a test flipped does `main.py audit` put at the top of its list?

    python bench/audit.py --shares 0.05 0.10 --epochs 4 12
    python bench/audit.py --shares 0.05 --epochs 4 --oof probe runs --name audit_oof

scikit-learn's 1,797 real handwritten digits (32 px PNGs), `share` of them filed under another digit (the test's own
helper, tests/helpers.py), a small_cnn run of `epochs` on them (AdamW 3e-3, batch 64, the folder's 20% validation
split), then the audit: precision at the number flipped (= recall there), precision and recall of cleanlab's whole
list, the share of flipped images found whose suggested label is the digit shown, and the audit's time (the first,
and the second that reuses the kept probabilities).
"""

from __future__ import annotations

import argparse
import csv
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml
from common import REPO, machine, save_result

sys.path.insert(0, str(REPO / "tests"))
from helpers import OtherPrograms, digits_with_flipped_labels  # noqa: E402 - the test's own folder builder


def main_py(*args) -> float:
    start = time.perf_counter()
    subprocess.run([sys.executable, str(REPO / "main.py"), *map(str, args)], check=True, capture_output=True,
                   cwd=REPO)
    return time.perf_counter() - start


def demo_with_flipped_labels(root: Path, share: float, seed: int) -> dict[str, str]:
    """The app's demo shapes (4 classes of 250, 48 px), `share` of them moved under another class; the path of each
    of those -> the class it shows."""
    import random

    from trainer.data.demo_data import CLASSES, write_demo_dataset

    write_demo_dataset(root, seed=seed)
    rng = random.Random(seed)
    images = sorted(root.glob("*/*.png"))
    flipped = {}
    for path in rng.sample(images, round(share * len(images))):
        shown = path.parent.name
        moved = root / rng.choice([c for c in CLASSES if c != shown]) / f"flipped-{path.name}"
        path.rename(moved)
        flipped[str(moved)] = shown
    return flipped


FOLDERS = {"digits": (digits_with_flipped_labels, 32), "demo": (demo_with_flipped_labels, 48)}


def one(share: float, epochs: int, seed: int, oof: str = "probe", data: str = "digits", busy: int = 0) -> dict:
    make, size = FOLDERS[data]
    with tempfile.TemporaryDirectory(prefix="bench-audit-") as tmp, OtherPrograms(busy):
        tmp = Path(tmp)
        flipped = make(tmp / data, share, seed)
        config = tmp / "config.yaml"
        config.write_text(yaml.safe_dump({
            "data": {"train_dir": str(tmp / data), "image_size": size, "batch_size": 64, "num_workers": 0},
            "model": {"name": "small_cnn"}, "optimizer": {"name": "adamw", "lr": 0.003},
            "train": {"epochs": epochs, "seed": seed}}))
        train_s = main_py("train", config, "--run-dir", tmp / "run")
        audit_s = main_py("audit", tmp / "run", "--oof", oof)
        again_s = main_py("audit", tmp / "run", "--oof", oof)
        rows = list(csv.DictReader((tmp / "run" / "audit" / "label_issues.csv").open()))
    flagged = [r for r in rows if r.get("flagged", "yes") == "yes"]  # cleanlab's list; then below the line
    listed = {r["path"] for r in flagged}
    top = {r["path"] for r in rows[:len(flipped)]}
    found = [r for r in rows if r["path"] in flipped]
    return {"data": data, "busy": busy, "share": share, "epochs": epochs, "seed": seed, "oof": oof,
            "flipped": len(flipped), "listed": len(flagged), "below_the_line": len(rows) - len(flagged),
            "precision_at_flipped": len(top & set(flipped)) / len(flipped),
            "list_precision": len(listed & set(flipped)) / max(1, len(listed)),
            "list_recall": len(listed & set(flipped)) / len(flipped),
            "suggestion_right": sum(r["suggested"] == flipped[r["path"]] for r in found) / max(1, len(found)),
            "train_s": train_s, "audit_s": audit_s, "audit_again_s": again_s}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--shares", type=float, nargs="+", default=[0.05, 0.10])
    parser.add_argument("--epochs", type=int, nargs="+", default=[4, 12])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--oof", nargs="+", default=["probe"], choices=("probe", "runs"),
                        help="where the out-of-sample probabilities come from (main.py audit --oof), side by side")
    parser.add_argument("--name", default="audit", help="the results file: bench/results/NAME.json")
    parser.add_argument("--data", nargs="+", default=["digits"], choices=sorted(FOLDERS))
    parser.add_argument("--busy", type=int, nargs="+", default=[0], help="spinning programs beside each run and audit")
    args = parser.parse_args()
    results = []
    for seed in args.seeds:
        for data in args.data:
            for busy in args.busy:
                for share in args.shares:
                    for epochs in args.epochs:
                        for oof in args.oof:
                            r = one(share, epochs, seed, oof, data, busy)
                            print(r, flush=True)
                            results.append(r)
                            save_result(args.name, {"machine": machine(), "results": results})
    print(f"\n{machine()}")
    print("| folder | busy | flipped | run epochs | out of sample | precision at the number flipped | cleanlab's list: "
          "precision / recall | suggestion right | audit s (again) |")
    print("|---|---|---|---|---|---|---|---|---|")
    import statistics as st

    for data, busy, share, epochs, oof in ((d, b, sh, e, o) for d in args.data for b in args.busy
                                           for sh in args.shares for e in args.epochs for o in args.oof):
        rs = [r for r in results if (r["data"], r["busy"], r["share"], r["epochs"], r["oof"]) ==
              (data, busy, share, epochs, oof)]
        if rs:
            def med(key: str, rs=rs) -> float:
                return st.median(r[key] for r in rs)

            print(f"| {data} | {busy} | {share:.0%} ({rs[0]['flipped']}) | {epochs} | {oof} | "
                  f"{med('precision_at_flipped'):.2f} "
                  f"({min(r['precision_at_flipped'] for r in rs):.2f}-{max(r['precision_at_flipped'] for r in rs):.2f})"
                  f" | {med('list_precision'):.2f} / {med('list_recall'):.2f} | {med('suggestion_right'):.2f} | "
                  f"{med('audit_s'):.1f} ({med('audit_again_s'):.1f}) |")


if __name__ == "__main__":
    main()
