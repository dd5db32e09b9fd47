"""Settings suggested from a dataset scan (trainer/suggest.py): the Dataset page's hint and Auto's starting point."""

import numpy as np
from PIL import Image

from trainer.scan import ScanResult, scan_image_folder
from trainer.suggest import looks_like_characters, suggest, suggested_image_size


def folder(root, classes, size, per_class=3):
    for c in classes:
        (root / c).mkdir(parents=True)
        for i in range(per_class):
            Image.fromarray(np.full((size[1], size[0], 3), 40 * i, np.uint8)).save(root / c / f"{i}.png")
    return root


def test_photos_get_a_size_that_keeps_their_detail_and_digits_lose_the_flip(tmp_path):
    photos = scan_image_folder(folder(tmp_path / "photos", ["cat", "dog"], (400, 300)))
    assert photos.image_sizes == [(400, 300)] * 6
    current = {"data": {"image_size": 32, "augment": {"hflip": True}}}
    (size,) = suggest(photos, current)
    assert (size.key, size.value) == ("data.image_size", 224) and "300 px" in size.why
    digits = scan_image_folder(folder(tmp_path / "digits", [str(d) for d in range(10)], (28, 28)))
    keys = {s.key: s.value for s in suggest(digits, current)}
    assert keys == {"data.augment.hflip": False}, "28 px digits stay at 32 px, but must not be mirrored"
    assert suggest(photos, {"data": {"image_size": 224, "augment": {"hflip": True}}}) == [], "nothing to change"


def test_the_size_rule_and_what_counts_as_characters():
    assert suggested_image_size(ScanResult("x", image_sizes=[(96, 64), (128, 100)])) == 64
    assert suggested_image_size(ScanResult("x", image_sizes=[(4000, 3000)])) == 224
    assert suggested_image_size(ScanResult("x", image_sizes=[(8, 8)])) == 32
    assert suggested_image_size(ScanResult("x")) is None
    assert looks_like_characters(["A", "B", "7"]) and looks_like_characters(["one", "two"])
    assert not looks_like_characters(["cat", "dog"]) and not looks_like_characters(["a"])
