"""The data path: cache and plain decoding feed identical pixels; batch order and augmentation are seeded."""

import torch

from trainer.config import AugmentConfig, DataConfig
from trainer.data import BatchAugment, Split, _decode_all, epoch_batches, iterate_batches, load_data, stratified_split


def test_memory_cache_feeds_the_same_pixels_and_augmentation_as_decoding(shapes_dir):
    cached = load_data(DataConfig(train_dir=str(shapes_dir), image_size=16, cache="memory"), seed=0, workers=0)
    plain = load_data(DataConfig(train_dir=str(shapes_dir), image_size=16, cache="none"), seed=0, workers=0)
    assert cached.cache == "memory" and plain.cache == "none"
    assert cached.train.samples == plain.train.samples and cached.val.samples == plain.val.samples
    augment = BatchAugment(AugmentConfig(color_jitter=0.3), [0.5] * 3, [0.25] * 3, torch.device("cpu"))
    batches = epoch_batches(len(plain.train), 8, seed=0, epoch=3)
    g1, g2 = torch.Generator().manual_seed(7), torch.Generator().manual_seed(7)
    pairs = zip(iterate_batches(cached.train, batches, 0, 16, False), iterate_batches(plain.train, batches, 2, 16, False))
    n = 0
    for (xa, ya), (xb, yb) in pairs:
        assert torch.equal(xa, xb) and torch.equal(ya, yb)
        assert torch.equal(augment(xa, g1), augment(xb, g2))
        n += 1
    assert n == len(batches)


def test_a_changed_file_is_read_again(shapes_dir, tmp_path):
    import shutil

    from PIL import Image

    data = tmp_path / "d"
    shutil.copytree(shapes_dir, data)
    path = sorted(data.glob("circle/*.png"))[0]
    split = Split([(str(path), 0)])
    _decode_all(split, 16, 1)
    before = split.images.clone()
    Image.new("RGB", (24, 24), (255, 0, 0)).save(path)
    split = Split([(str(path), 0)])
    _decode_all(split, 16, 1)
    assert not torch.equal(before, split.images) and (split.images[0, 0] == 255).all()


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
