"""Does bf16 autocast train as well as fp32? Final validation accuracy of `main.py train`, fp32 vs bf16, several seeds.

The evidence behind `train.amp: auto` choosing bf16 where the hardware runs it natively. Runs are interleaved
(fp32 then bf16 for each seed) on the benchmark data of bench/throughput.py.

python bench/amp_parity.py [--seeds 3] [--epochs 12] [--model resnet18] [--batch 32]

AdamW at lr 2e-3 (resnet18 from scratch learns both datasets to ~100% with it; SGD at 0.05 stayed near chance in
this few steps, which would make any two precisions look "equal").
"""

import argparse
import json
import statistics

from common import bench_config, bench_datasets, machine, save_result, scratch, train_cli


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--epochs", type=int, default=12)
    parser.add_argument("--model", default="resnet18")
    parser.add_argument("--batch", type=int, default=32)
    args = parser.parse_args()
    work = scratch("td-amp-")
    results = {}
    for label, (data, size) in bench_datasets().items():
        cfg = bench_config(work / f"{size}.yaml", data, size, args.model, args.batch, args.epochs)
        rows = {"none": [], "bf16": []}
        for seed in range(args.seeds):
            for amp in rows:
                r = train_cli(cfg, work / f"{size}-{amp}-{seed}", [f"train.amp={amp}", f"train.seed={seed}"])
                rows[amp].append(r["final_acc"])
                print(json.dumps({"data": label, "amp": amp, "seed": seed, "acc": r["final_acc"],
                                  "wall_s": round(r["wall_s"], 1)}), flush=True)
        results[label] = rows
    print(f"\nmachine: {machine()}")
    print(f"{args.model}, batch {args.batch}, {args.epochs} epochs, seeds 0..{args.seeds - 1}\n")
    print("| data | fp32 final val acc, mean ± sd (runs) | bf16 final val acc, mean ± sd (runs) | difference |")
    print("|---|---|---|---|")
    for label, rows in results.items():
        m = {k: statistics.mean(v) for k, v in rows.items()}
        sd = {k: statistics.stdev(v) if len(v) > 1 else 0.0 for k, v in rows.items()}
        runs = {k: " ".join(f"{a:.2f}" for a in v) for k, v in rows.items()}
        print(f"| {label} | {m['none']:.3f} ± {sd['none']:.3f} ({runs['none']}) | {m['bf16']:.3f} ± {sd['bf16']:.3f} "
              f"({runs['bf16']}) | {m['bf16'] - m['none']:+.3f} |")
    save_result("amp_parity", {"args": vars(args), "machine": machine(), "results": results})


if __name__ == "__main__":
    main()
