"""Duplicates and leaks (issue #35): images that are the same, within a split or across train/val/test. Torch-free.

A copy of a test image in the training set makes the test score a lie (the network has seen the answer); a copy
filed under two classes is a label error by construction.

- Exact copies (`find_duplicates`): files are grouped by size first and only files that share a size are read
  (streamed, BLAKE2b), so a folder of unique images costs one `stat` per file.
- Near copies (`find_near_duplicates`: resized or recompressed): from what the audit computes of each image, its
  embedding (a run's network) and a 16 px colour thumbnail. Each image's nearest neighbours by either are the
  candidates; a pair is a copy when its grey 8 px thumbnails correlate at NEAR_PIXELS or more and its colour
  thumbnails differ by NEAR_COLOUR at most (`is_copy`). The embeddings alone cannot say
  it: a classifier puts two different images of one class as close as an image and its JPEG copy (measured in
  docs/data.md).
"""

from __future__ import annotations

import hashlib
import os
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field

import numpy as np

from trainer.core.predictions import read_predictions
from trainer.data.scan import printable_path

CHUNK = 1 << 20
PREFIX = 64 << 10  # same-sized files are compared on this many first bytes before they are read whole


@dataclass(frozen=True)
class ImageRef:
    split: str  # train, val or test
    path: str
    label: str  # its class


PAIRS_AT_ONCE = 65_536  # candidate pairs compared at once (two rows of grey thumbnails each: 34 MB)
NEAR_NEIGHBOURS = 5  # candidates: each image's nearest by embedding and by thumbnail
SHAPE_SIDE = 8  # px of the grey thumbnail whose correlation compares shapes: coarse enough that a copy resized
# to half its size still correlates at 0.997 or more
NEAR_PIXELS = 0.996  # a copy: its grey SHAPE_SIDE px thumbnails correlate at least this (the same shapes) ...
NEAR_COLOUR = 0.03  # ... and its colour thumbnails differ by at most this on average (of 1: the same colours);
# both measured on planted copies and look-alikes in bench/copies.py (docs/data.md)


