"""GPU throughput: resnet50 at 224 px with mixed precision, `main.py train` against a plain loop in the style of
torchvision's reference recipe, with the GPU-resident cache on and off (and no cache at all: DataLoader workers
decoding into pinned memory), and the images/s per GPU against NVIDIA's published ResNet-50 training figures.

Run it through `bench/gpu.sh` (made to finish in under 5 minutes on one GPU). `--smoke` runs the same steps on the
CPU with a tiny dataset and image size, in well under a minute: the test suite runs it, so the script stays working
on machines that never see a GPU.

python bench/gpu.py [--smoke] [--results FILE]
"""

import argparse
import json
import os
import statistics
import time
from pathlib import Path

from common import REPO, bench_config, machine, photo_dataset, run_json, scratch, train_cli

# NVIDIA DeepLearningExamples, PyTorch ResNet50 v1.5, "Training performance results" (pytorch-21.03 NGC container,
# 1 GPU, mixed precision, batch 256, DALI): images/s. No H100/H200 figure is published there; on those, the A100
# figure is the reference and the report says so.
PUBLISHED = {"A100": 2470, "V100": 1200}
PUBLISHED_SOURCE = "NVIDIA DeepLearningExamples, PyTorch/Classification/ConvNets/resnet50v1.5 (1 GPU, AMP)"

TRAINER_VARIANTS = {
    "trainer, GPU-resident cache": ["data.cache=memory", "data.gpu_cache=true"],
    "trainer, host cache, pinned copies one batch ahead": ["data.cache=memory", "data.gpu_cache=false"],
    "trainer, no cache (DataLoader workers decode)": ["data.cache=none"],
}


def published_reference(gpu_name: str) -> tuple[str, int] | None:
    for key, rate in PUBLISHED.items():
        if key in gpu_name:
            return key, rate
    return ("A100", PUBLISHED["A100"]) if gpu_name != "no GPU" else None


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--smoke", action="store_true", help="CPU, tiny: checks that every step of the script runs")
    parser.add_argument("--results", type=Path, default=REPO / "bench" / "results" / "gpu.json")
    args = parser.parse_args()
    import torch

    if not args.smoke and not torch.cuda.is_available():
        raise SystemExit("bench/gpu.py: no CUDA device here; run it on a GPU machine, or with --smoke on the CPU")
    gpu_name = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "no GPU"
    if args.smoke:
        model, size, batch, epochs, per_class, photo = "resnet18", 32, 4, 2, 4, (64, 48)  # the steps, not the speed
    else:
        model, size, batch, epochs, per_class, photo = "resnet50", 224, 256, 5, 500, (400, 300)
    work = scratch("td-gpu-")
    data_root = (work if args.smoke else REPO / "bench" / ".data") / f"gpu-photos-{per_class}"
    started = time.perf_counter()
    data = photo_dataset(data_root, per_class=per_class, size=photo)
    print(f"dataset: {4 * per_class} JPEGs {photo[0]}x{photo[1]} in {time.perf_counter() - started:.0f} s", flush=True)

    # The same work in both: resnet50, batch, epochs, augmentation (random resized crop + flip), mixed precision
    # (fp16 with a loss scaler on the GPU, as the reference recipe and NVIDIA's figures; fp32 in the CPU smoke run),
    # channels_last.
    amp = "fp16" if torch.cuda.is_available() else "none"
    config = bench_config(work / "gpu.yaml", data, size, model, batch, epochs)
    common = [f"train.amp={amp}", "train.memory_format=channels_last", "monitor.log_every=5",
              "checkpoint.every_epochs=1000", f"device.type={'cuda' if torch.cuda.is_available() else 'cpu'}"]
    rows = {}
    plain = run_json([str(REPO / "bench" / "plain_loop.py"), str(data), str(size), str(epochs), model, str(batch),
                      "--gpu"])
    steady = plain["epoch_images_per_s"][1:] or plain["epoch_images_per_s"]
    rows["plain loop (torchvision reference style)"] = statistics.median(steady)
    print(json.dumps({"plain loop": rows["plain loop (torchvision reference style)"]}), flush=True)
    for label, sets in TRAINER_VARIANTS.items():
        if "data.gpu_cache=true" in sets and not torch.cuda.is_available():
            print(f"{label}: needs a GPU (on a CPU it is the host cache below, run once)", flush=True)
            continue
        out = train_cli(config, work / f"run-{len(rows)}", common + sets)
        rows[label] = out["step_images_per_s"]
        print(json.dumps({label: rows[label], "precision": out["precision"], "cache": out["cache"]}), flush=True)

    reference = published_reference(gpu_name)
    plain_rate = rows["plain loop (torchvision reference style)"]
    print(f"\nmachine: {machine()}")
    print(f"{model} at {size} px, batch {batch}, {epochs} epochs, precision {amp}, channels_last; training images/s per "
          f"GPU (the plain loop: median epoch after the first; the trainer: median of its step events)\n")
    header = "| variant | images/s | vs plain loop |"
    if reference:
        header += f" vs NVIDIA's published {reference[0]} ({reference[1]} img/s) |"
    print(header + "\n|---|---|---|" + ("---|" if reference else ""))
    for label, rate in rows.items():
        line = f"| {label} | {rate:.0f} | {rate / plain_rate:.2f} |"
        print(line + (f" {rate / reference[1]:.2f} |" if reference else ""))
    if reference:
        print(f"\npublished figure: {PUBLISHED_SOURCE}")
    args.results.parent.mkdir(parents=True, exist_ok=True)
    args.results.write_text(json.dumps({"machine": machine(), "gpu": gpu_name, "smoke": args.smoke, "model": model,
                                        "size": size, "batch": batch, "epochs": epochs, "amp": amp, "rows": rows,
                                        "published": reference, "wall_s": time.perf_counter() - started}, indent=1))
    print(f"raw numbers: {args.results}  ({time.perf_counter() - started:.0f} s in all)")


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    main()
