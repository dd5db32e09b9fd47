"""The trainer's start-up: from starting `python main.py train` to its first training step, and where the time goes
(the phases between the trainer's own events), for the built-in CNN and a torchvision model.

python bench/first_step.py [--repeats 5] [--models small_cnn resnet18]

Phases: interpreter start and imports (process start -> first `prepare` event), scanning the data and loading its
decoded-image cache (-> `prepare` model), building the model, optimizer and the rest (-> `run_start`), and the
first step itself (-> the first `step` event; `monitor.log_every: 1`). The cache is built by a first, untimed run,
as it is for every run after the first on a dataset. Beside them, the floor: a bare script that imports torch (and
torchvision for its models), builds the same model and an SGD optimizer and takes one step on random data.
"""

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

import yaml
from common import REPO, machine, save_result, scratch, small_dataset

PHASES = ("imports", "scan and cache", "model and optimizer", "first step")

# The floor: the least any script can do to take one training step of the same model with torch.optim here.
FLOOR = r"""
import sys, time, json
import torch
if sys.argv[1] != "small_cnn":
    import torchvision
sys.path.insert(0, sys.argv[2])
from trainer.model.models import SmallCNN
model = SmallCNN(4) if sys.argv[1] == "small_cnn" else torchvision.models.get_model(sys.argv[1], num_classes=4)
optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
torch.nn.functional.cross_entropy(model(torch.randn(32, 3, 32, 32)), torch.zeros(32, dtype=torch.long)).backward()
optimizer.step()
print(json.dumps({"stepped": time.time()}))
"""


def floor_run(model: str) -> float:
    started = time.time()
    out = subprocess.run([sys.executable, "-c", FLOOR, model, str(REPO)], capture_output=True, text=True, cwd=REPO)
    if out.returncode != 0:
        raise RuntimeError(out.stderr[-3000:])
    return json.loads(out.stdout.strip().splitlines()[-1])["stepped"] - started


def one_run(config: Path, run_dir: Path) -> dict:
    from trainer.core.events import read_events

    started = time.time()
    out = subprocess.run([sys.executable, str(REPO / "main.py"), "train", str(config), "--run-dir", str(run_dir)],
                         capture_output=True, text=True, cwd=REPO)
    if out.returncode != 0:
        raise RuntimeError(out.stderr[-3000:])
    events = read_events(run_dir / "events.jsonl")
    first_prepare = next(e["time"] for e in events if e["event"] == "prepare")
    model = next(e["time"] for e in events if e["event"] == "prepare" and e.get("phase") == "model")
    run_start = next(e["time"] for e in events if e["event"] == "run_start")
    step = next(e["time"] for e in events if e["event"] == "step")
    marks = [started, first_prepare, model, run_start, step]
    return {"total": step - started, **{p: b - a for p, a, b in zip(PHASES, marks, marks[1:])}}


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--models", nargs="+", default=["small_cnn", "resnet18"])
    args = parser.parse_args()
    work = scratch("td-first-step-")
    data = small_dataset(REPO / "bench" / ".data" / "shapes")
    configs = {}
    for model in args.models:
        configs[model] = work / f"{model}.yaml"
        configs[model].write_text(yaml.safe_dump({
            "data": {"train_dir": str(data), "image_size": 32, "batch_size": 32}, "model": {"name": model},
            "train": {"epochs": 1}, "monitor": {"log_every": 1}}))
        one_run(configs[model], work / f"warm-{model}")  # builds the cache, warms the file cache
    results = {m: [] for m in args.models}
    for r in range(args.repeats):
        for model in args.models:
            results[model].append({**one_run(configs[model], work / f"{model}-{r}"), "floor": floor_run(model)})
            print(json.dumps({model: results[model][-1]}), flush=True)
    save_result("first_step", {"args": vars(args), "machine": machine(), "results": results})
    print(f"\nmachine: {machine()}\n{args.repeats} repeats, interleaved; medians (min–max), seconds\n")
    print("| model | process start → first step | " + " | ".join(PHASES) + " | the floor: a bare script's first step |")
    print("|---|---|" + "---|" * len(PHASES) + "---|")
    for model, runs in results.items():
        cells = []
        for key in ("total", *PHASES, "floor"):
            values = [run[key] for run in runs]
            cells.append(f"{statistics.median(values):.2f} ({min(values):.2f}–{max(values):.2f})")
        print(f"| {model} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
