"""Pre-flight scan of an ImageFolder tree: classes, images per class, and files that cannot be used.

Torch-free (Pillow only), so the app can run it in a worker thread. The trainer builds its datasets from
the same scan, so what `check-data` reports is exactly what training will use.
"""

from __future__ import annotations

import logging
import os
import unicodedata
import warnings
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from PIL import Image, UnidentifiedImageError

from trainer.core.errors import InputError
from trainer.core.files import is_regular_file

IMAGE_EXTENSIONS = (".jpg", ".jpeg", ".png", ".ppm", ".bmp", ".pgm", ".tif", ".tiff", ".webp", ".gif")
IMBALANCE_RATIO = 10  # warn when the largest class has this many times the images of the smallest

log = logging.getLogger(__name__)

# Pillow warns between its pixel limit and twice it and raises above; `open_image` raises above the limit itself.
# Turning the warning into an error per call (warnings.catch_warnings) is not thread-safe: `check_images` runs on
# threads, and one thread's restored filters dropped another's, so a bomb passed as an image (stop 81's CI).
warnings.filterwarnings("ignore", category=Image.DecompressionBombWarning)


class DataError(InputError, ValueError):
    """A dataset that cannot be trained on; the message names the folder or file."""


@dataclass
class ScanResult:
    root: str
    classes: list[str] = field(default_factory=list)
    samples: list[tuple[str, int | tuple[float, ...]]] = field(default_factory=list)  # multi-label: 0/1 per label
    bad_files: list[tuple[str, str]] = field(default_factory=list)
    ignored: int = 0  # hidden files and files without an image extension
    outside: int = 0  # images at the top level, outside any class folder
    warnings: list[str] = field(default_factory=list)
    unbalanced: bool = False  # the largest class has IMBALANCE_RATIO times the images of the smallest, or more
    excluded: int = 0  # images left out by the data.exclude manifest
    relabelled: int = 0  # images given another class by the manifest
    added: int = 0  # images from outside the folder the manifest adds (labelled from a pool)
    image_sizes: list[tuple[int, int]] = field(default_factory=list)  # (width, height) of each usable image
    labels_file: str = ""  # multi-label: the labels file the samples come from (each label then a 0/1 tuple)
    pairs: list[tuple[str, str, int]] = field(default_factory=list)  # multi-label: `together()`, where it was asked
    medians: dict[str, float] = field(default_factory=dict, repr=False, compare=False)  # of image_sizes, once each

    def together(self, top: int = 3) -> list[tuple[str, str, int]]:
        """Multi-label: the pairs of labels most often on one image, (a, b, images), most first."""
        pairs: Counter = Counter()
        for _, label in self.samples:
            on = [i for i, v in enumerate(label) if v]
            pairs.update((a, b) for k, a in enumerate(on) for b in on[k + 1:])
        return [(self.classes[a], self.classes[b], n) for (a, b), n in pairs.most_common(top)]

    @property
    def counts(self) -> dict[str, int]:
        """Images per class; multi-label (each label a 0/1 tuple, trainer.data.labels) images per label."""
        if self.samples and isinstance(self.samples[0][1], tuple):
            totals = [sum(on) for on in zip(*(label for _, label in self.samples))]
            return {name: int(n) for name, n in zip(self.classes, totals)}
        c = Counter(label for _, label in self.samples)
        return {name: c.get(i, 0) for i, name in enumerate(self.classes)}

    def problems(self) -> list[str]:
        """Reasons this tree cannot be trained on (empty when it can)."""
        out = []
        if not self.classes:
            out.append(f"{self.root}: no class sub-folders (expected one folder per class, e.g. {self.root}/cat/*.jpg)")
        elif len(self.classes) < 2:
            out.append(f"{self.root}: only one class folder ({self.classes[0]}); a classifier needs at least two")
        elif not self.samples:
            out.append(f"{self.root}: no usable images in any class folder")
        return out


def open_image(path: str) -> Image.Image:
    """`Image.open` of a user's image, refused (Image.DecompressionBombError) above Pillow's pixel limit, where Pillow
    itself would only warn up to twice the limit. Thread-safe; the caller closes the image."""
    img = Image.open(path)
    width, height = img.size
    if Image.MAX_IMAGE_PIXELS and width * height > Image.MAX_IMAGE_PIXELS:
        img.close()
        raise Image.DecompressionBombError(f"{width} x {height} = {width * height} pixels, over the limit of "
                                           f"{Image.MAX_IMAGE_PIXELS}")
    return img


