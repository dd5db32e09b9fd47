"""Datasets, per-epoch batch order and batched augmentation.

Images are decoded to uint8 tensors at the training resolution (resize the short side, centre crop).
With `data.cache: memory | disk` each folder is decoded once through `trainer.data.cache` (and reused by
later runs) and batches are plain indexing; with `none`, DataLoader workers decode each epoch. All feed
the same `BatchAugment`, which runs on whole uint8 batches on the training device, so the cache changes
speed, never pixels.
"""

from __future__ import annotations

import logging
import math
import os
import random
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import psutil
import torch
import torch.nn.functional as F
from PIL import Image, ImageOps

from trainer.core.config import AugmentConfig, DataConfig
from trainer.core.files import is_regular_file
from trainer.core.system import worker_start_method
from trainer.data.cache import ImageStore, Interrupted, Progress, default_cache_dir, open_store
from trainer.data.frame import Frame
from trainer.data.scan import DataError, ScanResult, check_same_classes, open_image, scan_image_folder
from trainer.data.user_pipeline import build_pipeline, run_pipeline

log = logging.getLogger(__name__)

ORIENTATION_TAG = 0x0112  # EXIF
ERASE_AREA = (0.02, 0.33)  # data.augment.random_erasing: the rectangle's share of the image, lowest and highest
ERASE_RATIO = 10 / 3  # and the most its sides differ, either way
TEST_SPLIT_SEED = 7_919  # data.test_split draws with train.seed + this: another draw than validation's
MEMORY_CACHE_FRACTION = 0.25  # `cache: auto` uses memory when the cache fits in this share of free RAM


def decode_image(path: str, frame: Frame) -> torch.Tensor:
    """An image file as a (3, height, width) uint8 tensor: EXIF orientation applied, any mode converted to RGB, fitted
    to `frame` (crop: short side resized, centre crop; pad: long side resized, centred on black)."""
    if not is_regular_file(path):  # opening a FIFO or a device would wait for ever
        raise ValueError("not a regular file (a FIFO, a device or a folder)")
    with open_image(path) as img:  # the scan's pixel limit for every decode
        img.draft("RGB", (frame.width * 2, frame.height * 2))  # JPEG: decode at reduced scale when much larger
        if img.getexif().get(ORIENTATION_TAG, 1) != 1:  # phone photos: upright as the camera meant, not as stored
            img = ImageOps.exif_transpose(img)
        if img.mode in ("I", "I;16", "I;16B", "I;16L", "F"):
            arr = np.asarray(img, dtype=np.float32)
            peak = 65535.0 if img.mode.startswith("I;16") or arr.max() > 255 else 255.0
            img = Image.fromarray(np.clip(arr / peak * 255.0, 0, 255).astype(np.uint8))
        if img.mode in ("RGBA", "LA", "PA") or (img.mode == "P" and "transparency" in img.info):
            img = img.convert("RGBA")
            background = Image.new("RGBA", img.size, (255, 255, 255, 255))
            img = Image.alpha_composite(background, img)
        fit = ImageOps.pad if frame.fit == "pad" else ImageOps.fit
        img = fit(img.convert("RGB"), (frame.width, frame.height), Image.Resampling.BILINEAR)
        return torch.from_numpy(np.asarray(img).copy()).permute(2, 0, 1).contiguous()


class ImageDataset(torch.utils.data.Dataset):
    """Decodes on access; a file that fails to decode yields None (dropped by `collate_skipping_bad`)."""

    def __init__(self, samples: list[tuple[str, int]], frame: Frame):
        self.samples = samples
        self.frame = frame

    def __len__(self) -> int:
        return len(self.samples)

    def __getitem__(self, index: int):
        path, label = self.samples[index]
        try:
            return decode_image(path, self.frame), label
        except Exception as e:  # noqa: BLE001 - any bad file must not crash the epoch
            log.warning("skipping %s: cannot decode: %s", path, e)
            return None


