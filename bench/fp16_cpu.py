"""fp16 with a GradScaler on a CPU, on real photos: the configuration of issue #22 that diverged at step 3.

resnet18 from scratch on scikit-learn's handwritten digits (1,797 real scans, 8x8 grey, upscaled to 32 px, 10
classes; 1,438 train / 359 val), SGD lr 0.05, momentum 0.9, batch 64, `device.type: cpu`. fp16 and fp32 runs are
interleaved (one of each per seed). Before the fix every fp16 run ended `diverged` at step 3; the cause was fused
SGD's momentum buffers, created uninitialised on the GradScaler-skipped first step (trainer/train/optim.py:
fill_momentum_buffers).

python bench/fp16_cpu.py [--seeds 1] [--epochs 4]     (needs scikit-learn for the digits: pip install scikit-learn)
"""

import argparse
import statistics
from pathlib import Path

import numpy as np
import yaml
from common import REPO, machine, save_result, scratch, train_cli

SGD = {"name": "sgd", "lr": 0.05, "momentum": 0.9}


def digits_folder(root: Path) -> Path:
    """scikit-learn's digits as an ImageFolder of 32 px RGB PNGs (written once)."""
    from PIL import Image
    from sklearn.datasets import load_digits

    if (root / ".done").exists():
        return root
    digits = load_digits()
    for i, (image, label) in enumerate(zip(digits.images, digits.target)):
        folder = root / str(label)
        folder.mkdir(parents=True, exist_ok=True)
        pixels = (image / 16 * 255).astype(np.uint8)
        Image.fromarray(pixels).resize((32, 32), Image.Resampling.BILINEAR).convert("RGB").save(folder / f"{i:04d}.png")
    (root / ".done").write_text("")
    return root


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--seeds", type=int, default=1)
    parser.add_argument("--epochs", type=int, default=4)
    args = parser.parse_args()
    data = digits_folder(REPO / "bench" / ".data" / "digits")
    work = scratch("td-fp16-")
    config = work / "cfg.yaml"
    config.write_text(yaml.safe_dump({"data": {"train_dir": str(data), "image_size": 32, "batch_size": 64},
                                      "model": {"name": "resnet18"}, "optimizer": SGD,
                                      "train": {"epochs": args.epochs}, "device": {"type": "cpu"}}))
    rows = {"fp16": [], "fp32": []}
    for seed in range(args.seeds):
        for amp in ("fp16", "none"):
            out = train_cli(config, work / f"{amp}-{seed}", [f"train.amp={amp}", f"train.seed={seed}"])
            rows["fp16" if amp == "fp16" else "fp32"].append(out)
            print(f"seed {seed} {amp}: final val_acc {out['final_acc']:.3f}, training {out['training_s']:.0f} s",
                  flush=True)
    table = {k: {"final_acc": statistics.median(r["final_acc"] for r in v),
                 "training_s": statistics.median(r["training_s"] for r in v)} for k, v in rows.items()}
    print(f"\n{machine()}\nresnet18, digits 1,438/359 @32px, SGD 0.05 m0.9, batch 64, {args.epochs} epochs, "
          f"{args.seeds} seed(s), medians")
    for k, v in table.items():
        print(f"  {k}: final val_acc {v['final_acc']:.3f}, training {v['training_s']:.0f} s")
    save_result("fp16_cpu", {"machine": machine(), "epochs": args.epochs, "runs": rows, "medians": table})


if __name__ == "__main__":
    main()
