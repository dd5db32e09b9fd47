"""Deploy (issue #25): what int8 (and fp16, ExecuTorch) exports of a resnet18 cost in accuracy and gain in size and
speed, measured side by side.

    python bench/deploy.py [--size 224] [--epochs 8] [--repeats 5]

1. Trains resnet18 from scratch with `main.py train` on crops of six real photographs (bench/common.py `photos`:
   scikit-image's astronaut, chelsea, coffee, rocket and scikit-learn's china and flower; train, val and test crops
   from separate bands of each photograph, so the test images are regions never trained on), at `--size` px.
2. Exports best.pt with `main.py export` as onnx (fp32), onnx_int8 (static, calibrated on 200 training images, and
   with 50 and 500), onnx_int8 --int8 dynamic, onnx_fp16, executorch, openvino and openvino_int8 (NNCF), litert and
   litert_int8 (litert-torch, PT2E); each card carries the file's top-1 on the
   300 test images and its agreement with the checkpoint.
3. Speed side by side in one process: ONNX Runtime sessions of the fp32 and int8 files, and the checkpoint in
   PyTorch fp32, timed in interleaved rounds (`--repeats`; each round: batch-1 latency as the median of 50 runs,
   throughput at batch 32 as the median of 10), the same normalised test images for all. Medians over the rounds
   and the ratios to fp32 ONNX are printed and kept in bench/results/deploy.json.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from common import REPO, machine, photos, save_result

DATA = REPO / "bench" / ".data"
EXPORTS = [("onnx", ".onnx", []), ("onnx_int8", ".int8.onnx", []),
           ("onnx_int8", ".int8-cal50.onnx", ["--calibration-images", "50"]),
           ("onnx_int8", ".int8-cal500.onnx", ["--calibration-images", "500"]),
           ("onnx_int8", ".int8-dynamic.onnx", ["--int8", "dynamic"]),
           ("onnx_fp16", ".fp16.onnx", []), ("executorch", ".pte", []),
           ("openvino", ".openvino", []), ("openvino_int8", ".int8.openvino", []),
           ("litert", ".tflite", []), ("litert_int8", ".int8.tflite", [])]


def main_py(*args: str) -> str:
    done = subprocess.run([sys.executable, str(REPO / "main.py"), *args], capture_output=True, text=True, cwd=REPO)
    if done.returncode != 0:
        raise SystemExit(f"main.py {args[0]} failed: {done.stderr.strip().splitlines()[-1:]}")
    return done.stdout


def train(folder: Path, work: Path, size: int, epochs: int) -> Path:
    config = work / "config.yaml"
    config.write_text(json.dumps({
        "data": {"train_dir": str(folder / "train"), "val_dir": str(folder / "val"), "test_dir": str(folder / "test"),
                 "image_size": size, "batch_size": 32},
        "model": {"name": "resnet18"}, "optimizer": {"name": "adamw", "lr": 0.002, "weight_decay": 0.05},
        "scheduler": {"name": "onecycle"}, "train": {"epochs": epochs, "seed": 0}}))
    main_py("train", str(config), "--run-dir", str(work / "run"))
    return work / "run"


def timed(fn, runs: int) -> float:
    for _ in range(3):
        fn()
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def side_by_side(run: Path, exports: Path, repeats: int) -> dict:
    """Latency and throughput of fp32 and int8 ONNX, fp32 and int8 OpenVINO and the checkpoint, in interleaved
    rounds."""
    import onnxruntime
    import torch

    from trainer.core.rundir import RunDir
    from trainer.deploy.export_data import measure_set
    from trainer.deploy.export_measure import sample_images
    from trainer.deploy.inference import Preprocess, load_run_model

    checkpoint = load_run_model(RunDir(run))
    pre = Preprocess.from_record(checkpoint.state["preprocess"], exported=True)
    images, _ = measure_set(RunDir(run), checkpoint.classes)
    x = pre.to_input(sample_images(images, pre.frame, pre.decode))
    net = checkpoint.net.to(memory_format=torch.contiguous_format)
    sessions = {name: onnxruntime.InferenceSession(str(exports / f"model{suffix}"), providers=["CPUExecutionProvider"])
                for name, suffix in (("onnx fp32", ".onnx"), ("onnx int8", ".int8.onnx"))}
    runners = {name: (lambda b, s=s: s.run(None, {"images": x[:b].numpy()})) for name, s in sessions.items()}
    import openvino as ov

    for name, suffix in (("openvino fp32", ".openvino"), ("openvino int8", ".int8.openvino")):
        compiled = ov.Core().compile_model(str(exports / f"model{suffix}" / "model.xml"), "CPU")
        runners[name] = lambda b, c=compiled: c([x[:b].numpy()])
    runners["checkpoint (PyTorch fp32)"] = lambda b: net(x[:b])
    rounds: dict[str, dict[str, list[float]]] = {name: {"batch1_ms": [], "images_per_s": []} for name in runners}
    with torch.inference_mode():
        for r in range(repeats):
            order = list(runners)[r % len(runners):] + list(runners)[:r % len(runners)]
            for name in order:
                rounds[name]["batch1_ms"].append(1000 * timed(lambda n=name: runners[n](1), 50))
                rounds[name]["images_per_s"].append(32 / timed(lambda n=name: runners[n](32), 10))
    return {name: {k: statistics.median(v) for k, v in m.items()} | {"rounds": m} for name, m in rounds.items()}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--size", type=int, default=224)
    parser.add_argument("--epochs", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    folder = photos(DATA / "auto-photos")
    with tempfile.TemporaryDirectory(prefix="bench-deploy-") as tmp:
        work = Path(tmp)
        started = time.time()
        run = train(folder, work, args.size, args.epochs)
        print(f"trained in {time.time() - started:.0f} s: {run}", flush=True)
        cards = {}
        for fmt, suffix, extra in EXPORTS:
            out = work / "exports" / f"model{suffix}"
            started = time.time()
            main_py("export", str(run), "--format", fmt, "--out", str(out), *extra)
            card = json.loads(Path(f"{out}.json").read_text())
            cards[out.name] = {"format": fmt, "options": extra, "export_s": time.time() - started,
                               "bytes": card["file"]["bytes"], "metrics": card["metrics"], "speed": card["speed"],
                               "conversion": card.get("conversion")}
            print(f"{out.name}: {json.dumps(cards[out.name]['metrics'])}", flush=True)
        speed = side_by_side(run, work / "exports", args.repeats)
    result = {"machine": machine(), "size": args.size, "epochs": args.epochs, "repeats": args.repeats,
              "exports": cards, "side_by_side": speed}
    save_result("deploy", result)
    fp32 = cards["model.onnx"]
    print(f"\n{machine()}; resnet18 at {args.size} px, {args.epochs} epochs; test split "
          f"{fp32['metrics']['images']} images")
    print("| file | size | vs fp32 | test top-1 | agreement | card's batch-1 latency |")
    print("|---|---|---|---|---|---|")
    for name, c in cards.items():
        print(f"| {name} | {c['bytes'] / 1e6:.1f} MB | {c['bytes'] / fp32['bytes']:.0%} | "
              f"{100 * c['metrics']['top1']:.1f}% | {100 * c['metrics']['agreement']:.1f}% | "
              f"{c['speed']['batch1_ms']:.2f} ms |")
    base = speed["onnx fp32"]
    print(f"\nside by side, medians of {args.repeats} interleaved rounds:")
    print("| runtime | batch-1 latency | speed-up vs fp32 ONNX | images/s at batch 32 | vs fp32 ONNX |")
    print("|---|---|---|---|---|")
    for name, s in speed.items():
        print(f"| {name} | {s['batch1_ms']:.2f} ms | {base['batch1_ms'] / s['batch1_ms']:.2f}x | "
              f"{s['images_per_s']:.0f} | {s['images_per_s'] / base['images_per_s']:.2f}x |")


if __name__ == "__main__":
    main()