def collate_skipping_bad(items):
    items = [it for it in items if it is not None]
    if not items:
        return None
    return torch.stack([it[0] for it in items]), torch.tensor([it[1] for it in items])


@dataclass
class Split:
    samples: list[tuple[str, int]]
    store: ImageStore | None = None  # decoded images when cached
    rows: torch.Tensor | None = None  # store row of each sample
    labels: torch.Tensor | None = None
    loader: torch.utils.data.DataLoader | None = None  # decoding workers, when not cached

    def __len__(self) -> int:
        return len(self.samples)

    def attach(self, store: ImageStore) -> None:
        self.store = store
        self.rows = torch.tensor([store.rows[path] for path, _ in self.samples], dtype=torch.long)
        self.labels = torch.tensor([label for _, label in self.samples], dtype=torch.long)


@dataclass
class DataBundle:
    classes: list[str]
    train: Split
    val: Split
    skipped: list[tuple[str, str]]
    cache: str
    manifest: dict | None = None  # {file, excluded, relabelled} when data.exclude is set
    test: list[tuple[str, int]] = field(default_factory=list)  # data.test_split: held out of train, never trained on
    multilabel: bool = False  # each sample's label is a 0/1 tuple over `classes` (the labels), not a class index

    def train_counts(self) -> list[int]:
        """Training images per class (multi-label: the images carrying each label), in label order."""
        return _counts(self.train.samples, len(self.classes), self.multilabel)

    def classes_without_val(self) -> list[tuple[str, int]]:
        """(class, training images) of the classes with no validation image (their accuracy is unknown)."""
        in_val = _counts(self.val.samples, len(self.classes), self.multilabel)
        train = self.train_counts()
        return [(name, train[i]) for i, name in enumerate(self.classes) if not in_val[i]]


def _counts(samples: list, n: int, multilabel: bool) -> list[int]:
    counts = [0] * n
    for _, label in samples:
        if multilabel:
            for i, on in enumerate(label):
                counts[i] += on > 0
        else:
            counts[label] += 1
    return counts


def stratified_split(samples: list[tuple[str, int]], fraction: float, seed: int):
    """(train, val): `fraction` of each class held out, chosen with `seed`."""
    rng = random.Random(seed)
    by_class: dict[int, list[tuple[str, int]]] = {}
    for s in samples:
        by_class.setdefault(s[1], []).append(s)
    train, val = [], []
    for label in sorted(by_class):
        items = by_class[label][:]
        rng.shuffle(items)
        n_val = max(1, round(len(items) * fraction)) if len(items) > 1 else 0
        val.extend(items[:n_val])
        train.extend(items[n_val:])
    return sorted(train), sorted(val)


def resolve_cache(cfg: DataConfig, n_images: int) -> str:
    """memory | disk | none: `data.cache`, or for auto, memory when the decoded images fit in a share of free RAM."""
    if cfg.cache != "auto":
        return cfg.cache
    need = n_images * 3 * Frame.of(cfg).pixels
    return "memory" if need < MEMORY_CACHE_FRACTION * psutil.virtual_memory().available else "disk"


def cache_dir(cfg: DataConfig) -> Path:
    return Path(cfg.cache_dir) if cfg.cache_dir else default_cache_dir()


