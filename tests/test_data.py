"""The data path: cache and plain decoding feed identical pixels; batch order and augmentation are seeded."""

import shutil

import pytest
import torch

import trainer.data.loader
from trainer.core.config import AugmentConfig, DataConfig
from trainer.data.frame import Frame
from trainer.data.loader import BatchAugment, epoch_batches, iterate_batches, load_data, stratified_split

CPU = torch.device("cpu")
SIXTEEN = Frame(16, 16)  # the configs below: data.image_size 16


@pytest.mark.parametrize("cache", ["memory", "disk"])
def test_cache_feeds_the_same_pixels_and_augmentation_as_decoding(shapes_dir, tmp_path, cache):
    cached = load_data(DataConfig(train_dir=str(shapes_dir), image_size=16, cache=cache, cache_dir=str(tmp_path)),
                       seed=0, workers=0)
    plain = load_data(DataConfig(train_dir=str(shapes_dir), image_size=16, cache="none"), seed=0, workers=0)
    assert cached.cache == cache and plain.cache == "none"
    assert cached.train.samples == plain.train.samples and cached.val.samples == plain.val.samples
    augment = BatchAugment(AugmentConfig(hflip=True, crop_scale_min=0.6, color_jitter=0.3), [0.5] * 3, [0.25] * 3,
                           torch.device("cpu"))
    batches = epoch_batches(len(plain.train), 8, seed=0, epoch=3)
    g1, g2 = torch.Generator().manual_seed(7), torch.Generator().manual_seed(7)
    pairs = zip(iterate_batches(cached.train, batches, 0, SIXTEEN, CPU), iterate_batches(plain.train, batches, 2, SIXTEEN, CPU))
    n = 0
    for (xa, ya), (xb, yb) in pairs:
        assert torch.equal(xa, xb) and torch.equal(ya, yb)
        assert torch.equal(augment(xa, g1), augment(xb, g2))
        n += 1
    assert n == len(batches)
    loader = plain.train.loader
    next_epoch = epoch_batches(len(plain.train), 8, seed=0, epoch=4)
    for (xa, ya), (xb, yb) in zip(iterate_batches(cached.train, next_epoch, 0, SIXTEEN, CPU),
                                  iterate_batches(plain.train, next_epoch, 2, SIXTEEN, CPU)):
        assert torch.equal(xa, xb) and torch.equal(ya, yb)
    assert plain.train.loader is loader  # the same decoding workers, kept across epochs
    val_batches = epoch_batches(len(plain.val), 8, seed=0, epoch=0, shuffle=False)
    for (xa, _), (xb, _) in zip(iterate_batches(cached.val, val_batches, 0, SIXTEEN, CPU),
                                iterate_batches(plain.val, val_batches, 0, SIXTEEN, CPU)):
        assert torch.equal(xa, xb)


def _pixels(bundle, path: str) -> torch.Tensor:
    for split in (bundle.train, bundle.val):
        for i, (p, _) in enumerate(split.samples):
            if p == path:
                return split.store.take(split.rows[i:i + 1])[0]
    raise KeyError(path)


def test_the_cache_is_reused_until_a_file_changes_is_added_or_removed(shapes_dir, tmp_path, monkeypatch):
    from PIL import Image

    data = tmp_path / "d"
    shutil.copytree(shapes_dir, data)
    cfg = DataConfig(train_dir=str(data), image_size=16, cache="disk", cache_dir=str(tmp_path / "cache"))
    first = load_data(cfg, seed=0, workers=0)
    changed = sorted(data.glob("circle/*.png"))[0]
    before = _pixels(first, str(changed)).clone()

    decoded = []
    real_decode = trainer.data.loader.decode_image
    monkeypatch.setattr(trainer.data.loader, "decode_image", lambda path, size: decoded.append(path) or real_decode(path, size))
    again = load_data(cfg, seed=0, workers=0)
    assert decoded == [] and torch.equal(_pixels(again, str(changed)), before)  # unchanged folder: nothing decoded

    Image.new("RGB", (24, 24), (255, 0, 0)).save(changed)
    after = load_data(cfg, seed=0, workers=0)
    assert len(decoded) == 120 and torch.equal(_pixels(after, str(changed))[0], torch.full((16, 16), 255, dtype=torch.uint8))

    added = data / "circle" / "new.png"
    Image.new("RGB", (24, 24), (0, 0, 255)).save(added)
    removed = sorted(data.glob("square/*.png"))[0]
    removed.unlink()
    latest = load_data(cfg, seed=0, workers=0)
    paths = {p for split in (latest.train, latest.val) for p, _ in split.samples}
    assert str(added) in paths and str(removed) not in paths and len(paths) == 120
    assert (_pixels(latest, str(added))[2] == 255).all()


