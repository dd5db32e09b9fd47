"""Multi-label data, its first part (issue #36): the labels file read and checked against the folder, both layouts,
and every bad input named by its line, exit 2, in one short message."""

from __future__ import annotations

import pytest
from helpers import run_here, write_config

from trainer.data.demo_data import write_demo_dataset
from trainer.data.labels import read_labels


@pytest.fixture
def images(tmp_path):
    """Six real PNGs (the demo shapes) in one flat-named folder tree."""
    root = write_demo_dataset(tmp_path / "photos", per_class=2, size=16, seed=0)
    return root, sorted(p.relative_to(root).as_posix() for p in root.rglob("*.png"))


def test_both_layouts_give_the_same_labels_and_check_data_reports_them(images, tmp_path):
    root, files = images
    sets = [("cat", "outdoor"), ("cat",), (), ("dog", "outdoor", "night"), ("outdoor",), ("dog", "cat")]
    listed = root / "labels.csv"
    listed.write_text("file,labels\n" + "".join(f"{f},{';'.join(s)}\n" for f, s in zip(files, sets)))
    names = ["cat", "dog", "night", "outdoor"]  # a list per image: its labels sorted, as class folders are

    def write_one_hot(columns):
        path = root / f"onehot-{'-'.join(columns)}.csv"
        path.write_text("file," + ",".join(columns) + "\n" + "".join(
            f"{f}," + ",".join("1" if n in s else "0" for n in columns) + "\n" for f, s in zip(files, sets)))
        return path

    a, b = read_labels(listed), read_labels(write_one_hot(names))
    assert a.names == b.names == names and a.items == b.items
    assert a.counts == {"cat": 3, "outdoor": 3, "dog": 2, "night": 1} and a.unlabelled == 1
    assert a.co_occurrence()[("cat", "outdoor")] == 1 and a.co_occurrence()[("dog", "outdoor")] == 1
    assert read_labels(write_one_hot(["outdoor", "cat", "night", "dog"])).names == ["outdoor", "cat", "night", "dog"]

    done = run_here("check-data", root, "--labels", listed.name, cwd=root)  # a path relative to where one stands
    assert done.returncode == 0, done.stderr
    assert f"{listed}: 4 labels on 6 usable images (1 with no label)" in done.stdout
    assert "  cat      3" in done.stdout and "most often together:" in done.stdout


def test_bom_crlf_and_pipes_are_read_as_a_user_saved_them(images):
    root, files = images
    path = root / "excel.csv"
    path.write_bytes(("\ufefffile,labels\r\n" + "".join(f"{f},cat|dog\r\n" for f in files)).encode("utf-8"))
    labels = read_labels(path)
    assert labels.names == ["cat", "dog"] and all(ls == (0, 1) for _, ls in labels.items)


@pytest.mark.parametrize("text, said", [
    ("file,labels\n{0},cat\nmissing.png,dog\n", "line 3: {root}/missing.png is not an image in the folder"),
    ("file,labels\n{0},\n{1},\n", "every image has an empty label set"),
    ('file,labels\n{0},"cat,dog"\n', "line 2: label 'cat,dog' holds a comma, a slash"),
    ("file,labels\n{0},cats/dogs\n", "line 2: label 'cats/dogs' holds a comma, a slash"),
    ("file,labels\n{0},cat\n{0},dog\n", "line 3: '{0}' is listed again (first on line 2)"),
    ("file,cat,dog\n{0},1,maybe\n", "line 2: dog is 'maybe', not 1 or 0"),
    ("file,cat,cat\n{0},1,0\n", "line 1: label 'cat' is a column twice"),
    ("image,label\n{0},cat\n", "line 1: expected a header `file,labels`"),
    ("file,labels\n{0},cat,dog\n", "line 2: 3 cells; separate an image's labels with ; or |"),
])
def test_a_bad_labels_file_is_one_message_naming_the_line_exit_2_and_no_run(images, tmp_path, text, said):
    root, files = images
    path = root / "labels.csv"
    path.write_text(text.format(*files))
    done = run_here("check-data", root, "--labels", path)
    assert done.returncode == 2 and said.format(*files, root=root) in done.stderr, done.stderr
    assert "Traceback" not in done.stderr and len(done.stderr.strip().splitlines()) == 1


@pytest.mark.slow
def test_200_000_bad_rows_are_counted_not_listed_and_train_stops_before_a_run(images, tmp_path):
    root, files = images
    path = root / "big.csv"
    path.write_text("file,cat\n" + "".join(f"img{i}.png,2\n" for i in range(200_000)))
    config = write_config(tmp_path, root, data={"labels": str(path)}, loss={"name": "bce"})
    done = run_here("train", config, "--runs-dir", tmp_path / "runs")
    message = done.stderr.strip()
    assert done.returncode == 2 and len(message.splitlines()) == 1 and "Traceback" not in message
    assert message.count("is '2', not 1 or 0") == 5 and "and 199995 more" in message and len(message) < 1000
    assert not (tmp_path / "runs").exists()