def load_data(cfg: DataConfig, seed: int, workers: int, progress: Progress | None = None,
              should_stop: Callable[[], bool] | None = None) -> DataBundle:
    """Scan the folders, decode them once through the cache (unless `cache: none`), split train/val.

    Files that fail to decode are dropped before the split, so every cache mode splits the same usable files.
    When `should_stop` turns true while images are decoded, the build is abandoned with `Interrupted`.
    """
    def report(done: int, total: int) -> None:
        if should_stop is not None and should_stop():
            raise Interrupted(f"stopped while decoding images into the cache ({done}/{total})")
        if progress is not None:
            progress(done, total)

    cache = resolve_cache(cfg, 0)
    manifest = load_manifest(cfg)
    folders = _labelled_scans(cfg, manifest) if cfg.labels else _folder_scans(cfg, cache == "none", manifest)
    cache = resolve_cache(cfg, sum(len(f.samples) for f in folders.values()))
    skipped = [bad for scan in folders.values() for bad in scan.bad_files]
    stores: dict[str, ImageStore] = {}
    if cache != "none":
        try:
            for name, scan in folders.items():
                stores[name] = open_store([p for p, _ in scan.samples], Frame.of(cfg), cache, cache_dir(cfg),
                                          decode_image, os.cpu_count() or 1, report)
        except OSError as e:  # disk cache impossible here: decode every epoch instead
            log.warning("%s: decoding every epoch instead (data.cache: none)", e)
            cache, stores = "none", {}
        for name, store in stores.items():
            skipped += store.bad
            folders[name].samples = [s for s in folders[name].samples if s[0] in store.rows]
    train_s, val_s, test_s = split_samples(cfg, folders["train"].samples, seed,
                                           folders["val"].samples if "val" in folders else None)
    if not train_s:
        raise DataError(f"data.train_dir: {cfg.train_dir}: no usable training images")
    if not val_s:
        raise DataError(f"data.val_split: no validation images left from {cfg.train_dir}; add images or set data.val_dir")
    bundle = DataBundle(folders["train"].classes, Split(train_s), Split(val_s), skipped, cache, test=test_s,
                        multilabel=bool(cfg.labels))
    if manifest is not None:
        bundle.manifest = {"file": str(manifest.path), "excluded": sum(f.excluded for f in folders.values()),
                           "relabelled": sum(f.relabelled for f in folders.values()), "added": folders["train"].added}
    if stores:
        bundle.train.attach(stores["train"])
        bundle.val.attach(stores.get("val", stores["train"]))
    if cfg.on_bad_file == "fail" and bundle.skipped:
        path, reason = bundle.skipped[0]
        raise DataError(f"{path}: {reason} (data.on_bad_file is fail; {len(bundle.skipped)} bad files in all)")
    return bundle


def split_samples(cfg: DataConfig, samples: list, seed: int, val: list | None) -> tuple[list, list, list]:
    """(train, val, test) as a run splits the training folder's samples: data.test_split first (with a seed of its
    own), then data.val_split, unless `val` (a validation folder's samples) is given."""
    test_s: list = []
    split = random_split if cfg.labels else stratified_split  # multi-label: no one class to stratify by
    if cfg.test_split and not (cfg.test_dir or cfg.test_labels):  # before validation
        samples, test_s = split(samples, cfg.test_split, seed + TEST_SPLIT_SEED)
    if val is not None:
        return samples, val, test_s
    train_s, val_s = split(samples, cfg.val_split, seed)
    return train_s, val_s, test_s


def training_samples(cfg: DataConfig, seed: int) -> tuple[list[str], list]:
    """(classes, training samples) as a run with this config and seed splits them, nothing decoded: files only a
    decode finds unusable are still among them (`load_data` drops those before it splits)."""
    manifest = load_manifest(cfg)
    folders = _labelled_scans(cfg, manifest) if cfg.labels else _folder_scans(cfg, False, manifest)
    val = folders["val"].samples if "val" in folders else None
    return folders["train"].classes, split_samples(cfg, folders["train"].samples, seed, val)[0]


def _folder_scans(cfg: DataConfig, full: bool, manifest) -> dict[str, ScanResult]:
    """The class folders: data.train_dir (with the manifest's additions), data.val_dir when set."""
    folders = {"train": _checked_scan(cfg.train_dir, "data.train_dir", full, manifest, additions=True)}
    if cfg.val_dir:
        folders["val"] = _checked_scan(cfg.val_dir, "data.val_dir", full, manifest)
        check_same_classes(folders["train"].classes, folders["val"].classes, cfg.val_dir)
    return folders


