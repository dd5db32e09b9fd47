"""Auto against the tools a user would pick instead, at equal wall-clock budgets (issue #24).

    python bench/auto.py --budgets 2 5 --repeats 1 --peers-python /path/to/venv/bin/python

Three folders of real images, each laid out train/ val/ test/ (the same files for every tool; every tool validates
on val/ and is scored on test/, which none of them trains or selects on):
- digits: scikit-learn's 1,797 handwritten digit scans (8x8 grey, written as 32 px RGB PNGs), 10 classes;
  test 20%, val 15% of the rest, stratified.
- photos: crops of six real photographs (scikit-image's astronaut, chelsea, coffee, rocket; scikit-learn's china and
  flower), 56-96 px squares saved at 96 px, one class per photograph; train crops (120 a class) come from the left
  55% of each photograph, val (30) from the next 17%, test (50) from the right 28%, so no pixel is in two splits.
- photos12: the same from twelve photographs (the six above and scikit-image's brick, grass, gravel, Hubble deep
  field, immunohistochemistry and retina, the grey ones as RGB), with more images a class: 400 train, 60 val, 100 test.

The tools, each run as its users run it, from scratch (no pretrained weights can be fetched here):
- auto: `main.py auto FOLDER --minutes M` (planning included in the budget).
- fastai: `vision_learner(resnet18, pretrained=False)`, `lr_find().valley`, `fit_one_cycle(E)`, aug_transforms.
- ultralytics: `YOLO("yolo11n-cls.yaml").train(time=M/60, ...)`: its own time budget, which re-plans its epochs.
- torchvision: the reference recipe's defaults (references/classification/train.py: resnet18, SGD lr 0.1 momentum 0.9
  weight decay 1e-4, StepLR 30/0.1, RandomResizedCrop + flip, batch 32), re-written in bench/peers/.
fastai and torchvision take epochs, not minutes: a one-epoch calibration (not counted in their budget) gives the
epochs that fill 90% of it, as a user would pick. Each tool reports test top-1 of its final weights and of the
weights its validation picked as best; Auto's best is its best.pt, its final its last.pt.

The peers need fastai, ultralytics and scikit-image; install them in a separate environment (with torch 2.14.1 and
torchvision 0.29.1): `pip install fastai ultralytics scikit-image scikit-learn`, and pass its python.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from common import MORE_PHOTOS, REPO, SCIKIT_IMAGE_PHOTOS, SCIKIT_LEARN_PHOTOS, machine, photo_jpegs, photos, save_result

DATA = REPO / "bench" / ".data"
PEERS = ("fastai", "ultralytics", "torchvision")
SIZES = {"digits": 32, "photos": 96, "photos12": 96, "jpegs": 64}
MANUAL = {"model": {"name": "resnet18"}, "data": {"image_size": 64, "batch_size": 32},
          "optimizer": {"name": "adamw", "lr": 0.002, "weight_decay": 0.05}, "scheduler": {"name": "onecycle"},
          "train": {"epochs": 10, "replan": True}, "export": {"formats": ["onnx"]}}  # the manual run
TRAINDECK_PYTHON = sys.executable  # what the peers train at (Auto chooses its own)


def split_write(root: Path, images: list, labels: list[int], classes: list[str], seed: int = 0) -> None:
    """Stratified test 20%, val 15% of the rest; PNG files under root/{train,val,test}/CLASS/."""
    rng = random.Random(seed)
    by_class: dict[int, list[int]] = {}
    for i, y in enumerate(labels):
        by_class.setdefault(y, []).append(i)
    for y, idx in by_class.items():
        rng.shuffle(idx)
        n_test = round(0.2 * len(idx))
        n_val = round(0.15 * (len(idx) - n_test))
        for split, part in (("test", idx[:n_test]), ("val", idx[n_test:n_test + n_val]), ("train", idx[n_test + n_val:])):
            folder = root / split / classes[y]
            folder.mkdir(parents=True, exist_ok=True)
            for i in part:
                images[i].save(folder / f"{i:05d}.png")


def digits(root: Path) -> Path:
    from PIL import Image
    from sklearn.datasets import load_digits

    if (root / ".done").exists():
        return root
    d = load_digits()
    images = [Image.fromarray((img * 255 / 16).astype("uint8")).convert("RGB").resize((32, 32), Image.BILINEAR)
              for img in d.images]
    split_write(root, images, list(map(int, d.target)), [str(c) for c in range(10)])
    (root / ".done").write_text("")
    return root


class Hog:
    """`count` processes spinning on the CPU (another program busy beside Auto), started and stopped on demand."""

    def __init__(self, count: int):
        self.count, self.procs = count, []

    def start(self) -> None:
        if not self.procs:
            self.procs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(self.count)]

    def stop(self) -> None:
        for p in self.procs:
            p.kill()
            p.wait()
        self.procs = []


def run_auto(folder: Path, minutes: float, work: Path, hog_during: str = "never", hogs: int = 1) -> dict:
    """Auto through its command line; with `hog_during` "planning" or "training", a CPU hog runs beside it for that
    phase only (training starts at Auto's `run directory:` line)."""
    hog = Hog(hogs)
    start = time.time()
    if hog_during == "planning":
        hog.start()
    proc = subprocess.Popen([TRAINDECK_PYTHON, str(REPO / "main.py"), "auto", str(folder), "--minutes", str(minutes),
                             "--runs-dir", str(work)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            cwd=REPO)
    try:
        for line in proc.stdout:
            if line.startswith("run directory:") and hog_during == "planning":
                hog.stop()
            elif line.startswith("run directory:") and hog_during == "training":
                hog.start()
        err = proc.stderr.read()
        proc.wait()
    finally:
        hog.stop()
    wall = time.time() - start
    if proc.returncode != 0:
        return {"error": err.strip().splitlines()[-1] if err.strip() else f"exit {proc.returncode}"}
    runs = sorted((p for p in work.iterdir() if p.is_dir()), key=lambda p: p.stat().st_mtime_ns)
    run = next(p for p in runs if (p / "eval" / "test" / "metrics.json").exists())  # the one Auto finished
    made_way = [json.loads((p / "auto.json").read_text())["choices"] for p in runs if p != run]  # train.min_epochs
    best = json.loads((run / "eval" / "test" / "metrics.json").read_text())["accuracy"]
    subprocess.run([TRAINDECK_PYTHON, str(REPO / "main.py"), "evaluate", str(run), "--checkpoint", "last", "--data",
                    str(folder / "test"), "--name", "final"], capture_output=True, cwd=REPO, check=True)
    final = json.loads((run / "eval" / "final" / "metrics.json").read_text())["accuracy"]
    status = json.loads((run / "status.json").read_text())
    listed = json.loads((run / "auto.json").read_text())["choices"]
    choices = {c["key"]: c["value"] for c in listed}
    choices_why = {c["key"]: c["why"] for c in listed}
    events = [json.loads(line) for line in (run / "events.jsonl").open()]
    end = [e for e in events if e["event"] == "run_end"][-1]  # a run that made way and was resumed has two
    replans = [e for e in events if e["event"] == "replan"]
    return {"best_acc": best, "final_acc": final, "wall_s": wall, "train_s": end["time"] - events[0]["time"],
            "budget_used": (end["time"] - start) / (minutes * 60),
            "trained_share": (max(e["time"] for e in events if e["event"] == "epoch") - start) / (minutes * 60),
            "epochs": status.get("epoch"),
            "model": choices.get("model.name"), "size": choices.get("data.image_size"),
            "planned_epochs": choices.get("train.epochs"), "replanned_to": replans[-1]["epochs"] if replans else None,
            "ended": status.get("reason") or ("early stopped" if "early stop" in status.get("message", "") else ""),
            "busy_said": "was busy while Auto measured" in str(choices_why.get("train.epochs", "")),
            "resumed_after": [e["reason"] for e in events if e["event"] == "run_end" and e.get("reason") in
                              ("too_slow", "too_fast")],  # made way, measured again, and the same network went on
            "made_way": [next(f"{c['value']}" for c in m if c["key"] == "model.name") + " @ " +
                         next(f"{c['value']}" for c in m if c["key"] == "data.image_size") for m in made_way]}


def run_manual(folder: Path, minutes: float, work: Path) -> dict:
    """A user's own run (MANUAL: resnet18 at 64 px, 10 epochs, one-cycle, the ONNX export) given the same minutes as
    train.budget with train.replan, through `main.py train`; timed from the command's start to its end."""
    import yaml

    config = work / "manual.yaml"
    raw = {**MANUAL, "data": {**MANUAL["data"], "train_dir": str(folder / "train"), "val_dir": str(folder / "val"),
                              "test_dir": str(folder / "test")},
           "train": {**MANUAL["train"], "budget": minutes}}
    config.write_text(yaml.safe_dump(raw))
    start = time.time()
    done = subprocess.run([TRAINDECK_PYTHON, str(REPO / "main.py"), "train", str(config), "--runs-dir",
                           str(work / "runs")], capture_output=True, text=True, cwd=REPO)
    wall = time.time() - start
    if done.returncode != 0:
        return {"error": (done.stderr.strip().splitlines() or [f"exit {done.returncode}"])[-1]}
    (run,) = (work / "runs").iterdir()
    best = json.loads((run / "eval" / "test" / "metrics.json").read_text())["accuracy"]
    status = json.loads((run / "status.json").read_text())
    return {"best_acc": best, "final_acc": best, "wall_s": wall, "epochs": status.get("epoch"), "model": "resnet18",
            "size": 64}


def run_peer(python: str, tool: str, folder: Path, minutes: float, size: int, work: Path) -> dict:
    out = work / "result.json"
    start = time.time()
    done = subprocess.run([python, str(REPO / "bench" / "peers" / f"{tool}_peer.py"), "--data", str(folder),
                           "--minutes", str(minutes), "--size", str(size), "--work", str(work), "--out", str(out)],
                          capture_output=True, text=True, cwd=work, timeout=minutes * 60 * 3 + 600)
    if done.returncode != 0 or not out.exists():
        tail = (done.stderr or done.stdout).strip().splitlines()[-3:]
        return {"error": " | ".join(tail) or f"exit {done.returncode}"}
    return {**json.loads(out.read_text()), "wall_s": time.time() - start}


def robustness(folders: dict[str, Path], minutes: float, repeats: int, hogs: int,
               conditions: tuple[str, ...] = ("never", "planning", "training"), out: str | None = None) -> None:
    """Auto with a CPU hog beside it during planning only, during training only, and never: each repeat runs every
    folder under every condition (interleaved, the conditions' order rotated by repeat)."""
    results = []
    for repeat in range(repeats):
        for name, folder in folders.items():
            for hog_during in conditions[repeat % len(conditions):] + conditions[:repeat % len(conditions)]:
                with tempfile.TemporaryDirectory(prefix="bench-auto-robust-") as tmp:
                    print(f"repeat {repeat + 1}, {minutes:g} min, {name}, hog during {hog_during} ...", flush=True)
                    r = run_auto(folder, minutes, Path(tmp), hog_during, hogs)
                r.update(hog_during=hog_during, dataset=name, minutes=minutes, repeat=repeat, hogs=hogs)
                print("   ", json.dumps(r), flush=True)
                results.append(r)
                save_result(out or "auto_robustness_" + "_".join(folders), {"machine": machine(), "results": results})
    print(f"\n{machine()}; {hogs} spinning process(es) as the hog")
    print("| data | hog during | budget used (to run_end) | last epoch ended at | ended by | epochs planned -> "
          "re-planned -> trained | plan says busy | network (a first one that made way ->) | test top-1 (best.pt) |")
    print("|---|---|---|---|---|---|---|---|---|")
    for r in results:
        if "error" in r:
            print(f"| {r['dataset']} | {r['hog_during']} | failed: {r['error']} |")
            continue
        print(f"| {r['dataset']} | {r['hog_during']} | {100 * r['budget_used']:.0f}% | {100 * r['trained_share']:.0f}% | "
              f"{r.get('ended') or 'its epochs'} | {r['planned_epochs']} -> {r['replanned_to']} -> {r['epochs']} | "
              f"{r.get('busy_said')} | {', '.join(r.get('made_way') or []) or '-'} -> {r['model']} @ {r['size']} | "
              f"{100 * r['best_acc']:.1f}% |")
    print("\n| data | hog during | test top-1 median (range) | against the quiet median | last epoch ended at "
          "(lowest) | ended by | networks |")
    print("|---|---|---|---|---|---|---|")
    for name in folders:
        quiet = [r["best_acc"] for r in results if r["dataset"] == name and r["hog_during"] == "never"
                 and "error" not in r]
        for hog_during in conditions:
            rows = [r for r in results if r["dataset"] == name and r["hog_during"] == hog_during and "error" not in r]
            if not rows:
                continue
            acc = [r["best_acc"] for r in rows]
            against = f"{100 * (statistics.median(acc) - statistics.median(quiet)):+.1f}" if quiet else "-"
            ended = ", ".join(sorted({r.get("ended") or "its epochs" for r in rows}))
            networks = ", ".join(sorted({f"{r['model']} @ {r['size']}" for r in rows}))
            print(f"| {name} | {hog_during} | {100 * statistics.median(acc):.1f} ({100 * min(acc):.1f}-"
                  f"{100 * max(acc):.1f}) | {against} | {100 * min(r['trained_share'] for r in rows):.0f}% | {ended} | "
                  f"{networks} |")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--robustness", action="store_true", help="Auto alone, with a CPU hog during planning, "
                        "during training, and never (the first of --budgets, every one of --datasets)")
    parser.add_argument("--hogs", type=int, default=1, help="--robustness: spinning processes in the hog")
    parser.add_argument("--hog-during", nargs="+", default=["never", "planning", "training"],
                        choices=("never", "planning", "training"), help="--robustness: these conditions only")
    parser.add_argument("--budgets", type=float, nargs="+", default=[2, 5, 10])
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--first-repeat", type=int, default=1, help="number the repeats from this one (it sets the "
                        "tools' rotated order, so more repeats can be added to an earlier file's)")
    parser.add_argument("--datasets", nargs="+", default=["digits", "photos", "photos12"])
    parser.add_argument("--tools", nargs="+", default=["auto", *PEERS], choices=("auto", "manual", *PEERS))
    parser.add_argument("--peers-python", default=sys.executable)
    parser.add_argument("--name", default="auto", help="the results file: bench/results/NAME.json")
    parser.add_argument("--busy", type=int, default=0, help="this many spinning processes through every tool's whole "
                        "command (a laptop busy all along; issue #68 asks for 6)")
    args = parser.parse_args()
    folders = {"digits": digits(DATA / "auto-digits"), "photos": photos(DATA / "auto-photos"),
               "jpegs": photo_jpegs(DATA / "photo_jpegs"),
               "photos12": photos(DATA / "auto-photos12", per_class=(400, 60, 100),
                                  names=SCIKIT_IMAGE_PHOTOS + SCIKIT_LEARN_PHOTOS + MORE_PHOTOS)}
    if args.robustness:
        robustness({name: folders[name] for name in args.datasets}, args.budgets[0], args.repeats, args.hogs,
                   tuple(args.hog_during), None if args.name == "auto" else args.name)
        return
    results = []
    for repeat in range(args.first_repeat - 1, args.first_repeat - 1 + args.repeats):
        for minutes in args.budgets:
            for name in args.datasets:
                tools = args.tools[repeat % len(args.tools):] + args.tools[:repeat % len(args.tools)]  # interleaved
                for tool in tools:
                    hog = Hog(args.busy)
                    with tempfile.TemporaryDirectory(prefix=f"bench-auto-{tool}-") as tmp:
                        print(f"repeat {repeat + 1}, {minutes:g} min, {name}, {tool}, {args.busy} busy ...", flush=True)
                        hog.start()
                        try:
                            if tool == "auto":
                                r = run_auto(folders[name], minutes, Path(tmp))
                            elif tool == "manual":
                                r = run_manual(folders[name], minutes, Path(tmp))
                            else:
                                r = run_peer(args.peers_python, tool, folders[name], minutes, SIZES[name], Path(tmp))
                        finally:
                            hog.stop()
                    r.update(tool=tool, dataset=name, minutes=minutes, repeat=repeat, busy=args.busy,
                             wall_ratio=r["wall_s"] / (60 * minutes) if "wall_s" in r else None)
                    print("   ", json.dumps(r), flush=True)
                    results.append(r)
                    save_result(args.name, {"machine": machine(), "results": results})
    print(f"\n{machine()}")
    print(f"{args.busy} spinning processes through every command")
    print("| data | budget | tool | test top-1 best / final (median) | wall time (median, x budget) | epochs | "
          "model @ size | runs |")
    print("|---|---|---|---|---|---|---|---|")
    for name in args.datasets:
        for minutes in args.budgets:
            for tool in args.tools:
                rows = [r for r in results if r["dataset"] == name and r["minutes"] == minutes and r["tool"] == tool]
                ok = [r for r in rows if "error" not in r]
                if not ok:
                    print(f"| {name} | {minutes:g} min | {tool} | failed: {rows[0].get('error') if rows else '-'} |")
                    continue
                best = statistics.median(r["best_acc"] for r in ok)
                final = statistics.median(r["final_acc"] for r in ok)
                wall = statistics.median(r["wall_s"] for r in ok)
                epochs = statistics.median(r.get("epochs") or 0 for r in ok)
                model = f"{ok[0].get('model', '')} @ {ok[0].get('size', '')}"
                print(f"| {name} | {minutes:g} min | {tool} | {100 * best:.1f} / {100 * final:.1f} | {wall / 60:.2f} "
                      f"min ({wall / 60 / minutes:.2f}x) | {epochs:g} | {model} | {len(ok)} |")


if __name__ == "__main__":
    main()
