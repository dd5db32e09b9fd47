"""What the network is shown: a few training images decoded and augmented as a run does it (`main.py
augment-preview`; the Dataset page's preview, issue #47).

The images come from the training split a run with the same config and seed would use; data.augment's auto values
are decided by the trainer's own rule on that split (`suggest.resolve_augment`), and the crops, flips and colour
jitter are the run's own batch augmentation (`loader.BatchAugment`), each draw with a generator of its own seed.
"""

from __future__ import annotations

import random
from pathlib import Path
from types import SimpleNamespace

from trainer.core.config import RunConfig
from trainer.data.scan import DataError

# what the preview depends on: another value of any of these draws another (the Dataset page asks again)
PREVIEW_KEYS = ("data.train_dir", "data.labels", "data.exclude", "data.val_dir", "data.val_labels", "data.val_split",
                "data.test_split", "data.test_dir", "data.image_size", "data.image_width", "data.resize", "data.augment",
                "train.seed")
AUGMENT_KEYS = ("hflip", "random_resized_crop", "crop_scale_min", "color_jitter", "policy", "random_erasing", "mixup",
                "cutmix")


def augment_preview(cfg: RunConfig, out: Path, images: int = 4, draws: int = 4, seed: int = 0) -> dict:
    """`images` training images (of different classes where there are enough), each as decoded for the network and
    in `draws` augmented versions, written as PNG files into `out`; what was drawn and how data.augment was
    decided, as JSON-ready data."""
    import torch

    from trainer.data.frame import Frame
    from trainer.data.loader import BatchAugment, decode_image, training_samples
    from trainer.data.suggest import resolve_augment

    data = cfg.data
    classes, train = training_samples(data, cfg.train.seed)
    decided = resolve_augment(data.augment, SimpleNamespace(classes=classes, samples=train,
                                                            labels_file=bool(data.labels)))
    decoded, kept, frame = [], [], Frame.of(data)
    for path, label in pick(train, images, seed):
        try:
            decoded.append(decode_image(path, frame))
        except Exception:  # noqa: BLE001 - unusable, whatever the reason: a run leaves it out too
            continue
        kept.append({"path": path, "label": label_text(label, classes)})
    if not decoded:
        raise DataError(f"data.train_dir: {data.train_dir}: none of the training images drawn could be decoded")
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    x = torch.stack(decoded)
    batch_augment = BatchAugment(data.augment, [0.0] * 3, [1.0] * 3, torch.device("cpu"))
    for i, row in enumerate(kept):
        row["original"] = save_png(x[i], out / f"{i}-original.png")
        row["draws"] = []
    labels = torch.arange(len(kept))  # MixUp and CutMix blend the images shown with each other
    for d in range(draws):
        g = torch.Generator().manual_seed(seed * 1000 + d)
        mixed, _ = batch_augment.mix(batch_augment.augment(x.float(), g), labels, g, len(kept))
        augmented = mixed.round().clamp(0, 255).to(torch.uint8)
        for i, row in enumerate(kept):
            row["draws"].append(save_png(augmented[i], out / f"{i}-draw{d + 1}.png"))
    return {"frame": str(frame), "seed": seed, "images": kept, "decided": decided,
            "augment": {key: getattr(data.augment, key) for key in AUGMENT_KEYS}}


def pick(samples: list, count: int, seed: int) -> list:
    """`count` samples drawn with `seed`, one of each label first (then more of the same), in a stable order."""
    shuffled = sorted(samples)
    random.Random(seed).shuffle(shuffled)
    seen, first, rest = set(), [], []
    for sample in shuffled:
        (rest if sample[1] in seen else first).append(sample)
        seen.add(sample[1])
    return (first + rest)[:count]


def label_text(label, classes: list[str]) -> str:
    """A class name, or a multi-label image's labels joined ("(no label)" for none)."""
    if isinstance(label, int):
        return classes[label]
    return ", ".join(name for name, on in zip(classes, label) if on) or "(no label)"


def save_png(image, path: Path) -> str:
    """A (3, H, W) uint8 tensor as a PNG file; its path."""
    from PIL import Image

    Image.fromarray(image.permute(1, 2, 0).contiguous().numpy()).save(path)
    return str(path)
