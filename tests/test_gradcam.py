"""Grad-CAM points at the evidence: on images whose class is given by a bright patch in one corner (which corner
varies from image to image; the other class has none), the map of a trained network peaks in that corner; the
overlay is written, bad input is named."""

import json

import numpy as np
import pytest
from helpers import run_here, train_here, write_config
from PIL import Image

from trainer import cli
from trainer.deploy.gradcam import OUTSIDE_DIM, SCALE_HEIGHT

CORNERS = [(0, 0), (0, 1), (1, 0), (1, 1)]  # (row, column) halves: top left, top right, bottom left, bottom right
SIZE, PATCH = 32, 8


def write_patch_dataset(root, per_class: int, seed: int):
    """marked/: noise with a bright patch in a random corner (named in the file); plain/: noise alone."""
    rng = np.random.default_rng(seed)
    for name in ("marked", "plain"):
        (root / name).mkdir(parents=True, exist_ok=True)
        for i in range(per_class):
            img = rng.integers(0, 120, (SIZE, SIZE, 3), dtype=np.uint8)
            cy, cx = CORNERS[i % 4]
            if name == "marked":
                y = rng.integers(1, 4) + cy * (SIZE - PATCH - 4)
                x = rng.integers(1, 4) + cx * (SIZE - PATCH - 4)
                img[y:y + PATCH, x:x + PATCH] = 250
            Image.fromarray(img).save(root / name / f"{i:03d}-corner{cy}{cx}.png")
    return root


@pytest.fixture(scope="module")
def patch_run(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("patches")
    train = write_patch_dataset(tmp / "train", 60, seed=0)
    held_out = write_patch_dataset(tmp / "held_out", 8, seed=1)
    cfg = write_config(tmp, train, data={"image_size": SIZE, "augment": {"hflip": False, "random_resized_crop": False}},
                       train={"epochs": 4})
    run, code = train_here(cfg, tmp / "runs")
    assert code == 0, run.tail_log()
    return run, held_out, tmp


def test_grad_cam_peaks_over_the_discriminative_corner(patch_run, capsys):
    run, held_out, tmp = patch_run
    hits = []
    for image in sorted((held_out / "marked").glob("*.png")):
        cy, cx = int(image.stem[-2]), int(image.stem[-1])
        out = tmp / "cam" / f"{image.stem}.png"
        assert cli.main(["grad-cam", str(run.path), str(image), "--out", str(out)]) == 0  # as the app's subprocess
        summary = json.loads(capsys.readouterr().out)
        assert summary["predicted"] == summary["explained"] == "marked", summary
        py, px = summary["peak"]
        hits.append((py >= 0.5) == bool(cy) and (px >= 0.5) == bool(cx))
        shown = Image.open(out)
        assert shown.size == (320, 320 + SCALE_HEIGHT) and shown.mode == "RGB" and summary["seen"] is None
    assert len(hits) == 8 and sum(hits) >= 7, hits  # at most one peak outside the patch's corner


def test_grad_cam_of_another_class_and_bad_input(patch_run):
    run, held_out, tmp = patch_run
    image = next((held_out / "marked").glob("*.png"))
    result = run_here("grad-cam", run.path, image, "--out", tmp / "other.png", "--class", "plain")
    assert result.returncode == 0 and json.loads(result.stdout)["explained"] == "plain"
    result = run_here("grad-cam", run.path, image, "--out", tmp / "x.png", "--class", "giraffe")
    assert result.returncode == 2 and "'giraffe' is not a class" in result.stderr
    text = tmp / "notes.txt"
    text.write_text("hello")
    result = run_here("grad-cam", run.path, text, "--out", tmp / "x.png")
    assert result.returncode == 2 and f"{text}: cannot read image" in result.stderr
    assert "Traceback" not in result.stderr


def test_a_wide_image_is_shown_whole_with_the_part_the_network_sees_outlined_and_a_colour_scale(patch_run, capsys):
    """Issue #71: Grad-CAM on a wide image showed only the square centre crop, with no colour scale."""
    run, held_out, tmp = patch_run
    square = np.asarray(Image.open(next((held_out / "marked").glob("*.png"))))
    wide = np.concatenate([np.full((SIZE, SIZE, 3), 200, np.uint8), square, np.full((SIZE, SIZE, 3), 200, np.uint8)],
                          axis=1)  # 96 x 32: the network (a 32 px square frame, centre crop) sees the middle third
    Image.fromarray(wide).save(tmp / "wide.png")
    out = tmp / "cam" / "wide.png"
    assert cli.main(["grad-cam", str(run.path), str(tmp / "wide.png"), "--out", str(out)]) == 0
    summary = json.loads(capsys.readouterr().out)
    shown = np.asarray(Image.open(out)).astype(float)
    picture, scale = shown[:-SCALE_HEIGHT], shown[-SCALE_HEIGHT:]
    assert picture.shape[:2] == (107, 320), "the whole image, in its own proportions"
    top, left, bottom, right = summary["seen"]
    assert (top, bottom) == (0, 1) and abs(left - 1 / 3) < 0.01 and abs(right - 2 / 3) < 0.01
    outside = picture[10:-10, 10:90]  # the left third: the plain 200 grey, dimmed
    assert abs(outside.mean() - 200 * OUTSIDE_DIM) < 3
    ramp = scale[4, 30:-30].mean(axis=1)
    assert ramp[-1] > ramp[0] + 100, "the scale runs from dark (no evidence) to bright (the peak)"
