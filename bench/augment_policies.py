"""The augmentation policies' cost: images/s of the run's batch augmentation (`BatchAugment`: its per-sample draws,
then MixUp/CutMix and the normalisation) with each policy on, side by side with today's default (flip + crop), on
real photographs (scikit-image's) at 64 and 128 px, batch 64; alternated, medians of --repeats. The last rows do
the default's flip and crop, and the colour jitter, with Albumentations per image instead (data.augment.albumentations),
and with kornia's batched `augmentation` module where kornia is installed (not a dependency: for the comparison).

python bench/augment_policies.py [--repeats 7] [--device cpu|cuda]   (on a GPU: --device cuda, nothing else changes)
"""

import argparse
import json
import statistics
import time

from common import machine, save_result

POLICIES = {  # what is on besides nothing: today's default first, then each policy on top of it
    "none": {"hflip": False, "random_resized_crop": False},
    "flip + crop (the default)": {},
    "+ colour jitter 0.3": {"color_jitter": 0.3},
    "+ TrivialAugment (torchvision, per image)": {"policy": "trivial_augment"},
    "+ RandAugment (torchvision, per image)": {"policy": "rand_augment"},
    "+ random erasing 0.5": {"random_erasing": 0.5},
    "+ MixUp 0.2": {"mixup": 0.2},
    "+ CutMix 1.0": {"cutmix": 1.0},
    "+ all four": {"color_jitter": 0.3, "random_erasing": 0.5, "mixup": 0.2, "cutmix": 1.0},
    # the same operations by Albumentations, per image on the CPU (data.augment.albumentations), to compare
    "flip + crop by Albumentations instead": lambda size: {
        "hflip": False, "random_resized_crop": False,
        "albumentations": [{"HorizontalFlip": {"p": 0.5}}, {"RandomResizedCrop": {"size": [size, size],
                                                                                  "scale": [0.6, 1.0]}}]},
    "+ colour jitter 0.3 by Albumentations": lambda size: {"albumentations": [{"ColorJitter": {
        "brightness": 0.3, "contrast": 0.3, "saturation": 0.3, "hue": 0.0, "p": 1.0}}]},
}


class KorniaBatch:
    """kornia's `augmentation` module on the same batch, per sample on the device, then the same normalisation: the
    call shape of BatchAugment (`augment(batch, generator)`, `mix`), for the timing loop."""

    def __init__(self, ops, device):
        import kornia.augmentation as K
        import torch

        self.pipeline = K.AugmentationSequential(*ops)
        self.mean = torch.tensor([0.485, 0.456, 0.406], device=device).view(1, 3, 1, 1)
        self.std = torch.tensor([0.229, 0.224, 0.225], device=device).view(1, 3, 1, 1)

    def __call__(self, batch, generator):
        return (self.pipeline(batch.float() / 255) - self.mean) / self.std

    def mix(self, x, y, generator, classes):
        return x, y


def kornia_variants(size: int, device) -> dict:
    """The default's flip and crop, and colour jitter on top, by kornia (when it is installed)."""
    try:
        import kornia.augmentation as K
    except ImportError:
        return {}
    flip_crop = [K.RandomHorizontalFlip(p=0.5), K.RandomResizedCrop((size, size), scale=(0.6, 1.0))]
    return {"flip + crop by kornia instead": KorniaBatch(flip_crop, device),
            "+ colour jitter 0.3 by kornia": KorniaBatch(
                flip_crop + [K.ColorJitter(0.3, 0.3, 0.3, 0.0, p=1.0)], device)}


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--batches", type=int, default=20, help="batches per timing")
    args = parser.parse_args()
    import numpy as np
    import torch
    from PIL import Image
    from skimage import data

    from trainer.core.config import AugmentConfig
    from trainer.data.loader import BatchAugment

    device = torch.device(args.device)
    photos = [data.astronaut(), data.coffee(), data.chelsea(), data.rocket()]
    results = {}
    for size in (64, 128):
        batch = torch.stack([torch.from_numpy(np.asarray(Image.fromarray(photos[i % 4]).convert("RGB")
                                                         .resize((size, size))).copy()).permute(2, 0, 1)
                             for i in range(64)]).to(device)
        labels = torch.arange(64, device=device) % 4
        augments = {name: BatchAugment(AugmentConfig(**{"hflip": True, "crop_scale_min": 0.6,
                                                        **(on(size) if callable(on) else on)}),
                                       [0.485, 0.456, 0.406], [0.229, 0.224, 0.225], device)
                    for name, on in POLICIES.items()}
        augments.update(kornia_variants(size, device))
        times = {name: [] for name in augments}
        for _ in range(args.repeats):
            for name, augment in augments.items():  # alternated: a busy moment hits every policy alike
                g = torch.Generator().manual_seed(0)
                if device.type == "cuda":
                    torch.cuda.synchronize()
                start = time.perf_counter()
                for _ in range(args.batches):
                    augment.mix(augment(batch, g), labels, g, 4)
                if device.type == "cuda":
                    torch.cuda.synchronize()
                times[name].append(64 * args.batches / (time.perf_counter() - start))
        results[size] = {name: statistics.median(rates) for name, rates in times.items()}
    save_result("augment_policies", {"machine": machine(), "device": args.device, "repeats": args.repeats,
                                     "images_per_s": results})
    print(f"machine: {machine()}; device {args.device}; batch 64; medians of {args.repeats}\n")
    print("| augmentation | 64 px images/s | vs default | 128 px images/s | vs default |\n|---|---|---|---|---|")
    base = {size: results[size]["flip + crop (the default)"] for size in results}
    for name in results[64]:
        print(f"| {name} | {results[64][name]:,.0f} | {results[64][name] / base[64]:.2f} | "
              f"{results[128][name]:,.0f} | {results[128][name] / base[128]:.2f} |")
    print(json.dumps(results))


if __name__ == "__main__":
    main()
