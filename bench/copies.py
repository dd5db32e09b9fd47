"""What tells a copy from a look-alike (issue #69): the audit's near-copy rule on planted copies and on look-alike
images of one class.

For each folder (the demo's shapes, real digits, the photo JPEGs), a share of its images is copied into a scratch
folder resized (50% and 150%), recompressed (JPEG quality 40 and 75) or both. Every image and copy is decoded as the
audit decodes it (at the size the run would train at) and made into the audit's thumbnails. Printed, per folder:
- planted copies: the grey thumbnails' correlation and the colour difference (mean absolute, of 255) to the original;
- look-alikes: each original's nearest other original of its class by grey correlation, the same two figures;
- what the rule (`trainer.data.duplicates.is_copy`) calls copies of each: all planted copies should be, no look-alike.

    .venv/bin/python bench/copies.py [--share 0.1]
"""

from __future__ import annotations

import argparse
import random
import sys
from pathlib import Path

import numpy as np
from common import REPO, machine, photo_jpegs, save_result, scratch

sys.path.insert(0, str(REPO))

FOLDERS = {"demo": (None, 48), "digits": (REPO / "bench" / ".data" / "auto-digits" / "train", 32),
           "jpegs": (None, 64)}
KINDS = ("resized 50%", "resized 150%", "JPEG q40", "JPEG q75", "resized 50% + JPEG q75")


def plant(original: Path, out: Path, kind: str) -> Path:
    """A copy of `original` as a user's folder gets them: resized, recompressed, or both."""
    from PIL import Image

    with Image.open(original) as im:
        im = im.convert("RGB")
        if kind.startswith("resized"):
            scale = int(kind.split()[1].rstrip("%")) / 100
            im = im.resize((max(8, round(im.width * scale)), max(8, round(im.height * scale))),
                           Image.Resampling.BICUBIC)
        quality = int(kind.rsplit("q", 1)[1]) if "JPEG" in kind else None
        path = out.with_suffix(".jpg" if quality else ".png")
        im.save(path, quality=quality) if quality else im.save(path)
    return path


def measure(name: str, folder: Path, size: int, share: float, work: Path) -> dict:
    import torch

    from trainer.data.duplicates import colour_difference, is_copy, shapes
    from trainer.data.frame import Frame
    from trainer.data.loader import decode_image
    from trainer.data.scan import scan_image_folder
    from trainer.deploy.audit import thumbnails

    scan = scan_image_folder(folder, check=False)
    rng = random.Random(0)
    originals = [(p, label) for p, label in scan.samples]
    picked = rng.sample(range(len(originals)), max(len(KINDS), round(share * len(originals))))
    planted = []  # (index of the original, kind, path of the copy)
    for n, i in enumerate(picked):
        kind = KINDS[n % len(KINDS)]
        planted.append((i, kind, plant(Path(originals[i][0]), work / f"{name}-{n:04d}", kind)))
    frame = Frame(size, size)
    decoded = torch.stack([decode_image(p, frame) for p, _ in originals] + [decode_image(str(p), frame)
                                                                            for _, _, p in planted])
    colour = thumbnails(decoded)
    grey = shapes(colour)
    n = len(originals)
    labels = np.asarray([label for _, label in originals])
    copies = {kind: [] for kind in KINDS}
    for k, (i, kind, _) in enumerate(planted):
        a, b = colour[i], colour[n + k]
        copies[kind].append((float(grey[i] @ grey[n + k]), colour_difference(a, b), is_copy(a, b)))
    alike = grey[:n] @ grey[:n].T
    np.fill_diagonal(alike, -2)
    alike[labels[:, None] != labels[None, :]] = -2  # look-alikes of one class
    look = []
    for i in range(n):
        j = int(alike[i].argmax())
        look.append((float(alike[i, j]), colour_difference(colour[i], colour[j]), is_copy(colour[i], colour[j]),
                     originals[i][0], originals[j][0]))
    return {
        "images": n, "size": size,
        "planted": {kind: {"n": len(rows), "found": sum(r[2] for r in rows),
                           "correlation_min": min(r[0] for r in rows),
                           "colour_difference_max": max(r[1] for r in rows)} for kind, rows in copies.items()},
        "look_alikes": {"n": n, "called_copies": sum(r[2] for r in look),
                        "correlation_max": max(r[0] for r in look),
                        "over_0.995": sum(r[0] >= 0.995 for r in look),
                        "colour_difference_of_those_min": min((r[1] for r in look if r[0] >= 0.995), default=None),
                        "called_copies_pairs": sorted({tuple(sorted(r[3:])) for r in look if r[2]})},
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--share", type=float, default=0.1, help="share of each folder's images copied")
    args = parser.parse_args()
    from trainer.data.demo_data import demo_dataset_dir

    work = scratch("bench-copies-")
    results = {}
    for name, (folder, size) in FOLDERS.items():
        if name == "demo":
            folder = demo_dataset_dir()
        elif name == "jpegs":
            folder = photo_jpegs(REPO / "bench" / ".data" / "photo_jpegs") / "train"
        results[name] = measure(name, folder, size, args.share, work)
        print(name, results[name], flush=True)
    save_result("copies", {"machine": machine(), "share": args.share, "results": results})


if __name__ == "__main__":
    main()
