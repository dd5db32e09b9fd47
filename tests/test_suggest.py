"""Settings suggested from a dataset scan (trainer/data/suggest.py): the Dataset page's hint and Auto's starting point."""

import numpy as np
from PIL import Image

from trainer.data.scan import ScanResult, scan_image_folder
from trainer.data.suggest import looks_like_characters, suggest, suggested_image_size, suggested_shape


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


def test_wide_or_tall_images_keep_their_shape_and_square_ones_go_back_to_square(tmp_path):
    wide = scan_image_folder(folder(tmp_path / "wide", ["left", "right"], (96, 48)))
    current = {"data": {"image_size": 32, "image_width": 0}}
    said = {s.key: s for s in suggest(wide, current)}
    assert said["data.image_width"].value == 64 and "a square crop would cut off 50% of each" in said[
        "data.image_width"].why and "data.image_size" not in said, "48 px high: 32, and 64 wide"
    tall = scan_image_folder(folder(tmp_path / "tall", ["up", "down"], (48, 96)))
    said = {s.key: s.value for s in suggest(tall, current)}
    assert said == {"data.image_size": 64, "data.image_width": 32}, "the height in proportion, the width 32"
    photos = ScanResult("x", image_sizes=[(400, 300)] * 3)  # 4:3: a centre crop keeps most of each photo
    assert suggested_shape(photos) == (224, 0)
    square = scan_image_folder(folder(tmp_path / "square", ["a", "b"], (40, 40)))
    (back,) = suggest(square, {"data": {"image_size": 32, "image_width": 64}})
    assert (back.key, back.value, back.why) == ("data.image_width", 0, "the images are about square")


def test_the_size_rule_and_what_counts_as_characters():
    assert suggested_image_size(ScanResult("x", image_sizes=[(96, 64), (128, 100)])) == 64
    assert suggested_image_size(ScanResult("x", image_sizes=[(4000, 3000)])) == 224
    assert suggested_image_size(ScanResult("x", image_sizes=[(8, 8)])) == 32
    assert suggested_image_size(ScanResult("x")) is None
    assert looks_like_characters(["A", "B", "7"]) and looks_like_characters(["one", "two"])
    assert not looks_like_characters(["cat", "dog"]) and not looks_like_characters(["a"])


def test_classes_whose_names_a_mirror_swaps_train_without_flips(tmp_path):
    """turn_left and turn_right: a flipped image of one is the other, however few images there are to measure."""
    from trainer.data.suggest import flip_rule, mirror_named

    assert mirror_named(["turn_left", "turn_right", "stop"]) == [("turn_left", "turn_right")]
    assert mirror_named(["Left-Hand", "Right-Hand"]) == [("Left-Hand", "Right-Hand")]
    assert mirror_named(["cw", "ccw"]) == [("cw", "ccw")]
    assert mirror_named(["bright", "bleft", "cat"]) == [], "a word, not letters inside one"
    scan = scan_image_folder(folder(tmp_path / "arrows", ["turn_left", "turn_right", "stop"], (20, 20)))
    assert flip_rule(scan) == (False, "mirrored, turn_left would be turn_right (the class names)")


def test_class_names_that_share_a_prefix_are_still_seen_as_characters():
    assert looks_like_characters([f"digit_{i}" for i in range(10)])
    assert looks_like_characters(["char-A", "char-B", "char-C"]) and looks_like_characters(["d0", "d1", "d2"])
    assert not looks_like_characters(["cat", "car", "cab"]), "a shared 'ca' is not a prefix to set aside"


