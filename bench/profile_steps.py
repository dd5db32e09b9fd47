"""Where an epoch's time goes in the trainer's own loop, by torch.profiler: the small-image case (resnet18, 32 px,
batch 64, the trainer's defaults otherwise), one epoch of `Loop.train_one_epoch` as `main.py train` runs it (events
written to a temporary run directory), after one warm-up epoch.

python bench/profile_steps.py [--data small|photos] [--model resnet18] [--log-every 10] [--no-stats] [--rows 20]

--data photos: the decode-heavy photos trained at 64 px instead of the small images at 32 px.

Prints the profiler's top operators by self CPU time, then the epoch's wall time split into: the model's forward and
backward, the optimizer step, gradient statistics, augmentation and normalisation, and the rest (Python between the
ops, taking batches from the cache, event writing) = wall time minus the ops.
"""

import argparse
import sys
import time

from common import REPO, bench_datasets, machine, trainer_loop

sys.path.insert(0, str(REPO))

# Operator-name patterns per part of a step (first match wins); the rest of the time is outside any operator.
GROUPS = (
    ("optimizer step", ("adam", "sgd", "_foreach_add", "_foreach_mul", "_foreach_lerp", "_foreach_addcdiv",
                        "_foreach_sqrt", "_foreach_div", "zero_")),
    ("gradient statistics", ("_foreach_norm", "_foreach_copy", "_foreach_sub", "linalg_vector_norm", "isfinite")),
    ("augmentation, normalisation, copies", ("grid_sampler", "affine_grid", "index_select", "aten::sub", "aten::div",
                                     "aten::to", "_to_copy", "contiguous", "clone", "copy_")),
)


def group_of(name: str) -> str:
    for label, patterns in GROUPS:
        if any(p in name for p in patterns):
            return label
    return "forward and backward"


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--data", choices=("small", "photos"), default="small")
    parser.add_argument("--model", default="resnet18")
    parser.add_argument("--log-every", type=int, default=10)
    parser.add_argument("--no-stats", action="store_true")
    parser.add_argument("--rows", type=int, default=20)
    args = parser.parse_args()
    from torch.profiler import ProfilerActivity, profile

    data, size = next(v for k, v in bench_datasets().items() if k.startswith(args.data))
    _, parts, loop = trainer_loop({"data": {"train_dir": str(data), "image_size": size, "batch_size": 64},
                                   "model": {"name": args.model}, "train": {"epochs": 2},
                                   "monitor": {"log_every": args.log_every, "grad_stats": not args.no_stats}},
                                  "td-profile-")
    loop.train_one_epoch()  # warm-up: first-use allocations and kernels
    loop.state.epoch, loop.state.batch_in_epoch = 1, 0
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        started = time.perf_counter()
        loop.train_one_epoch()
        wall = time.perf_counter() - started
    averages = prof.key_averages()
    print(averages.table(sort_by="self_cpu_time_total", row_limit=args.rows))
    shares: dict[str, float] = {}
    for avg in averages:
        shares[group_of(avg.key)] = shares.get(group_of(avg.key), 0.0) + avg.self_cpu_time_total / 1e6
    in_ops = sum(shares.values())
    print(f"machine: {machine()}")
    layout = str(parts.memory_format).removeprefix("torch.")
    print(f"{args.model}, {args.data} at {size} px, batch 64, monitor.log_every {args.log_every}, "
          f"grad_stats {not args.no_stats}, precision {parts.precision.amp}, {layout}; one epoch: {wall:.2f} s wall\n")
    print("| part | seconds | share of the epoch |\n|---|---|---|")
    for label, seconds in sorted(shares.items(), key=lambda kv: -kv[1]):
        print(f"| {label} | {seconds:.2f} | {100 * seconds / wall:.1f}% |")
    rest = max(wall - in_ops, 0.0)
    print(f"| outside any operator (Python, batches from the cache, events) | {rest:.2f} | {100 * rest / wall:.1f}% |")


if __name__ == "__main__":
    main()