def _labelled_scans(cfg: DataConfig, manifest) -> dict[str, ScanResult]:
    """Multi-label: the images data.labels lists (in data.train_dir), and data.val_labels' when set."""
    from trainer.data.labels import labelled_scan

    if not cfg.train_dir:
        raise DataError("data.train_dir: not set (the folder of the images data.labels lists)")
    folders = {"train": labelled_scan(cfg.labels, "data.labels", cfg.train_dir, manifest=manifest, additions=True)}
    if cfg.val_labels:
        folders["val"] = labelled_scan(cfg.val_labels, "data.val_labels", names=folders["train"].classes,
                                       manifest=manifest)
    for scan in folders.values():
        for w in scan.warnings:
            log.warning("%s", w)
    return folders


def random_split(samples: list, fraction: float, seed: int) -> tuple[list, list]:
    """(train, val): `fraction` of the samples held out, chosen with `seed` (multi-label: no class to stratify by)."""
    items = sorted(samples)
    random.Random(seed).shuffle(items)
    n_val = max(1, round(len(items) * fraction)) if len(items) > 1 else 0
    return sorted(items[n_val:]), sorted(items[:n_val])


def load_manifest(cfg: DataConfig):
    """The data.exclude manifest, or None when the key is not set; a DataError when its file is missing."""
    from trainer.data.manifest import read_manifest

    if not cfg.exclude:
        return None
    if not os.path.lexists(cfg.exclude):  # a FIFO or a device exists: read_manifest names what it is
        raise DataError(f"data.exclude: {cfg.exclude}: no such manifest file")
    return read_manifest(cfg.exclude)


def _checked_scan(folder: str, key: str, full: bool, manifest=None, additions: bool = False) -> ScanResult:
    if not folder:
        raise DataError(f"{key}: not set (the ImageFolder to train on)")
    try:
        scan = scan_image_folder(folder, full=full, manifest=manifest, additions=additions)
    except DataError as e:
        raise DataError(f"{key}: {e}") from e
    problems = scan.problems()
    if problems:
        raise DataError(f"{key}: {problems[0]}")
    for w in scan.warnings:
        log.warning("%s", w)
    return scan


def epoch_batches(n: int, batch_size: int, *, seed: int, epoch: int, rank: int = 0, world: int = 1,
                  shuffle: bool = True, pad: bool = True, labels: list[int] | None = None) -> list[list[int]]:
    """This rank's batches of indices for one epoch; the order depends only on (seed, epoch).

    With `labels` (data.sampler: balanced), the epoch's n indices are drawn with replacement, each with a probability
    inversely proportional to its class's size, so every class is seen about equally often.

    With `pad`, indices are repeated so every rank gets the same number of batches (as
    DistributedSampler does); rank r takes every world-th index, so the union of the ranks' k-th
    batches is the single-process k-th batch of size batch_size * world.
    """
    g = torch.Generator().manual_seed(seed * 100003 + epoch)
    if labels is not None:
        y = torch.tensor(labels)
        weights = (1.0 / torch.bincount(y).float())[y]
        order = torch.multinomial(weights, n, replacement=True, generator=g).tolist()
    elif shuffle:
        order = torch.randperm(n, generator=g).tolist()
    else:
        order = list(range(n))
    if pad and world > 1 and n % world:
        order += order[: world - n % world]
    mine = order[rank::world]
    batches = [mine[i:i + batch_size] for i in range(0, len(mine), batch_size)]
    if shuffle and len(batches) > 1 and len(batches[-1]) < 2:
        batches.pop()  # a training batch of one breaks BatchNorm; its images come back next epoch
    return batches


class EpochBatches(torch.utils.data.Sampler):
    """The batch sampler of a long-lived DataLoader: this epoch's batches, swapped in before each epoch."""

    def __init__(self):
        self.batches: list[list[int]] = []

    def __iter__(self):
        return iter(self.batches)

    def __len__(self) -> int:
        return len(self.batches)


