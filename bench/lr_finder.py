"""Does the LR finder's suggestion train well? The old rule (a tenth of the lowest loss's rate) against the valley
rule (half-way along the loss's longest descent, fastai's default), in fp32 and in bf16 (on a CPU without native bf16
it is emulated: slower, the same arithmetic as a CPU with AVX-512 BF16).

For each precision: `main.py lr-find --json` on the config (SGD with momentum 0.9, small_cnn), then `main.py train` at
each rule's suggestion for the config's epochs; the best validation accuracy of each run.

python bench/lr_finder.py [--epochs 8] [--amp none bf16]
"""

import argparse
import json
import subprocess
import sys

import yaml
from common import REPO, machine, save_result, scratch, train_cli

from trainer.data.demo_data import write_demo_dataset


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--epochs", type=int, default=8)
    parser.add_argument("--amp", nargs="+", default=["none", "bf16"])
    args = parser.parse_args()
    work = scratch("td-lrf-")
    data = write_demo_dataset(work / "demo", per_class=150, size=32, seed=5)  # as tests/test_diagnostics.py
    config = work / "cfg.yaml"
    config.write_text(yaml.safe_dump({
        "data": {"train_dir": str(data), "image_size": 24, "batch_size": 32, "num_workers": 0},
        "model": {"name": "small_cnn"}, "optimizer": {"name": "sgd", "lr": 1e-5},
        "train": {"epochs": args.epochs, "seed": 0}, "monitor": {"log_every": 10}}))
    rows = []
    for amp in args.amp:
        found = subprocess.run([sys.executable, str(REPO / "main.py"), "lr-find", str(config), "--json",
                                "--set", f"train.amp={amp}"], capture_output=True, text=True, cwd=REPO, check=True)
        result = json.loads(found.stdout.strip().splitlines()[-1])
        rules = {"a tenth of the lowest loss": result["min_loss_lr"] / 10, "valley": result["suggested_lr"]}
        for rule, lr in rules.items():
            run = train_cli(config, work / f"{amp}-{rule[:6]}", [f"train.amp={amp}", f"optimizer.lr={lr:.3g}"])
            rows.append({"amp": amp, "rule": rule, "lr": float(f"{lr:.3g}"), "best_acc": run["best_acc"],
                         "wall_s": round(run["wall_s"], 1), "why": result["why"]})
            print(json.dumps(rows[-1]), flush=True)
    print(f"\nmachine: {machine()}\nsmall_cnn, SGD momentum 0.9, {args.epochs} epochs, 600 images at 24 px\n")
    print("| precision | rule | suggested lr | best val acc |\n|---|---|---|---|")
    for r in rows:
        print(f"| {r['amp']} | {r['rule']} | {r['lr']:.3g} | {100 * r['best_acc']:.1f}% |")
    save_result("lr_finder", {"machine": machine(), "epochs": args.epochs, "rows": rows})


if __name__ == "__main__":
    main()