def shapes(colour: np.ndarray) -> np.ndarray:
    """Colour thumbnails (rows of 3 x S x S, 0-1; S a multiple of SHAPE_SIDE) as SHAPE_SIDE px grey ones, zero-mean
    and of unit length: what correlates for an image and its resized or recompressed copy whatever their brightness
    (a flat image: all zeros, like no other)."""
    side = round((colour.shape[1] / 3) ** 0.5)
    cell = max(1, side // SHAPE_SIDE)
    grey = colour.reshape(len(colour), 3, side // cell, cell, side // cell, cell).mean(axis=(1, 3, 5))
    grey = grey.reshape(len(colour), -1)
    grey = grey - grey.mean(axis=1, keepdims=True)
    norm = np.linalg.norm(grey, axis=1, keepdims=True)
    return np.where(norm > 1e-5, grey / np.maximum(norm, 1e-5), 0.0).astype(np.float32)


def colour_difference(a: np.ndarray, b: np.ndarray) -> float:
    """The mean absolute difference of two colour thumbnails (0: the same colours everywhere, 1: black and white)."""
    return float(np.abs(a - b).mean())


def is_copy(a: np.ndarray, b: np.ndarray) -> bool:
    """Two images, by their colour thumbnails, are one image resized or recompressed: the same shapes (grey
    correlation at least NEAR_PIXELS) in the same colours (a difference of at most NEAR_COLOUR). The demo's circles
    of other background and fill colours have the same shapes; their colours differ by 0.06 or more."""
    grey = shapes(np.stack([a, b]))
    return float(grey[0] @ grey[1]) >= NEAR_PIXELS and colour_difference(a, b) <= NEAR_COLOUR


def copy_among(colour: np.ndarray, grey: np.ndarray, rows: list[int], i: int) -> bool:
    """Whether image `i` is a copy (`is_copy`) of one of `rows`, given every image's colour thumbnail and its
    `shapes`."""
    alike = grey[rows] @ grey[i] >= NEAR_PIXELS
    return bool(alike.any() and (np.abs(colour[rows][alike] - colour[i]).mean(axis=1) <= NEAR_COLOUR).any())


@dataclass
class DuplicateGroup:
    """Files with the same bytes, or (`near`) copies of one image resized or recompressed."""

    images: list[ImageRef]
    near: bool = False
    similarity: float = 1.0  # near: the lowest thumbnail correlation of a pair that joined the group

    @property
    def splits(self) -> list[str]:
        return sorted({i.split for i in self.images})

    @property
    def leak(self) -> bool:
        """The same image in two splits (train and test, say)."""
        return len(self.splits) > 1

    @property
    def labels(self) -> list[str]:
        return sorted({i.label for i in self.images})


@dataclass
class Duplicates:
    groups: list[DuplicateGroup] = field(default_factory=list)
    unreadable: list[tuple[str, str]] = field(default_factory=list)  # (path, why): a file that went while reading

    @property
    def leaks(self) -> list[DuplicateGroup]:
        return [g for g in self.groups if g.leak]

    @property
    def conflicting(self) -> list[DuplicateGroup]:
        """Copies filed under different classes."""
        return [g for g in self.groups if len(g.labels) > 1]

    @property
    def copies(self) -> int:
        """Images beyond the first of each group (what excluding the copies would leave out)."""
        return sum(len(g.images) - 1 for g in self.groups)


def _digest(path: str, limit: int | None = None) -> str:
    """BLAKE2b of the file's bytes (the first `limit` of them when given)."""
    h = hashlib.blake2b(digest_size=16)
    with open(path, "rb") as f:
        left = limit
        while chunk := f.read(CHUNK if left is None else min(CHUNK, left)):
            h.update(chunk)
            if left is not None:
                left -= len(chunk)
                if left <= 0:
                    break
    return h.hexdigest()


def _same_bytes(images: list[ImageRef], size: int, out: Duplicates) -> list[list[ImageRef]]:
    """`images` (all of `size` bytes) grouped by their bytes: first by their first PREFIX bytes, and read whole only
    when those match (a folder of same-sized images is not read whole to find that they differ)."""
    groups: list[list[ImageRef]] = [images]
    for limit in ((PREFIX, None) if size > PREFIX else (None,)):
        split: list[list[ImageRef]] = []
        for group in groups:
            by_digest: dict[str, list[ImageRef]] = defaultdict(list)
            for image in group:
                try:
                    by_digest[_digest(image.path, limit)].append(image)
                except OSError as e:
                    out.unreadable.append((image.path, e.strerror or str(e)))
            split += [g for g in by_digest.values() if len(g) > 1]
        groups = split
    return groups


def find_duplicates(images: Iterable[ImageRef]) -> Duplicates:
    """The groups of byte-identical files among `images`, largest groups first. A file listed twice in one split
    counts once; one file in two splits (a link in test/ to a training image) is a copy across them, a leak."""
    out = Duplicates()
    by_size: dict[int, list[ImageRef]] = defaultdict(list)
    seen: set[tuple[str, str]] = set()
    for image in images:
        real = os.path.realpath(image.path)
        if (real, image.split) in seen:
            continue
        seen.add((real, image.split))
        try:
            by_size[os.stat(real).st_size].append(image)
        except OSError as e:
            out.unreadable.append((image.path, e.strerror or str(e)))
    for size, same_size in by_size.items():
        if len(same_size) < 2:
            continue
        out.groups += [DuplicateGroup(sorted(g, key=lambda i: (i.split != "train", i.path)))
                       for g in _same_bytes(same_size, size, out)]
    out.groups.sort(key=lambda g: (-len(g.images), g.images[0].path))
    return out


def _pair_keys(found: np.ndarray) -> np.ndarray:
    """Row i's neighbours `found[i]` as keys i * n + j of the pairs (i < j), each row's own index and faiss's -1
    (none) left out."""
    n = len(found)
    i = np.repeat(np.arange(n, dtype=np.int64), found.shape[1])
    j = found.ravel().astype(np.int64)
    real = (j != i) & (j >= 0)
    i, j = i[real], j[real]
    return np.minimum(i, j) * n + np.maximum(i, j)


def find_near_duplicates(images: list[ImageRef], embeddings, thumbnails) -> Duplicates:
    """The groups of copies among `images` (row i of `embeddings` and of the colour `thumbnails` is image i), most
    alike first; a group whose files are also byte-identical is not `near`."""
    from trainer.data.neighbours import nearest

    n = len(images)
    if n < 2:
        return Duplicates()
    grey = shapes(thumbnails)
    k = min(NEAR_NEIGHBOURS + 1, n)
    # each image's nearest by embedding (centred: a copy's direction from the mean), then by shape; a pair's key
    # i * n + j (i < j), in numpy: at 100,000 images a million candidates, not a set of tuples
    keys = np.unique(np.concatenate([_pair_keys(nearest(embeddings - embeddings.mean(axis=0), k, near_only=True)[1]),
                                     _pair_keys(nearest(grey, k, near_only=True)[1])]))
    copies = []  # the candidates that are copies: (i, j, how alike)
    for chunk in range(0, len(keys), PAIRS_AT_ONCE):
        i, j = np.divmod(keys[chunk:chunk + PAIRS_AT_ONCE], n)
        alike = np.einsum("ij,ij->i", grey[i], grey[j])
        near = np.flatnonzero(alike >= NEAR_PIXELS)
        colour = np.abs(thumbnails[i[near]] - thumbnails[j[near]]).mean(axis=1)
        copies += [(int(i[c]), int(j[c]), float(alike[c])) for c in near[colour <= NEAR_COLOUR]]
    parent = list(range(n))

    def root(i: int) -> int:
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = parent[i]
        return i

    lowest: dict[int, float] = {}
    for i, j, alike in copies:
        a, b = root(i), root(j)
        parent[b] = a
        lowest[a] = min(alike, lowest.pop(b, 1.0), lowest.get(a, 1.0))
    members: dict[int, list[int]] = defaultdict(list)
    for i in range(n):
        members[root(i)].append(i)
    out = Duplicates()
    for top, rows in members.items():
        if len(rows) > 1:
            group = sorted((images[r] for r in rows), key=lambda i: (i.split != "train", i.path))
            same_bytes = find_duplicates(group).groups
            exact = len(same_bytes) == 1 and len(same_bytes[0].images) == len(group)
            out.groups.append(DuplicateGroup(group, near=not exact, similarity=lowest.get(top, 1.0)))
    out.groups.sort(key=lambda g: (-g.similarity, g.images[0].path))
    return out


def format_duplicates(found: Duplicates, folder: str | os.PathLike, limit: int = 10,
                      what: str = "exact duplicates") -> list[str]:
    """The lines `check-data` prints: a summary, then the leaks and the conflicting copies first (at most `limit`),
    each image's path relative to `folder`, the one the user gave."""
    if not found.groups:
        return [f"{what}: none"]
    lines = [f"{what}: {len(found.groups)} group(s), {found.copies} copy(ies); {len(found.leaks)} leak(s) "
             f"across splits, {len(found.conflicting)} filed under different classes"]
    shown = sorted(found.groups, key=lambda g: (not g.leak, len(g.labels) < 2))[:limit]
    for g in shown:
        what = "leak" if g.leak else "different classes" if len(g.labels) > 1 else "copy"
        members = " = ".join(printable_path(i.path, folder) for i in g.images)
        lines.append(f"  {what}: {members}")
    if len(found.groups) > limit:
        lines.append(f"  ... and {len(found.groups) - limit} more group(s) (--json lists them all)")
    return lines


@dataclass
class LeakWorth:
    images: int  # test images the run was scored on
    correct: int
    leaked: int  # of them, copies of a training or validation image
    correct_without: int  # correct among the others

    def line(self) -> str:
        with_all = self.correct / self.images
        rest = self.images - self.leaked
        if not self.leaked or not rest:
            return f"the run's test accuracy: {with_all:.1%} on {self.images} images; none of them is a leak"
        without = self.correct_without / rest
        return (f"the run's test accuracy: {with_all:.1%} on {self.images} images; without the {self.leaked} leaked ones "
                f"{without:.1%} on {rest}: the leak was worth {100 * (with_all - without):+.1f} points")


def leak_worth(predictions_csv: str | os.PathLike, found: Duplicates) -> LeakWorth:
    """A run's test accuracy with and without the test images that are copies of another split's (its
    `eval/test/predictions.csv`, as `main.py evaluate` writes it)."""
    leaked = {os.path.realpath(i.path) for g in found.leaks for i in g.images if i.split == "test"}
    images = correct = n_leaked = correct_without = 0
    for row in read_predictions(predictions_csv):
        images, correct = images + 1, correct + row.correct
        if os.path.realpath(row.path) in leaked:
            n_leaked += 1
        else:
            correct_without += row.correct
    return LeakWorth(images, correct, n_leaked, correct_without)
