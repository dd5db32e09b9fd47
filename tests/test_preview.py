"""`main.py augment-preview`: training images as the network sees them, augmented by the run's own code (#47)."""

import json

import numpy as np
import pytest
from helpers import run_here, write_config
from PIL import Image

from trainer.core.events import read_events
from trainer.data.demo_data import write_demo_dataset


def preview(cfg, out, *extra) -> dict:
    done = run_here("augment-preview", cfg, "--out", out, "--json", *extra)
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout)


def pixels(path) -> np.ndarray:
    return np.asarray(Image.open(path), dtype=np.int16)


@pytest.fixture(scope="module")
def shapes(tmp_path_factory):
    return write_demo_dataset(tmp_path_factory.mktemp("shapes") / "train", per_class=12, size=40, seed=5)


def test_the_preview_shows_what_each_setting_does_to_real_images(shapes, tmp_path):
    off = write_config(tmp_path, shapes, data={"image_size": 32, "augment": {
        "hflip": False, "random_resized_crop": False, "color_jitter": 0}})
    plain = preview(off, tmp_path / "off")
    labels = [row["label"] for row in plain["images"]]
    assert len(labels) == len(set(labels)) == 4, "one image of each class"
    for row in plain["images"]:
        original = pixels(row["original"])
        assert original.shape == (32, 32, 3), "decoded at the image size"
        assert all(np.array_equal(pixels(d), original) for d in row["draws"]), "nothing on: shown as decoded"

    flips = write_config(tmp_path, shapes, data={"image_size": 32, "augment": {
        "hflip": True, "random_resized_crop": False, "color_jitter": 0}})
    mirrored = 0
    for row in preview(flips, tmp_path / "flip")["images"]:
        original = pixels(row["original"])
        for draw in map(pixels, row["draws"]):
            same, mirror = np.array_equal(draw, original), np.array_equal(draw, original[:, ::-1])
            assert same or mirror, "a flip changes nothing but left and right"
            mirrored += mirror and not same
    assert 4 <= mirrored <= 12, f"about half the 16 draws mirrored, not {mirrored}"

    jitter = write_config(tmp_path, shapes, data={"image_size": 32, "augment": {
        "hflip": False, "random_resized_crop": True, "crop_scale_min": 0.3, "color_jitter": 0.4}})
    first = preview(jitter, tmp_path / "jitter")
    for row in first["images"]:
        original = pixels(row["original"])
        assert all(np.abs(pixels(d) - original).mean() > 2 for d in row["draws"]), "crops and jitter change them"
    again = preview(jitter, tmp_path / "jitter-again")
    assert all(pixels(a).tobytes() == pixels(b).tobytes() for r, s in zip(first["images"], again["images"])
               for a, b in zip(r["draws"], s["draws"])), "the same seed draws the same"
    other = preview(jitter, tmp_path / "jitter-other", "--seed", "1")
    assert any(not np.array_equal(pixels(a), pixels(b)) for r, s in zip(first["images"], other["images"])
               for a, b in zip(r["draws"], s["draws"])), "another seed, other draws"


def test_the_preview_decides_auto_as_the_run_does(tmp_path):
    """The preview's auto values are the trainer's decision for the run's own training split: the same as that
    run's run_start says (digits: no flips)."""
    digits = tmp_path / "digits"
    for d in range(3):
        (digits / str(d)).mkdir(parents=True)
        for i in range(6):
            Image.fromarray(np.random.default_rng(10 * d + i).integers(0, 255, (16, 16, 3), dtype=np.uint8)).save(
                digits / str(d) / f"{i}.png")
    cfg = write_config(tmp_path, digits, train={"epochs": 1})
    shown = preview(cfg, tmp_path / "preview")
    assert shown["augment"]["hflip"] is False and shown["augment"]["crop_scale_min"] == 0.8
    done = run_here("train", cfg, "--run-dir", tmp_path / "run")
    assert done.returncode == 0, done.stderr[-2000:]
    start = next(e for e in read_events(tmp_path / "run" / "events.jsonl") if e["event"] == "run_start")
    assert start["augment"] == shown["decided"], "one owner: what the preview showed is what the run did"


def test_a_folder_that_cannot_be_read_is_named_without_a_traceback(tmp_path):
    cfg = write_config(tmp_path, tmp_path / "nowhere")
    done = run_here("augment-preview", cfg, "--out", tmp_path / "out", "--json")
    assert done.returncode == 2 and "data.train_dir" in done.stderr and str(tmp_path / "nowhere") in done.stderr
    assert "Traceback" not in done.stderr
    done = run_here("augment-preview", cfg, "--out", tmp_path / "out", "--images", "0")
    assert done.returncode == 2 and "--images: must be at least 1, got 0" in done.stderr