def test_flips_stay_off_where_a_mirrored_class_looks_like_another(tmp_path, shapes_dir):
    """Judged from the images, not the names: arrows pointing left and right are each other's mirror images."""
    import numpy as np
    from PIL import Image, ImageDraw

    from trainer.data.scan import scan_image_folder
    from trainer.data.suggest import flip_rule

    rng = np.random.default_rng(0)
    arrows = {"pointer": [(4, 16), (20, 6), (20, 26)], "marker": [(28, 16), (12, 6), (12, 26)],  # left, right
              "stop": [(8, 8), (24, 8), (24, 24), (8, 24)]}
    for name, polygon in arrows.items():
        (tmp_path / name).mkdir()
        for i in range(40):
            image = Image.new("L", (32, 32), 255)
            dx, dy = rng.integers(-2, 3, size=2)
            ImageDraw.Draw(image).polygon([(x + dx, y + dy) for x, y in polygon], fill=int(rng.integers(0, 80)))
            image.save(tmp_path / name / f"{i}.png")
    safe, why = flip_rule(scan_image_folder(tmp_path, full=False))
    assert not safe and "pointer -> marker" in why
    assert flip_rule(scan_image_folder(shapes_dir, full=False))[0], "shapes drawn anywhere: flips are fine"


def test_augment_auto_is_decided_by_the_trainer_for_the_data_and_said_in_run_start(tmp_path):
    """data.augment's defaults are auto (issue #47): a digits folder trains without flips, a multi-label run with
    crops of at least 80%, each decision with its reason in run_start and the log; a value the config sets is kept."""
    from types import SimpleNamespace

    from helpers import run_here, write_config

    from trainer.core.config import AugmentConfig, RunConfig, load_config
    from trainer.core.events import read_events
    from trainer.core.rundir import RunDir
    from trainer.data.suggest import MULTILABEL_CROP_MIN, resolve_augment

    assert RunConfig().data.augment.hflip == RunConfig().data.augment.crop_scale_min == "auto"
    photos = scan_image_folder(folder(tmp_path / "photos", ["cat", "dog"], (40, 30)))
    mosaic = SimpleNamespace(classes=["3", "7"], samples=[], labels_file=True)
    decided = resolve_augment(photos_aug := AugmentConfig(), photos)
    assert (photos_aug.hflip, photos_aug.crop_scale_min) == (True, 0.6) and len(decided) == 2
    resolve_augment(mosaic_aug := AugmentConfig(), mosaic)
    assert (mosaic_aug.hflip, mosaic_aug.crop_scale_min) == (False, MULTILABEL_CROP_MIN)
    mine = AugmentConfig(hflip=True, crop_scale_min=0.3)
    assert resolve_augment(mine, mosaic) == [] and (mine.hflip, mine.crop_scale_min) == (True, 0.3), "set: kept"

    digits = folder(tmp_path / "digits", [str(d) for d in range(3)], (16, 16), per_class=6)
    cfg = write_config(tmp_path, digits, train={"epochs": 1})
    done = run_here("train", cfg, "--run-dir", tmp_path / "run")
    assert done.returncode == 0, done.stderr[-2000:]
    start = next(e for e in read_events(tmp_path / "run" / "events.jsonl") if e["event"] == "run_start")
    said = {c["key"]: c for c in start["augment"]}
    assert said["data.augment.hflip"]["value"] is False and "characters" in said["data.augment.hflip"]["why"]
    assert start["config"]["data"]["augment"]["hflip"] is False, "the run's config shows what it trained with"
    kept = load_config(tmp_path / "run" / "config.yaml").data.augment
    assert (kept.hflip, kept.crop_scale_min) == (False, 0.8), "config.yaml holds what auto became, not auto"
    as_set = RunDir(tmp_path / "run").settings().data.augment  # the run's settings for another run (Runs: open)
    assert (as_set.hflip, as_set.crop_scale_min) == ("auto", "auto")
    again = run_here("train", tmp_path / "run" / "config.yaml", "--run-dir", tmp_path / "run2")
    start = next(e for e in read_events(tmp_path / "run2" / "events.jsonl") if e["event"] == "run_start")
    assert again.returncode == 0 and start["augment"] == [], "a copy of the run trains with the same values, as set"
    assert "data.augment.hflip: auto -> False" in done.stderr
    bad = run_here("train", write_config(tmp_path, digits, data={"augment": {"hflip": "sometimes"}}))
    assert bad.returncode == 2 and "data.augment.hflip: must be one of auto, true, false; got 'sometimes'" in bad.stderr
