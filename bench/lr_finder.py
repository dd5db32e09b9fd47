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


def sweep_speed(config, busy: int, repeat: int) -> dict:
    """Images per second of `main.py lr-find` (its points after the 20th, timed as they come) and of `main.py train`'s
    training steps (their `images_per_s`, the first quarter left out) on the same config, with `busy` CPU hogs beside both."""
    import time

    hogs = [subprocess.Popen(["yes"], stdout=subprocess.DEVNULL) for _ in range(busy)]
    try:
        started, times = time.perf_counter(), []
        proc = subprocess.Popen([sys.executable, str(REPO / "main.py"), "lr-find", str(config), "--json"],
                                stderr=subprocess.PIPE, stdout=subprocess.PIPE, text=True, cwd=REPO)
        for line in proc.stderr:
            if line.startswith("lr-find: point"):
                times.append(time.perf_counter())
        proc.wait()
        batch = yaml.safe_load(config.read_text())["data"]["batch_size"]
        sweep = batch * (len(times) - 21) / (times[-1] - times[20])
        run = train_cli(config, config.parent / f"speed-{busy}-{repeat}", ["train.epochs=4"])
        train = run["step_images_per_s"]  # its training steps' own measure, the first quarter left out
    finally:
        for hog in hogs:
            hog.kill()
    return {"busy": busy, "first_point_s": round(times[0] - started, 2), "sweep_images_per_s": round(sweep, 1),
            "train_images_per_s": round(train, 1), "ratio": round(sweep / train, 3), "wall_s": round(run["wall_s"], 1)}


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--epochs", type=int, default=8)
    parser.add_argument("--amp", nargs="+", default=["none", "bf16"])
    parser.add_argument("--speed", type=int, nargs="*", help="instead: the sweep's images/s against training's, "
                        "with this many busy loops (e.g. --speed 0 2)")
    parser.add_argument("--optimizer", default="sgd", choices=["sgd", "adamw"], help="sgd: with momentum 0.9")
    args = parser.parse_args()
    work = scratch("td-lrf-")
    data = write_demo_dataset(work / "demo", per_class=150, size=32, seed=5)  # as tests/test_diagnostics.py
    config = work / "cfg.yaml"
    config.write_text(yaml.safe_dump({
        "data": {"train_dir": str(data), "image_size": 24, "batch_size": 32, "num_workers": 0},
        "model": {"name": "small_cnn"}, "optimizer": {"name": args.optimizer, "lr": 1e-5},
        "train": {"epochs": args.epochs, "seed": 0}, "monitor": {"log_every": 10}}))
    if args.speed is not None:
        rows = [sweep_speed(config, busy, n) for n, busy in enumerate(args.speed)]
        for row in rows:
            print(json.dumps(row), flush=True)
        save_result("lr_finder_speed", {"machine": machine(), "optimizer": args.optimizer, "rows": rows})
        return
    rows = []
    for amp in args.amp:
        found = subprocess.run([sys.executable, str(REPO / "main.py"), "lr-find", str(config), "--json",
                                "--set", f"train.amp={amp}"], capture_output=True, text=True, cwd=REPO, check=True)
        result = json.loads(found.stdout.strip().splitlines()[-1])
        rules = {"a tenth of the lowest loss": result["min_loss_lr"] / 10, "a third of the lowest loss":
                 result["min_loss_lr"] / 3, "steepest descent": result["steepest_lr"], "valley": result["valley_lr"],
                 "suggested": result["suggested_lr"]}
        if result["suggested_lr"]:
            rules["a tenth of the suggested"] = result["suggested_lr"] / 10
        rules = {rule: lr for rule, lr in rules.items() if lr}
        for rule, lr in rules.items():
            run = train_cli(config, work / f"{amp}-{rule.replace(' ', '-')}", [f"train.amp={amp}", f"optimizer.lr={lr:.3g}"])
            rows.append({"amp": amp, "optimizer": args.optimizer, "rule": rule, "lr": float(f"{lr:.3g}"),
                         "best_acc": run["best_acc"], "wall_s": round(run["wall_s"], 1), "why": result["why"]})
            print(json.dumps(rows[-1]), flush=True)
    momentum = " (momentum 0.9)" if args.optimizer == "sgd" else ""
    print(f"\nmachine: {machine()}\nsmall_cnn, {args.optimizer}{momentum}, {args.epochs} epochs, 600 images at 24 px\n")
    print("| precision | rule | suggested lr | best val acc |\n|---|---|---|---|")
    for r in rows:
        print(f"| {r['amp']} | {r['rule']} | {r['lr']:.3g} | {100 * r['best_acc']:.1f}% |")
    save_result(f"lr_finder_{args.optimizer}_{'_'.join(args.amp)}", {"machine": machine(), "epochs": args.epochs, "rows": rows})


if __name__ == "__main__":
    main()
