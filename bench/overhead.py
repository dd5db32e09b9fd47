"""What the live statistics cost: images/s of (a) the plain seed-style loop, (b) the trainer with statistics off,
(c) statistics every 10 steps, (d) every step — interleaved, medians of several repeats. All fp32 (`train.amp:
none`), like (a), so the comparison is about the statistics alone.

python bench/overhead.py [--repeats 3] [--epochs 3] [--model small_cnn] [--size 32] [--batch 32] [--save-as NAME]

Rates are training images/s: (a)'s loop alone, the median of the trainer's own `step` events for (b)-(d), and, beside
them, the whole process (start to exit, all epochs with validation and checkpoints) for (b)-(d).
"""

import argparse
import json
import statistics

import yaml
from common import BENCH_OPTIMIZER, REPO, machine, median_spread, run_json, save_result, scratch, small_dataset, train_cli

VARIANTS = {
    "b": ("trainer, stats off", ["monitor.grad_stats=false", "monitor.log_every=10"]),
    "c": ("trainer, stats every 10 steps", ["monitor.grad_stats=true", "monitor.log_every=10"]),
    "d": ("trainer, stats every step", ["monitor.grad_stats=true", "monitor.log_every=1"]),
}


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--model", default="small_cnn")
    parser.add_argument("--size", type=int, default=32)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--save-as", default="overhead", help="name of the raw-numbers file in bench/results")
    args = parser.parse_args()
    work = scratch("td-overhead-")
    data = small_dataset(REPO / "bench" / ".data" / "shapes")
    config = work / "cfg.yaml"
    config.write_text(yaml.safe_dump({"data": {"train_dir": str(data), "image_size": args.size,
                                               "batch_size": args.batch}, "model": {"name": args.model},
                                      "train": {"epochs": args.epochs, "amp": "none"}, "optimizer": BENCH_OPTIMIZER}))
    results = {k: [] for k in "abcd"}
    whole = {k: [] for k in VARIANTS}
    for r in range(args.repeats):
        a = run_json([str(REPO / "bench" / "plain_loop.py"), str(data), str(args.size), str(args.epochs), args.model,
                      str(args.batch)])
        results["a"].append(a["train_images_per_s"])
        for key, (_, sets) in VARIANTS.items():
            out = train_cli(config, work / f"{key}{r}", sets)
            results[key].append(out["step_images_per_s"])
            whole[key].append(out["train_images"] / out["wall_s"])
        print(json.dumps({k: v[-1] for k, v in results.items()}), flush=True)
    med = {k: statistics.median(v) for k, v in results.items()}
    save_result(args.save_as, {"args": vars(args), "machine": machine(), "results": results, "whole": whole})
    print(f"\nmachine: {machine()}")
    print(f"{args.model}, {args.size}px, batch {args.batch}, {args.epochs} epochs, {args.repeats} repeats (interleaved)\n")
    print("| variant | images/s, median (min–max) | vs (a) | vs (b) | whole process, images/s | whole vs (b) |\n"
          "|---|---|---|---|---|---|")
    names = {"a": "plain seed-style loop", **{k: v[0] for k, v in VARIANTS.items()}}
    for k in "abcd":
        w = (f"{median_spread(whole[k])} | {statistics.median(whole[k]) / statistics.median(whole['b']):.2f}"
             if k in whole else "– | –")
        print(f"| ({k}) {names[k]} | {median_spread(results[k])} | {med[k] / med['a']:.2f} | {med[k] / med['b']:.2f} | "
              f"{w} |")


if __name__ == "__main__":
    main()
