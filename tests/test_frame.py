"""Non-square input (data.image_width) and the fit of other shapes (data.resize: crop or pad), in every path that
turns a file into the network's input: training, validation, the cache, predict, the ONNX export and its card (#47)."""

import csv
import json

import numpy as np
import pytest
import torch
from helpers import run_here, wide_images, write_config

from trainer.core.config import DataConfig
from trainer.data.frame import Frame
from trainer.data.loader import decode_image, load_data


@pytest.fixture(scope="module")
def wide(tmp_path_factory):
    return wide_images(tmp_path_factory.mktemp("wide") / "train", per_class=60)


def brightest_column_share(image: torch.Tensor) -> float:
    """Where the disc is, as a share of the width (0 left, 1 right)."""
    columns = image.float().mean(dim=(0, 1))
    return int(columns.argmax()) / image.shape[-1]


def test_each_fit_decodes_the_image_as_it_says(wide):
    path = str(wide / "left" / "000.png")
    kept = decode_image(path, Frame(24, 48))  # the images' own shape: nothing cut, nothing padded
    assert kept.shape == (3, 24, 48) and brightest_column_share(kept) < 0.25
    square = decode_image(path, Frame(24, 24))  # crop: the centre square, the left quarter cut off
    assert square.shape == (3, 24, 24) and square.float().max() < 200, "the disc is outside the centre crop"
    padded = decode_image(path, Frame(24, 24, "pad"))  # pad: the whole image, 24 x 12, on black above and below
    assert padded.shape == (3, 24, 24) and brightest_column_share(padded) < 0.25
    assert padded[:, :6].max() == 0 and padded[:, -6:].max() == 0 and padded[:, 6:18].float().mean() > 60
    tall = decode_image(path, Frame(48, 24, "pad"))  # a tall frame: the wide image in its middle rows
    assert tall.shape == (3, 48, 24) and tall[:, :18].max() == 0 and tall[:, -18:].max() == 0


def test_the_cache_keeps_each_frame_apart(wide, tmp_path):
    shapes = {}
    for width, fit in ((0, "crop"), (48, "crop"), (0, "pad")):
        cfg = DataConfig(train_dir=str(wide), image_size=24, image_width=width, resize=fit, cache="disk",
                         cache_dir=str(tmp_path))
        bundle = load_data(cfg, seed=0, workers=0)
        shapes[(width, fit)] = tuple(bundle.train.store.images.shape[1:])
        assert torch.equal(torch.from_numpy(np.array(bundle.train.store.images[0])),
                           decode_image(bundle.train.samples[0][0], Frame.of(cfg)))
    assert shapes == {(0, "crop"): (3, 24, 24), (48, "crop"): (3, 24, 48), (0, "pad"): (3, 24, 24)}
    assert len([p for p in tmp_path.iterdir() if p.is_dir()]) == 3, "one entry per frame, none reused for another"


def test_a_wide_run_trains_exports_and_predicts_the_same_numbers_everywhere(wide, tmp_path):
    config = write_config(tmp_path, wide, data={"image_size": 24, "image_width": 48, "batch_size": 16},
                          optimizer={"name": "adamw", "lr": 0.003}, train={"epochs": 4, "amp": "none"},
                          export={"formats": ["onnx"]})
    done = run_here("train", config, "--runs-dir", tmp_path / "runs")
    assert done.returncode == 0, done.stderr[-3000:]
    (run,) = (tmp_path / "runs").iterdir()
    status = json.loads((run / "status.json").read_text())
    assert status["best_acc"] >= 0.9, "the disc at the ends of the images is seen: a square crop would cut it off"

    # validation's own predictions (eval/val), the checkpoint's (predict) and the ONNX file's: the same numbers
    rows = list(csv.DictReader((run / "eval" / "val" / "predictions.csv").open()))[:12]
    images = [r["path"] for r in rows]
    from_run = json.loads(run_here("predict", run, *images, "--json").stdout)
    from_onnx = json.loads(run_here("predict", run / "exports" / "model.onnx", *images, "--json").stdout)
    for row, a, b in zip(rows, from_run, from_onnx):
        assert a["top"][0][0] == b["top"][0][0] == row["predicted"]
        assert abs(a["top"][0][1] - float(row["confidence"])) < 1e-4 and abs(a["top"][0][1] - b["top"][0][1]) < 1e-4

    import onnx

    graph = onnx.load(str(run / "exports" / "model.onnx")).graph
    dims = [d.dim_value or d.dim_param for d in graph.input[0].type.tensor_type.shape.dim]
    assert dims[1:] == [3, 24, 48]
    card = json.loads((run / "exports" / "model.onnx.json").read_text())
    assert (card["image_size"], card["image_width"], card["fit"]) == (24, 48, "crop")
    text = (run / "exports" / "model.onnx.md").read_text()
    assert "48 pixels wide, 24 high" in text and "N x 3 x 24 x 48 (height, width)" in text