def _check_image(path: str, full: bool) -> tuple[str | None, tuple[int, int] | None]:
    """(None, (width, height)) when the image decodes, else (the reason it cannot be used, None)."""
    size = None
    try:
        if os.path.islink(path) and not os.path.exists(path):
            return "broken symbolic link", None
        if os.path.getsize(path) == 0:
            return "empty file (0 bytes)", None
        with open_image(path) as img:
            size = img.size
            if full:
                img.load()
    except PermissionError:
        return "permission denied", None
    except Image.DecompressionBombError as e:
        return f"too large to decode safely ({e})", None
    except UnidentifiedImageError:
        return "not an image (unrecognised format)", None
    except (OSError, SyntaxError, ValueError) as e:
        return f"cannot decode: {e}", None
    return None, size


def check_images(paths: list[str], full: bool, workers: int = 8) -> list[tuple[str | None, tuple[int, int] | None]]:
    """`_check_image` of each path, in order, on a few threads (the decoders release the interpreter lock): the one
    test of what is an image, for class folders and labels files alike (0 bytes, not an image, a bomb, truncated
    with `full`)."""
    with ThreadPoolExecutor(max_workers=max(1, workers)) as pool:
        return list(pool.map(lambda path: _check_image(path, full), paths))


def data_root(*folders: str | os.PathLike | None) -> str:
    """The folder a user's split folders were given as: the one holding train/ val/ test/, or the one folder; the
    reports show paths relative to it."""
    return os.path.commonpath([os.path.abspath(f) for f in folders if f])


def printable_path(path: str, folder: str | os.PathLike | None = None) -> str:
    """A path for a one-line report: relative to `folder` (the one the user gave) when inside it, quoted when it
    holds a newline or another control character."""
    if folder is not None:
        inside = os.path.relpath(path, folder)
        path = path if inside.startswith(os.pardir) else inside
    return path if path.isprintable() else repr(path)


def scan_image_folder(root: str | os.PathLike, *, full: bool = True, workers: int = 8, manifest=None,
                      additions: bool = False, check: bool = True) -> ScanResult:
    """Scan `root`; `full` decodes every image (finds truncated files), else only headers are read; without `check`
    no file is opened (every file named as an image is a sample, `image_sizes` stays empty: for a caller that decodes
    each image itself and lists the ones it cannot, as the audit's pass does; 25 s of 100,000 images; no class-balance
    warning either). A `manifest`
    (trainer.data.manifest.Manifest) leaves images out or gives them another class, and (`additions`: `root` is the
    training folder) adds the images it labels from elsewhere; the files are not touched.

    Symbolic links are followed, but a folder is scanned once (a link loop is reported, not followed round)
    and a file reached through two paths is used once.
    """
    root_path = check_folder(root)
    result = ScanResult(root=str(root_path))
    try:
        entries = sorted(os.scandir(root_path), key=lambda e: e.name)
    except PermissionError as e:
        raise DataError(f"{root}: permission denied") from e
    result.classes, loops_back = _class_folders(root_path, entries)
    result.warnings += [f"{printable_path(p)}: links back to the dataset folder itself; not a class" for p in loops_back]
    for e in entries:
        if not e.is_dir():
            if e.name.lower().endswith(IMAGE_EXTENSIONS) and not e.name.startswith("."):
                result.outside += 1
            else:
                result.ignored += 1

    found: list[tuple[str, int]] = []
    seen_dirs: set[tuple[int, int]] = {_dir_key(root_path)}
    loops = []
    for label, name in enumerate(result.classes):
        before = len(found)
        for dirpath, dirnames, filenames in os.walk(root_path / name, followlinks=True):
            key = _dir_key(dirpath)
            if key in seen_dirs:
                loops.append(dirpath)
                dirnames[:] = []
                continue
            seen_dirs.add(key)
            dirnames[:] = sorted(d for d in dirnames if not d.startswith("."))
            for fname in sorted(filenames):
                if fname.startswith(".") or not fname.lower().endswith(IMAGE_EXTENSIONS):
                    result.ignored += 1
                    continue
                found.append((os.path.join(dirpath, fname), label))
        if len(found) == before:
            result.warnings.append(f"{printable_path(str(root_path / name))}: empty class folder (no images)")
    candidates, twice = _once_each(found)
    if loops:
        result.warnings.append(f"{len(loops)} folder(s) reached again through a symbolic link (a loop or a second "
                               f"path) were scanned once: {', '.join(printable_path(p) for p in loops[:3])}")
    if twice:
        path, first = twice[0]
        result.warnings.append(f"{len(twice)} file(s) reached through two paths were used once, e.g. "
                               f"{printable_path(path)} is {printable_path(first)}")

    if manifest is not None:
        candidates, result.excluded, result.relabelled, result.added = manifest.filter(candidates, result.classes,
                                                                                       additions=additions)
    if not check:
        result.samples = candidates
        return result
    checked = check_images([path for path, _ in candidates], full, workers)
    for (path, label), (reason, size) in zip(candidates, checked):
        if reason is None:
            result.samples.append((path, label))
            result.image_sizes.append(size)
        else:
            result.bad_files.append((path, reason))

    counts = [n for n in result.counts.values() if n > 0]
    if len(counts) >= 2 and max(counts) >= IMBALANCE_RATIO * min(counts):
        result.unbalanced = True
        small = min(result.counts, key=lambda k: result.counts[k] or float("inf"))
        big = max(result.counts, key=result.counts.get)
        result.warnings.append(f"very unbalanced classes: {big} has {result.counts[big]} images, "
                               f"{small} has {result.counts[small]}")
    return result


