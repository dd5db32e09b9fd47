"""Input a user (or someone handing them files) gives that must not hurt: paths however they are written, YAML built to
explode, files that are not regular files, links that make one file two images, oversized cells and sweeps, and two
writers of one manifest (issue #45). Each answers in one line, in bounded time and memory."""

import os
import shutil

import pytest
import yaml
from helpers import digit_mosaics, run_here, write_config

from trainer.core.rundir import RunDir


@pytest.fixture(scope="module")
def mosaics(tmp_path_factory):
    root = tmp_path_factory.mktemp("ml") / "ml"
    digit_mosaics(root, 60, seed=1)
    return root


def test_a_relative_folder_and_labels_file_check_as_the_absolute_ones(mosaics, tmp_path):
    """`check-data ml --labels ml/labels.csv` said every image "is not an image in the folder"."""
    work = tmp_path / "work"
    work.mkdir()
    shutil.copytree(mosaics, work / "ml")
    relative = run_here("check-data", "ml/images", "--labels", "ml/labels.csv", cwd=work)
    absolute = run_here("check-data", work / "ml" / "images", "--labels", work / "ml" / "labels.csv")
    assert relative.returncode == absolute.returncode == 0, relative.stderr + relative.stdout
    assert "60 images" in relative.stdout and "not an image in the folder" not in relative.stdout + relative.stderr
    assert relative.stdout.replace(str(work) + "/", "") == absolute.stdout.replace(str(work) + "/", "")


def test_relative_run_and_runs_directories_keep_the_manifest_where_it_is(shapes_dir, tmp_path):
    """`train cfg --set data.exclude=/abs/m.yaml --runs-dir runs` looked for runs/X/runs/X/exclude.yaml and failed."""
    cfg = write_config(tmp_path, shapes_dir, train={"epochs": 1})
    manifest = tmp_path / "m.yaml"
    left_out = sorted((shapes_dir / "circle").glob("*.png"))[:3]
    manifest.write_text(yaml.safe_dump({"exclude": [str(p) for p in left_out]}))
    by_runs_dir = run_here("train", cfg, "--set", f"data.exclude={manifest}", "--runs-dir", "runs", cwd=tmp_path)
    assert by_runs_dir.returncode == 0, by_runs_dir.stderr[-2000:]
    by_run_dir = run_here("train", cfg, "--set", "data.exclude=m.yaml", "--run-dir", "rel/M1", cwd=tmp_path)
    assert by_run_dir.returncode == 0, by_run_dir.stderr[-2000:]
    runs = [RunDir(p) for p in (tmp_path / "runs").iterdir()] + [RunDir(tmp_path / "rel" / "M1")]
    for run in runs:
        assert run.read_status()["state"] == "completed"
        kept = yaml.safe_load(run.manifest.read_text())
        assert sorted(map(os.path.realpath, kept["exclude"])) == [os.path.realpath(p) for p in left_out]
