"""End-to-end speed against the script a user would write, on decode-heavy photos and on small images.

(a) the plain seed-style loop (ImageFolder, PIL transforms, DataLoader, fp32), (b) `main.py train` with defaults,
end to end (scan, cache, validation, checkpoints), (c) the in-memory ceiling at the precision and memory format
(b) chose. Interleaved, medians of --repeats. Rates for (a) and (b) are training images per second of the whole
process's wall time (Python start, imports, data listing/caching, per-epoch validation, (b)'s checkpoints); for
(c), of the training loop alone, so (b)'s training phase (run_start to run_end: the epochs with their validation
and checkpoints) is reported beside it as (b train).

python bench/throughput.py [--repeats 3] [--epochs 5] [--model resnet18] [--batch 64] [--no-augment] [--only small]

--no-augment: augmentation off and a constant learning rate in both; (a) is then the leanest script (Resize +
ToTensor, 2 loader workers, one validation pass at the end), while (b) still validates every epoch.
"""

import argparse
import json
import statistics
import time

from common import REPO, bench_config, bench_datasets, machine, median_spread, run_json, save_result, scratch, train_cli


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--epochs", type=int, default=5)
    parser.add_argument("--model", default="resnet18")
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--no-augment", action="store_true", help="augmentation off, constant learning rate, in both")
    parser.add_argument("--only", choices=("small", "photos"), help="one of the two datasets")
    parser.add_argument("--save-as", default=None, help="name of the raw-numbers file in bench/results")
    args = parser.parse_args()
    args.save_as = args.save_as or ("throughput_no_augment" if args.no_augment else "throughput")
    plain_flags = ["--no-augment"] if args.no_augment else []
    sets = (["data.augment.hflip=false", "data.augment.random_resized_crop=false", "scheduler.name=none"]
            if args.no_augment else [])
    work = scratch("td-throughput-")
    table = {}
    for label, (data, size) in bench_datasets().items():
        if args.only and not label.startswith(args.only):
            continue
        cfg = bench_config(work / f"{size}.yaml", data, size, args.model, args.batch, args.epochs)
        rows = {"a": [], "b": [], "b_train": [], "b_steps": [], "c": [], "acc_a": [], "acc_b": []}
        for r in range(args.repeats):
            started = time.perf_counter()
            a = run_json([str(REPO / "bench" / "plain_loop.py"), str(data), str(size), str(args.epochs), args.model,
                          str(args.batch), *plain_flags])
            rows["a"].append(a["train_images"] / (time.perf_counter() - started))
            rows["acc_a"].append(a["final_acc"])
            b = train_cli(cfg, work / f"b{size}-{r}", sets)
            rows["b"].append(b["train_images"] / b["wall_s"])
            rows["b_train"].append(b["train_images"] / b["training_s"])
            rows["b_steps"].append(b["step_images_per_s"])
            rows["acc_b"].append(b["final_acc"])
            c = run_json([str(REPO / "bench" / "ceiling.py"), str(data), str(size), str(args.epochs), args.model,
                          str(args.batch), b["precision"], b["memory_format"]])
            rows["c"].append(c["train_images_per_s"])
            print(json.dumps({"dataset": label, "a": rows["a"][-1], "b": rows["b"][-1], "b_train": rows["b_train"][-1],
                              "c": rows["c"][-1],
                              "cache": b["cache"], "precision": b["precision"]}), flush=True)
        table[label] = rows
    save_result(args.save_as, {"args": vars(args), "machine": machine(), "table": table})
    print(f"\nmachine: {machine()}")
    print(f"{args.model}, batch {args.batch}, {args.epochs} epochs, {args.repeats} repeats (interleaved)\n")
    print("| data | (a) plain loop | (b) main.py train | (b train) its training phase | (c) in-memory ceiling | b/a | "
          "b/c | b train/c | (b)'s steps/c, per repeat | final acc a / b |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for label, rows in table.items():
        med = {k: statistics.median(v) for k, v in rows.items()}
        print(f"| {label} | {median_spread(rows['a'])} | {median_spread(rows['b'])} | {median_spread(rows['b_train'])} | "
              f"{median_spread(rows['c'])} | {med['b'] / med['a']:.2f} | {med['b'] / med['c']:.2f} | "
              f"{med['b_train'] / med['c']:.2f} | {steps_vs_ceiling(rows)} | {med['acc_a']:.2f} / {med['acc_b']:.2f} |")


def steps_vs_ceiling(rows: dict) -> str:
    """(b)'s training steps (the median rate of its step events) over (c), repeat by repeat: median (min–max)."""
    ratios = [b / c for b, c in zip(rows["b_steps"], rows["c"])]
    return f"{statistics.median(ratios):.2f} ({min(ratios):.2f}–{max(ratios):.2f})"


if __name__ == "__main__":
    main()