def _class_folders(root: Path, entries: list[os.DirEntry]) -> tuple[list[str], list[str]]:
    """The class folders among `root`'s entries (sorted; hidden ones skipped), and the paths of folders that are
    links back to `root` itself (not classes)."""
    root_real = os.path.realpath(root)
    folders = [e for e in entries if e.is_dir() and not e.name.startswith(".")]
    loops_back = [e.path for e in folders if os.path.realpath(e.path) == root_real]
    for e in folders:
        # a newline or a control character in a class name would travel into logs, CSVs and model cards
        if any(unicodedata.category(ch) == "Cc" for ch in e.name):
            raise DataError(f"{printable_path(e.path)}: a class folder whose name holds a control character "
                            f"(a newline, a tab, ...); rename it")
    return [e.name for e in folders if e.path not in loops_back], loops_back


def _once_each(found: list[tuple[str, int]]) -> tuple[list[tuple[str, int]], list[tuple[str, str]]]:
    """Each file once: of the paths that reach one file, the one without a symbolic link in it (its real place,
    with that folder's class), else the first. Returns the kept (path, label) in order, and (dropped, kept) pairs."""
    by_file: dict[str, list[tuple[str, int]]] = {}
    for path, label in found:
        by_file.setdefault(os.path.realpath(path), []).append((path, label))
    keep, twice = set(), []
    for real, items in by_file.items():
        chosen = next((item for item in items if os.path.abspath(item[0]) == real), items[0])
        keep.add(chosen)
        twice.extend((path, chosen[0]) for path, _ in items if path != chosen[0])
    return [item for item in found if item in keep], twice


def _dir_key(path: str | os.PathLike) -> tuple[int, int]:
    st = os.stat(path)
    return st.st_dev, st.st_ino


def check_folder(root: str | os.PathLike) -> Path:
    """`root` as a Path, when it is an existing folder; else a DataError naming it."""
    root_path = Path(root)
    if not root_path.exists():
        raise DataError(f"{root}: folder does not exist")
    if not root_path.is_dir():
        raise DataError(f"{root}: not a folder (expected an ImageFolder: one sub-folder per class)")
    return root_path


def check_same_classes(train: list[str], other: list[str], folder: str, key: str = "data.val_dir") -> None:
    """A validation (or test) folder must have exactly the training folder's classes."""
    if other != train:
        only_train = sorted(set(train) - set(other))
        only_other = sorted(set(other) - set(train))
        what = key.removeprefix("data.").removesuffix("_dir")
        raise DataError(f"{key}: {folder} has different classes from data.train_dir "
                        f"(only in train: {only_train or '-'}; only in {what}: {only_other or '-'})")


SPLIT_NAMES = {"train": ("train",), "val": ("val", "valid", "validation"), "test": ("test",)}