def iterate_batches(split: Split, batches: list[list[int]], workers: int, frame: Frame,
                    device: torch.device) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """(uint8 images, labels) per batch, from the cache or decoded by DataLoader workers; on a GPU already on the
    device, copied ahead of use (`prefetch_to_device`).

    The workers are started once per split and kept across epochs (persistent), not restarted each epoch.
    """
    cuda = device.type == "cuda"
    if split.store is not None:
        source = ((split.store.take(split.rows[index]), split.labels[index]) for index in map(torch.tensor, batches))
    else:
        if split.loader is None:
            split.loader = torch.utils.data.DataLoader(
                ImageDataset(split.samples, frame), batch_sampler=EpochBatches(), num_workers=workers,
                collate_fn=collate_skipping_bad, pin_memory=cuda, persistent_workers=workers > 0,
                prefetch_factor=4 if workers else None,
                multiprocessing_context=worker_start_method() if workers else None)
        split.loader.batch_sampler.batches = batches
        source = (batch for batch in split.loader if batch is not None)
    yield from prefetch_to_device(source, device) if cuda else source


def prefetch_to_device(batches: Iterator[tuple[torch.Tensor, torch.Tensor]],
                       device: torch.device) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """The same batches on a CUDA device, each one's host-to-device copy issued one batch ahead on a side stream
    from pinned memory, so it overlaps the compute of the batch before (batches already on the device, from the
    GPU-resident cache, pass through)."""
    stream = torch.cuda.Stream(device)

    def copy(images: torch.Tensor, labels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        if images.device == device:
            return images, labels.to(device)
        with torch.cuda.stream(stream):
            return (images.pin_memory().to(device, non_blocking=True),  # pin_memory: a no-op when already pinned
                    labels.pin_memory().to(device, non_blocking=True))

    ahead = next((copy(*b) for b in batches), None)
    while ahead is not None:
        compute = torch.cuda.current_stream(device)
        compute.wait_stream(stream)  # this batch's copy is done before compute reads it
        for t in ahead:
            t.record_stream(compute)  # and its memory is not reused while compute still reads it
        current = ahead
        ahead = next((copy(*b) for b in batches), None)
        yield current


def keep_on_device(bundle: DataBundle, device: torch.device) -> bool:
    """Move the in-memory cache to the GPU when it fits in a quarter of its free memory: batches are then
    indexed on the GPU, with no host-to-device copy at all. Returns whether it moved."""
    stores = {id(s.store): s.store for s in (bundle.train, bundle.val) if s.store is not None}
    if device.type != "cuda" or bundle.cache != "memory" or not stores:
        return False
    need = sum(store.images.numel() for store in stores.values())
    free, _ = torch.cuda.mem_get_info(device)
    if need > MEMORY_CACHE_FRACTION * free:
        return False
    for store in stores.values():
        store.images = store.images.to(device)
    log.info("decoded images kept on %s (%.0f MiB)", device, need / 2**20)
    return True


def usable_cpus() -> int:
    """The CPUs this process may run on (its affinity: what SLURM or taskset gave it), not all the machine's."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # not on Linux
        return os.cpu_count() or 1


def default_workers(requested: int) -> int:
    """`data.num_workers`; auto (-1) = one loader worker per usable CPU beyond the trainer's own, at most 8."""
    if requested >= 0:
        return requested
    return max(0, min(8, usable_cpus() - 1))


class Normalise:
    """Pixel values (floats in 0..255) to the network's input, `(x - 255 mean) / (255 std)` in `memory_format`: the
    one place of this arithmetic, for the training batches (`BatchAugment`) and for inference (`trainer.deploy.inference`),
    so both feed the network the same numbers."""

    def __init__(self, mean, std, device: torch.device | str, memory_format: torch.memory_format):
        self.mean = torch.tensor(mean, device=device).view(1, 3, 1, 1) * 255
        self.std = torch.tensor(std, device=device).view(1, 3, 1, 1) * 255
        self.memory_format = memory_format

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return ((x - self.mean) / self.std).contiguous(memory_format=self.memory_format)


class BatchAugment:
    """Random resized crop, flip, colour jitter, an automatic policy and erasing on whole uint8 batches, then
    normalisation; MixUp and CutMix (`mix`) on the augmented batch and its labels.

    Per-sample crops and flips are one affine `grid_sample`; the random draws come from a
    torch.Generator whose state is checkpointed, so a resumed run augments exactly as before.
    """

    def __init__(self, aug: AugmentConfig, mean: list[float], std: list[float], device: torch.device,
                 memory_format: torch.memory_format = torch.contiguous_format):
        undecided = [k for k in ("hflip", "crop_scale_min") if getattr(aug, k) == "auto"]
        if undecided:  # a programming error, not the user's: the trainer decides auto before building this
            raise ValueError(f"data.augment: {', '.join(undecided)} still auto (trainer.data.suggest.resolve_augment "
                             f"decides it for the data first)")
        self.aug = aug
        self._policy_op = None  # torchvision's policy (data.augment.policy), made at its first batch
        self._pipeline = build_pipeline(aug.albumentations) if aug.albumentations else None  # refused here if bad
        self.normalise = Normalise(mean, std, device, memory_format)
        self.device = device

    def __call__(self, images: torch.Tensor, generator: torch.Generator | None) -> torch.Tensor:
        x = images.to(self.device, non_blocking=True).float()
        if generator is not None:
            x = self.augment(x, generator)
        return self.normalise(x)

    def augment(self, x: torch.Tensor, g: torch.Generator) -> torch.Tensor:
        """The batch (float, 0-255) cropped, flipped, jittered and erased per sample with `g`'s draws; not
        normalised."""
        n = x.shape[0]
        aug = self.aug
        if self._pipeline is not None:  # data.augment.albumentations: the user's own, first, per image
            seed = int(torch.randint(0, 2**31 - 1, (1,), generator=g))
            x = run_pipeline(self._pipeline, x, seed, aug.albumentations)
        if aug.random_resized_crop or aug.hflip:
            sx = torch.ones(n)
            sy = torch.ones(n)
            tx = torch.zeros(n)
            ty = torch.zeros(n)
            if aug.random_resized_crop:
                area = aug.crop_scale_min + (1 - aug.crop_scale_min) * torch.rand(n, generator=g)
                log_ratio = (torch.rand(n, generator=g) * 2 - 1) * math.log(4 / 3)
                ratio = torch.exp(log_ratio)
                sx = torch.sqrt(area * ratio).clamp(max=1)
                sy = torch.sqrt(area / ratio).clamp(max=1)
                tx = (torch.rand(n, generator=g) * 2 - 1) * (1 - sx)
                ty = (torch.rand(n, generator=g) * 2 - 1) * (1 - sy)
            if aug.hflip:
                flip = torch.rand(n, generator=g) < 0.5
                sx = torch.where(flip, -sx, sx)
            theta = torch.zeros(n, 2, 3)
            theta[:, 0, 0], theta[:, 0, 2], theta[:, 1, 1], theta[:, 1, 2] = sx, tx, sy, ty
            grid = F.affine_grid(theta.to(x.device), list(x.shape), align_corners=False)
            x = F.grid_sample(x, grid, mode="bilinear", padding_mode="reflection", align_corners=False)
        if aug.color_jitter > 0:
            j = aug.color_jitter
            factors = (1 - j + 2 * j * torch.rand(n, 3, generator=g)).to(x.device)
            brightness, contrast, saturation = (factors[:, i].view(n, 1, 1, 1) for i in range(3))
            x = x * brightness
            gray = (0.299 * x[:, 0:1] + 0.587 * x[:, 1:2] + 0.114 * x[:, 2:3])
            x = gray + (x - gray) * saturation
            mean = gray.mean(dim=(2, 3), keepdim=True)
            x = (mean + (x - mean) * contrast).clamp(0, 255)
        if aug.policy != "none":
            x = self._policy(x, g)
        if aug.random_erasing > 0:
            x = self._erase(x, g)
        return x

    def _policy(self, x: torch.Tensor, g: torch.Generator) -> torch.Tensor:
        """data.augment.policy: torchvision's TrivialAugment or RandAugment, image by image (each its own operations),
        its random draws seeded from `g` (torchvision draws from torch's global generator: forked here, so the
        run's other randomness is untouched and a resumed run draws the same)."""
        if self._policy_op is None:
            from torchvision.transforms import v2

            self._policy_op = v2.TrivialAugmentWide() if self.aug.policy == "trivial_augment" else v2.RandAugment()
        seed = int(torch.randint(0, 2**31 - 1, (1,), generator=g))
        cuda = [x.device.index or 0] if x.device.type == "cuda" else []  # manual_seed seeds those too: restored
        with torch.random.fork_rng(devices=cuda):
            torch.manual_seed(seed)
            images = x.round().clamp(0, 255).to(torch.uint8)
            return torch.stack([self._policy_op(image) for image in images]).float()

    def _erase(self, x: torch.Tensor, g: torch.Generator) -> torch.Tensor:
        """data.augment.random_erasing: in that share of the images, a rectangle of 2-33% of the image (sides in a
        ratio of 0.3 to 3.3) painted over with the image's mean colour."""
        n, _, h, w = x.shape
        on = torch.rand(n, generator=g) < self.aug.random_erasing
        area = (ERASE_AREA[0] + (ERASE_AREA[1] - ERASE_AREA[0]) * torch.rand(n, generator=g)) * h * w
        ratio = torch.exp((torch.rand(n, generator=g) * 2 - 1) * math.log(ERASE_RATIO))
        eh = torch.sqrt(area * ratio).round().clamp(1, h).long()
        ew = torch.sqrt(area / ratio).round().clamp(1, w).long()
        top = (torch.rand(n, generator=g) * (h - eh + 1)).long()
        left = (torch.rand(n, generator=g) * (w - ew + 1)).long()
        rows, cols = torch.arange(h).view(1, h, 1), torch.arange(w).view(1, 1, w)
        inside = ((rows >= top.view(n, 1, 1)) & (rows < (top + eh).view(n, 1, 1)) & (cols >= left.view(n, 1, 1))
                  & (cols < (left + ew).view(n, 1, 1)) & on.view(n, 1, 1))
        return torch.where(inside.unsqueeze(1).to(x.device), x.mean(dim=(2, 3), keepdim=True), x)

    def mix(self, x: torch.Tensor, y: torch.Tensor, g: torch.Generator, classes: int) -> tuple[torch.Tensor,
                                                                                               torch.Tensor]:
        """data.augment.mixup / cutmix: the batch mixed with itself in another order, one blend for the batch (drawn
        from Beta(alpha, alpha) with `g`), the targets mixed alike: (images, targets as probabilities per class).
        With both on, each batch is one or the other; with neither (or one image), (x, y) as given."""
        aug = self.aug
        if not (aug.mixup or aug.cutmix) or x.shape[0] < 2:
            return x, y
        cut = aug.cutmix > 0 and (aug.mixup == 0 or torch.rand(1, generator=g).item() < 0.5)
        alpha = aug.cutmix if cut else aug.mixup
        seed = int(torch.randint(0, 2**31 - 1, (1,), generator=g))
        lam = float(np.random.default_rng(seed).beta(alpha, alpha))
        order = torch.randperm(x.shape[0], generator=g).to(x.device)
        if cut:
            h, w = x.shape[2:]
            side = math.sqrt(1 - lam)
            cy, cx = (int(v) for v in (torch.rand(2, generator=g) * torch.tensor([h, w])))
            y0, y1 = max(cy - round(h * side / 2), 0), min(cy + round(h * side / 2), h)
            x0, x1 = max(cx - round(w * side / 2), 0), min(cx + round(w * side / 2), w)
            x = x.clone()
            x[:, :, y0:y1, x0:x1] = x[order, :, y0:y1, x0:x1]  # only the rectangle gathered
            lam = 1 - (y1 - y0) * (x1 - x0) / (h * w)  # the share of the image that is still its own
        else:
            x = lam * x + (1 - lam) * x[order]
        target = F.one_hot(y, classes).float() if y.dim() == 1 else y.float()
        return x, lam * target + (1 - lam) * target[order]
