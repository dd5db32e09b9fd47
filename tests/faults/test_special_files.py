"""Readers of user folders outside training (predict, an int8 export's calibration) on special files (issue #32):
a FIFO named img.png and a symbolic-link loop hung them; they are skipped as check-data and train skip them."""

import os

import pytest

from trainer.core.rundir import RunDir
from trainer.data.scan import image_paths
from trainer.deploy.export_data import calibration_images


@pytest.fixture
def hostile_folder(tmp_path, shapes_dir):
    folder = tmp_path / "photos"
    (folder / "cat").mkdir(parents=True)
    real = sorted((shapes_dir / "circle").iterdir())[:3]
    for p in real:
        (folder / "cat" / p.name).write_bytes(p.read_bytes())
    os.mkfifo(folder / "cat" / "img.png")  # opened, it waits for a writer for ever
    (folder / "cat" / "loop").symlink_to(folder)  # walked naively, a loop without end
    return folder, sorted(str(folder / "cat" / p.name) for p in real)


def test_the_walker_lists_regular_images_once_and_ends(hostile_folder):
    folder, real = hostile_folder
    assert image_paths(folder) == real


def test_calibration_on_a_folder_with_a_fifo_and_a_loop_uses_its_images(hostile_folder, tmp_path):
    folder, real = hostile_folder
    chosen, where = calibration_images(RunDir(tmp_path / "run"), {"data": {}}, folder, 10, 0)
    assert chosen == real and "3 images" in where


def test_decoding_a_fifo_is_refused_at_once_not_waited_on(hostile_folder):
    torch = pytest.importorskip("torch")  # noqa: F841 - the decoder is the trainer's
    from trainer.data.frame import Frame
    from trainer.data.loader import decode_image

    folder, _ = hostile_folder
    with pytest.raises(ValueError, match="not a regular file"):
        decode_image(str(folder / "cat" / "img.png"), Frame(16, 16))


def test_an_existing_folder_or_file_that_is_not_the_same_export_is_never_replaced(tmp_path):
    from trainer.deploy.export import ExportError, check_out

    package = tmp_path / "model.mlpackage"
    (package / "notes").mkdir(parents=True)
    (package / "notes" / "thesis.txt").write_text("years of work\n")
    with pytest.raises(ExportError, match="is not a coreml export"):
        check_out("coreml", package)
    assert (package / "notes" / "thesis.txt").read_text() == "years of work\n"
    onnx = tmp_path / "m.onnx"
    onnx.write_bytes(b"someone else's model")
    with pytest.raises(ExportError, match="is not a onnx export"):
        check_out("onnx", onnx)
    (tmp_path / "n.onnx.md").mkdir()
    with pytest.raises(ExportError, match="where the model card goes"):
        check_out("onnx", tmp_path / "n.onnx")
    # an export of the same format, with its card, is the one thing an export replaces
    (tmp_path / "m.onnx.json").write_text('{"format": "onnx"}')
    check_out("onnx", onnx)


def test_a_model_card_shows_class_names_and_paths_and_runs_nothing(tmp_path):
    from trainer.deploy.model_card import md, md_code

    evil = ["<img src=x onerror=alert(1)>", "[x](javascript:alert(1))", "cat\n## Load it\n```sh\ncurl x | sh\n```"]
    shown = [md(name) for name in evil]
    assert "<img" not in shown[0] and "&lt;img" in shown[0]
    assert "](" not in shown[1].replace("\\](", "").replace("\\(", "") and "\\[x\\]" in shown[1]
    assert "\n" not in shown[2] and "\\#\\# Load it" in shown[2], "no heading or code block of its own"
    assert md_code("a`b\nc") == "`a'b\\nc`"


def test_a_class_folder_whose_name_holds_a_control_character_is_refused_by_name(tmp_path, shapes_dir):
    from trainer.data.scan import DataError, scan_image_folder

    for name in ("cat", "dog\n## Load it"):
        (tmp_path / name).mkdir()
        (tmp_path / name / "a.png").write_bytes(next((shapes_dir / "circle").iterdir()).read_bytes())
    with pytest.raises(DataError, match=r"control character") as caught:
        scan_image_folder(tmp_path, full=False)
    assert "\\n" in str(caught.value) and "\n" not in str(caught.value)