def test_a_damaged_cache_entry_is_decoded_again(shapes_dir, tmp_path):
    cfg = DataConfig(train_dir=str(shapes_dir), image_size=16, cache="disk", cache_dir=str(tmp_path))
    good = load_data(cfg, seed=0, workers=0)
    some = torch.arange(10)
    expected = good.train.store.take(good.train.rows[some])  # a copy: the map itself must not outlive the truncation
    del good
    (entry,) = [p for p in tmp_path.iterdir() if p.is_dir()]
    with open(entry / "images.u8", "r+b") as f:
        f.truncate(1000)
    again = load_data(cfg, seed=0, workers=0)
    assert torch.equal(expected, again.train.store.take(again.train.rows[some]))


def test_an_unusable_cache_folder_falls_back_with_a_warning(shapes_dir, tmp_path, caplog):
    blocker = tmp_path / "not-a-folder"
    blocker.write_text("")
    memory = load_data(DataConfig(train_dir=str(shapes_dir), image_size=16, cache="memory", cache_dir=str(blocker)),
                       seed=0, workers=0)
    assert memory.cache == "memory" and memory.train.store.where == "memory" and len(memory.train) == 96
    assert any("not-a-folder" in r.getMessage() and "unusable" in r.getMessage() for r in caplog.records)
    caplog.clear()
    disk = load_data(DataConfig(train_dir=str(shapes_dir), image_size=16, cache="disk", cache_dir=str(blocker)),
                     seed=0, workers=0)
    assert disk.cache == "none" and disk.train.store is None and len(disk.train) == 96  # decoded every epoch
    assert any("not-a-folder" in r.getMessage() and "every epoch" in r.getMessage() for r in caplog.records)


def test_batch_order_depends_only_on_seed_and_epoch_and_ranks_partition_it():
    a = epoch_batches(48, 4, seed=1, epoch=2)
    assert a == epoch_batches(48, 4, seed=1, epoch=2) and a != epoch_batches(48, 4, seed=1, epoch=3)
    r0 = epoch_batches(48, 2, seed=1, epoch=2, rank=0, world=2)
    r1 = epoch_batches(48, 2, seed=1, epoch=2, rank=1, world=2)
    assert len(r0) == len(r1) == len(a) == 12
    for k in range(len(a)):
        assert sorted(r0[k] + r1[k]) == sorted(a[k])


def test_validation_split_is_stratified_and_seeded():
    samples = [(f"{c}{i}", c) for c in range(3) for i in range(20)]
    train, val = stratified_split(samples, 0.25, seed=4)
    assert [sum(1 for _, c in val if c == k) for k in range(3)] == [5, 5, 5]
    assert (train, val) == stratified_split(samples, 0.25, seed=4)
    assert val != stratified_split(samples, 0.25, seed=5)[1]
    assert not set(train) & set(val)


def test_uneven_shards_are_padded_so_every_rank_takes_the_same_number_of_steps():
    r0 = epoch_batches(51, 4, seed=0, epoch=0, rank=0, world=2)
    r1 = epoch_batches(51, 4, seed=0, epoch=0, rank=1, world=2)
    assert len(r0) == len(r1) and sum(map(len, r0)) == sum(map(len, r1)) == 26


def test_the_memory_cache_moves_to_the_gpu_only_when_it_fits(shapes_dir, tmp_path, monkeypatch):
    """The decision of `keep_on_device` (CI has no GPU: the move itself is a plain `.to(device)`)."""
    from trainer.data.loader import keep_on_device

    bundle = load_data(DataConfig(train_dir=str(shapes_dir), image_size=16, cache="memory", cache_dir=str(tmp_path)),
                       seed=0, workers=0)
    gpu = torch.device("cuda", 0)
    need = bundle.train.store.images.numel()
    assert bundle.val.store is bundle.train.store  # one store for both splits: moved once
    assert not keep_on_device(bundle, torch.device("cpu"))
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device=None: (2 * need, 10 * need))
    assert not keep_on_device(bundle, gpu)  # needs more than a quarter of the free memory
    moved = []
    monkeypatch.setattr(torch.Tensor, "to", lambda self, device, *a, **k: moved.append(device) or self)
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device=None: (8 * need, 10 * need))
    assert keep_on_device(bundle, gpu) and moved == [gpu]


def test_a_folder_s_own_splits_are_found_from_the_folder_or_from_its_train(tmp_path):
    """One rule for the Dataset page and Auto: picking the parent or its train/ gives the same splits (a second
    Auto on the train/ the first one put in the form kept the folder's val/ and test/)."""
    from trainer.data.scan import find_layout

    for split in ("train", "valid", "test"):
        (tmp_path / "ds" / split / "cat").mkdir(parents=True)
    want = {"train_dir": str(tmp_path / "ds" / "train"), "val_dir": str(tmp_path / "ds" / "valid"),
            "test_dir": str(tmp_path / "ds" / "test")}
    assert find_layout(tmp_path / "ds") == want
    assert find_layout(tmp_path / "ds" / "train") == want
    (tmp_path / "flat" / "cat").mkdir(parents=True)
    (tmp_path / "flat" / "dog").mkdir()
    assert find_layout(tmp_path / "flat") == {"train_dir": str(tmp_path / "flat"), "val_dir": None, "test_dir": None}
    assert find_layout(tmp_path / "flat" / "cat")["train_dir"] == str(tmp_path / "flat" / "cat")
