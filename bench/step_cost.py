"""The trainer's training step against a plain loop's, side by side in one process (issue #50's per-step cost).

python bench/step_cost.py [--model small_cnn] [--pairs 5] [--epochs 2] [--share-cpu]

Both train the same network class on the same decoded images (the small 32-px shapes, in memory, batch 64,
augmentation off), with the benchmarks' AdamW (fused), fp32, contiguous memory. Blocks of `--epochs` epochs alternate
A B B A ..., so a shared machine's drift falls on both alike. A: the trainer's `Loop.train_one_epoch` (its events,
gradient statistics every 10 steps, loss checks, the schedule); B: a plain loop over the same tensors (index, float,
normalise, forward, loss, backward, step, zero_grad). `device.share_cpu` is off unless `--share-cpu`: with it, the
trainer gives cores other programs use back (by design, issue #34), which a plain loop never does, so on a busy
machine the two then measure different things. Prints images/s medians and their ratio; the result JSON under
bench/results/.
"""

import argparse
import json
import statistics
import sys
import time

from common import BENCH_OPTIMIZER, REPO, machine, save_result, small_dataset, trainer_loop

sys.path.insert(0, str(REPO))


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", default="small_cnn")
    parser.add_argument("--pairs", type=int, default=5)
    parser.add_argument("--epochs", type=int, default=2, help="epochs per block")
    parser.add_argument("--share-cpu", action="store_true")
    args = parser.parse_args()
    import torch

    from trainer.core.config import ModelConfig
    from trainer.model.models import create_model

    data = small_dataset(REPO / "bench" / ".data" / "shapes")
    raw = {"data": {"train_dir": str(data), "image_size": 32, "batch_size": 64, "cache": "memory",
                    "augment": {"hflip": False, "random_resized_crop": False}},
           "model": {"name": args.model}, "optimizer": BENCH_OPTIMIZER,
           "train": {"epochs": 10_000, "amp": "none"}, "device": {"share_cpu": args.share_cpu}}
    cfg, parts, loop = trainer_loop(raw, "td-step-cost-")
    images, labels = parts.data.train.store.images, torch.tensor(parts.data.train.labels)
    rows = torch.as_tensor(parts.data.train.rows)  # each training image's row in the decoded store
    n = len(rows)

    torch.manual_seed(0)
    net = create_model(ModelConfig(name=args.model), len(parts.classes))
    net.train()
    optimizer = torch.optim.AdamW(net.parameters(), lr=BENCH_OPTIMIZER["lr"],
                                  weight_decay=BENCH_OPTIMIZER["weight_decay"], fused=True)
    mean = torch.tensor(parts.mean).view(1, 3, 1, 1) * 255
    std = torch.tensor(parts.std).view(1, 3, 1, 1) * 255
    criterion = torch.nn.CrossEntropyLoss()

    def plain_epoch(epoch: int) -> int:
        order = torch.randperm(n, generator=torch.Generator().manual_seed(epoch))
        for start in range(0, n, 64):
            index = order[start:start + 64]
            x = (images[rows[index]].float() - mean) / std
            loss = criterion(net(x), labels[index])
            loss.backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
        return n

    def trainer_epoch(_: int) -> int:
        loop.train_one_epoch()
        loop.state.epoch += 1
        loop.state.batch_in_epoch = 0
        return n

    def block(epoch_fn) -> float:
        started, done = time.perf_counter(), 0
        for e in range(args.epochs):
            done += epoch_fn(e)
        return done / (time.perf_counter() - started)

    block(trainer_epoch), block(plain_epoch)  # warm-up: first-use allocations, the cache pages
    speeds = {"trainer": [], "plain": []}
    for pair in range(args.pairs):
        for key in (("trainer", "plain") if pair % 2 == 0 else ("plain", "trainer")):
            speeds[key].append(block(trainer_epoch if key == "trainer" else plain_epoch))
        print(json.dumps({"pair": pair, **{k: round(v[-1], 1) for k, v in speeds.items()}}), flush=True)
    trainer, plain = statistics.median(speeds["trainer"]), statistics.median(speeds["plain"])
    save_result(f"step_cost_{args.model}", {"args": vars(args), "machine": machine(), "images_per_s": speeds,
                                            "threads": torch.get_num_threads()})
    print(f"\nmachine: {machine()}; torch threads {torch.get_num_threads()}")
    print(f"{args.model}, 32 px, batch 64, {n} images in memory, fp32, AdamW fused, augmentation off, "
          f"device.share_cpu {args.share_cpu}; {args.pairs} pairs of {args.epochs}-epoch blocks, alternating\n")
    print("| loop | images/s, median (min-max) |\n|---|---|")
    for key in ("trainer", "plain"):
        print(f"| {key} | {statistics.median(speeds[key]):.0f} ({min(speeds[key]):.0f}-{max(speeds[key]):.0f}) |")
    print(f"\ntrainer / plain: {trainer / plain:.3f} (ratio of medians); per pair: "
          + ", ".join(f"{a / b:.3f}" for a, b in zip(speeds["trainer"], speeds["plain"])))


if __name__ == "__main__":
    main()
