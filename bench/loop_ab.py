"""A/B inside one trainer process: the trainer's own Loop (resnet18 on the small 32-px images, batch 64, the
trainer's defaults otherwise) runs blocks of epochs that alternate between two settings, A B B A A B ..., so the
drift and noise of a shared machine fall on both alike; medians of the block times and their ratio.

python bench/loop_ab.py --compare {stats,stats10,checkpoints,checkpoints-sync,validation} [--pairs 4] [--epochs 2]

  stats             per-layer statistics and a step event every step vs statistics off (step events every 10)
  stats10           statistics every 10 steps (the default) vs off
  checkpoints       a checkpoint after every epoch, written by the background writer, vs none; a block's time
                    includes waiting for its last write, which a real run overlaps with the next epoch
  checkpoints-sync  the same written synchronously (torch.save, fsync, rename before training goes on) vs none
  validation        one validation pass with batches twice the training batch (now) vs the training batch
"""

import argparse
import json
import statistics
import sys
import time

from common import REPO, machine, save_result, small_dataset, trainer_loop

sys.path.insert(0, str(REPO))

COMPARE = {
    "stats": ("statistics and a step event every step", {"grad_stats": True, "log_every": 1},
              "statistics off", {"grad_stats": False, "log_every": 10}),
    "stats10": ("statistics every 10 steps", {"grad_stats": True, "log_every": 10},
                "statistics off", {"grad_stats": False, "log_every": 10}),
    "checkpoints": ("a checkpoint every epoch, background writer", {"save": "background"},
                    "no checkpoints", {}),
    "checkpoints-sync": ("a checkpoint every epoch, synchronous", {"save": "sync"}, "no checkpoints", {}),
    "validation": ("validation batches 2x the training batch", {"eval_factor": 2},
                   "validation batches = the training batch", {"eval_factor": 1}),
}


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--compare", choices=sorted(COMPARE), required=True)
    parser.add_argument("--pairs", type=int, default=4)
    parser.add_argument("--epochs", type=int, default=2, help="epochs per block")
    parser.add_argument("--model", default="resnet18")
    args = parser.parse_args()
    from trainer.train import loop as loop_mod

    data = small_dataset(REPO / "bench" / ".data" / "shapes")
    cfg, parts, loop = trainer_loop({"data": {"train_dir": str(data), "image_size": 32, "batch_size": 64},
                                     "model": {"name": args.model}, "train": {"epochs": 10_000}}, "td-loop-ab-")
    label_a, setting_a, label_b, setting_b = COMPARE[args.compare]
    background_writer = loop.checkpoint_writer

    def block(setting: dict) -> float:
        cfg.monitor.grad_stats = setting.get("grad_stats", True)
        cfg.monitor.log_every = setting.get("log_every", 10)
        loop_mod.EVAL_BATCH_FACTOR = setting.get("eval_factor", 2)
        loop.checkpoint_writer = None if setting.get("save") == "sync" else background_writer
        started = time.perf_counter()
        for _ in range(args.epochs):
            if "eval_factor" in setting:
                loop.validation.evaluate(loop.state.epoch)
                continue
            loop.train_one_epoch()
            loop.state.epoch += 1
            loop.state.batch_in_epoch = 0
            if setting.get("save"):
                loop.save(is_best=False)
        background_writer.wait()
        return time.perf_counter() - started

    block(setting_a)  # warm-up: first-use allocations, the writer's thread, the cache pages
    times = {"a": [], "b": []}
    for pair in range(args.pairs):
        for key in ("ab" if pair % 2 == 0 else "ba"):
            times[key].append(block(setting_a if key == "a" else setting_b))
        print(json.dumps({"pair": pair, "a": times["a"][-1], "b": times["b"][-1]}), flush=True)
    med_a, med_b = statistics.median(times["a"]), statistics.median(times["b"])
    ratios = [b / a for a, b in zip(times["a"], times["b"])]
    save_result(f"loop_ab_{args.compare}", {"args": vars(args), "machine": machine(), "times": times,
                                             "labels": [label_a, label_b]})
    what = "validation passes" if args.compare == "validation" else "epochs"
    print(f"\nmachine: {machine()}")
    print(f"{args.model}, 32 px, batch 64, precision {parts.precision.amp}; {args.pairs} pairs of blocks of "
          f"{args.epochs} {what}, alternating A B B A ...\n")
    print("| variant | block, median (min–max) |\n|---|---|")
    for key, label in (("a", label_a), ("b", label_b)):
        print(f"| {key.upper()}: {label} | {statistics.median(times[key]):.2f} s "
              f"({min(times[key]):.2f}–{max(times[key]):.2f}) |")
    print(f"\nspeed of A relative to B: {med_b / med_a:.3f} (ratio of medians); per pair: "
          + ", ".join(f"{r:.3f}" for r in ratios))


if __name__ == "__main__":
    main()