def find_layout(folder: str | os.PathLike) -> dict:
    """{train_dir, val_dir, test_dir}: a dataset folder's own splits, when it is laid out as FOLDER/train with val/
    and/or test/ beside it, else FOLDER alone. Given the train/ of such a folder, its parent's splits: the same
    dataset is split the same way whichever of the two the user picked. (The one rule: the Dataset page and Auto
    ask it.)"""
    folder = Path(folder)
    for root in (folder, folder.parent):
        try:  # scandir's entry types: no stat per file, however many images the folder holds
            with os.scandir(root) as entries:
                subs = {e.name.lower(): e.path for e in entries if e.is_dir()}
        except OSError:
            continue
        found = {split: next((subs[n] for n in names if n in subs), None) for split, names in SPLIT_NAMES.items()}
        if found["train"] and (found["val"] or found["test"]) and (root == folder or Path(found["train"]) == folder):
            return {"train_dir": found["train"], "val_dir": found["val"], "test_dir": found["test"]}
    return {"train_dir": str(folder), "val_dir": None, "test_dir": None}


def image_paths(folder: str | os.PathLike) -> list[str]:
    """Every image file under `folder` at any depth, sorted: the one walker of user folders outside training (predict,
    calibration). Hidden entries are skipped, each folder is walked once (a link loop is not followed round), and only
    regular files are listed (a FIFO named img.png hung the reader)."""
    found: list[str] = []
    seen: set[tuple[int, int]] = set()
    for dirpath, dirnames, filenames in os.walk(folder, followlinks=True):
        try:
            key = _dir_key(dirpath)
        except OSError:
            dirnames[:] = []
            continue
        if key in seen:
            dirnames[:] = []
            continue
        seen.add(key)
        dirnames[:] = sorted(d for d in dirnames if not d.startswith("."))
        found += [path for path in (os.path.join(dirpath, f) for f in filenames
                                    if not f.startswith(".") and f.lower().endswith(IMAGE_EXTENSIONS))
                  if is_regular_file(path)]
    return sorted(found)


def quick_layout(root: str | os.PathLike) -> list[str]:
    """The class folders of `root`, checked without decoding anything (pre-flight before a run starts).

    A DataError when the folder is missing, is a file, has fewer than two class folders, or no images at all.
    """
    root_path = check_folder(root)
    try:
        classes, _ = _class_folders(root_path, sorted(os.scandir(root_path), key=lambda e: e.name))
    except PermissionError as e:
        raise DataError(f"{root}: permission denied") from e
    if not classes:
        raise DataError(f"{root}: no class sub-folders (expected one folder per class, e.g. {root}/cat/*.jpg)")
    if len(classes) < 2:
        raise DataError(f"{root}: only one class folder ({classes[0]}); a classifier needs at least two")
    for name in classes:
        for _dirpath, _dirnames, filenames in os.walk(root_path / name, followlinks=True):
            if any(f.lower().endswith(IMAGE_EXTENSIONS) and not f.startswith(".") for f in filenames):
                return classes
    raise DataError(f"{root}: no images in any class folder (looked for {', '.join(IMAGE_EXTENSIONS)})")


def format_report(result: ScanResult) -> str:
    """The human-readable report printed by `check-data` (one line per item, whatever the file names hold)."""
    lines = [f"{printable_path(result.root)}: {len(result.classes)} classes, {len(result.samples)} usable images"]
    names = [printable_path(c) for c in result.classes]
    width = max((len(c) for c in names), default=0)
    for name, n in zip(names, result.counts.values()):
        lines.append(f"  {name:<{width}}  {n}")
    if result.bad_files:
        lines.append(f"{len(result.bad_files)} files cannot be used:")
        lines.extend(f"  {printable_path(path)}: {reason}" for path, reason in result.bad_files)
    if result.excluded or result.relabelled or result.added:
        lines.append(f"the manifest leaves out {result.excluded} images, relabels {result.relabelled} and adds "
                     f"{result.added}")
    if result.outside:
        lines.append(f"{result.outside} images at the top level are outside any class folder and are not used "
                     f"(move them into a class folder)")
    if result.ignored:
        lines.append(f"{result.ignored} hidden or non-image files ignored")
    lines.extend(f"warning: {w}" for w in result.warnings)
    lines.extend(f"error: {p}" for p in result.problems())
    return "\n".join(lines)
