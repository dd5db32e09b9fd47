"""Label errors, copies and outliers (issue #35): on real handwritten digits with 5% of the labels flipped by the
test, four crops of a photograph among them and test images copied back into training, `main.py audit RUN` puts the
flipped images at the top of its label issues, finds every copy as a leak and the crops among its outliers, keeps
what it computed beside the run, and leaves the folder as it was."""

from __future__ import annotations

import csv
import importlib.util
import json
import os

import pytest
from helpers import run_here, write_config

from trainer.data.findings import read_findings

pytestmark = pytest.mark.skipif(importlib.util.find_spec("cleanlab") is None,  # looked up, not imported (2 s a worker)
                                reason="pip install cleanlab (the .[dev] set-up installs it)")


def tree_state(folder):
    return sorted((str(p), p.stat().st_size, p.stat().st_mtime_ns) for p in folder.rglob("*"))


@pytest.mark.slow  # the session's digits run (~15 s) and a 5-fold audit
def test_the_flipped_labels_head_the_audit_and_the_folder_is_left_as_it_was(flipped_digits_run, monkeypatch):
    run, flipped, _, crops, _ = flipped_digits_run
    before = tree_state(run.path.parent.parent / "digits")
    done = run_here("audit", run.path, "--top", "5")
    assert done.returncode == 0, done.stderr[-2000:]
    assert "label issues:" in done.stdout and "of 1681 images" in done.stdout
    rows = list(csv.DictReader((run.path / "audit" / "label_issues.csv").open()))
    top = [r["path"] for r in rows[:len(flipped)]]
    precision = len(set(top) & set(flipped)) / len(flipped)  # at the number flipped, precision = recall
    assert precision >= 0.88, f"{precision:.2f} of the top {len(flipped)} are the flipped images"  # #69: 0.9-0.97
    flagged = [r for r in rows if r["flagged"] == "yes"]
    assert rows[:len(flagged)] == flagged and len(rows) <= 2 * len(flagged), "the flags first, then as many more"
    assert f"label issues: {len(flagged)} of 1681 images" in done.stdout
    found = [r for r in rows[:len(flipped)] if r["path"] in flipped]
    right = sum(r["suggested"] == flipped[r["path"]] for r in found) / len(found)
    assert right >= 0.8, f"the suggested label is the digit shown for {right:.0%} of the flipped images found"
    listed = list(csv.DictReader((run.path / "audit" / "outliers.csv").open()))
    outliers = [r["path"] for r in listed if r["why"] == "far"]
    assert set(crops) <= set(outliers), "every crop of the photograph is beyond the fence"
    assert len(outliers) < 0.03 * 1681, f"{len(outliers)} listed: the fence lets the ordinary digits be"
    unsure = [r for r in listed if r["why"] == "unsure"]
    tops = [float(r["top"]) for r in unsure]
    assert unsure and tops == sorted(tops) and tops[-1] < 0.5, "the unsure ones: under even odds, least sure first"
    for row in (unsure[0], unsure[-1]):  # what Try it and `main.py predict` say of them: the same odds
        said = json.loads(run_here("predict", run.path, row["path"], "--json").stdout)
        assert abs(said[0]["top"][0][1] - float(row["top"])) < 1e-3, (said, row)
    from trainer.deploy import audit

    def searched_again(*args, **kwargs):
        raise AssertionError("the same images, labels and checkpoint: the findings are kept, not searched again")

    monkeypatch.setattr(audit, "find_near_duplicates", searched_again)  # the Map asked the audit again: ~n^1.9
    monkeypatch.setattr(audit, "find_outliers", searched_again)
    again = run_here("audit", run.path, "--json")
    assert again.returncode == 0, again.stderr[-2000:]
    report = json.loads(again.stdout)
    assert [o["path"] for o in report["outliers"]] == [r["path"] for r in listed]
    assert report["reused"] is True and [s["path"] for s in report["suspects"]] == [r["path"] for r in rows]
    assert tree_state(run.path.parent.parent / "digits") == before, "nothing in the folder moved, changed or appeared"


def test_every_copy_of_a_test_image_in_training_is_a_leak_and_look_alikes_are_not(flipped_digits_run):
    """30 test images copied into training (10 exact, 10 resized to 45 px, 10 JPEG at quality 60): each is found
    with its test image as a leak, of the right kind; of the other 1,797 digits only the most alike pair of the
    whole set (two 1s, 8x8 correlation 0.994) may be taken for copies; the test score without the leaks is said."""
    run, _, _, _, copies = flipped_digits_run
    done = run_here("audit", run.path, "--json")
    assert done.returncode == 0, done.stderr[-2000:]
    report = json.loads(done.stdout)
    groups = [{i["path"]: i["split"] for i in g["images"]} | {"": g} for g in report["duplicates"]]
    for copy, (source, kind) in copies.items():
        found = [g for g in groups if copy in g and source in g]
        assert found, f"the {kind} copy {copy} of {source} is found"
        g = found[0][""]
        assert g["leak"] and g["near"] == (kind != "exact"), g
    planted = {p for c, (s, _) in copies.items() for p in (c, s)}
    others = [[p for p in g if p] for g in groups if not planted & set(g)]
    assert len(others) <= 1 and all(len(g) == 2 for g in others), f"look-alikes taken for copies: {others}"
    assert "without the 30 leaked ones" in report["leak_worth"]
    rows = list(csv.DictReader((run.path / "audit" / "duplicates.csv").open()))
    assert {r["path"] for r in rows if r["leak"] == "yes"} >= planted
    findings = read_findings(run.path)  # what check-data and the Dataset page say of the run's last audit
    assert findings.copies == len(rows) - len(report["duplicates"]) and findings.leaks >= 30
    assert findings.label_issues == sum(s["flagged"] for s in report["suspects"]) < len(report["suspects"])
    assert findings.outliers + findings.unsure == len(report["outliers"]) and findings.unsure
    said = run_here("check-data", run.path.parent.parent / "digits", "--run", run.path)
    assert findings.line() in said.stdout, said.stdout


@pytest.fixture(scope="module")
def shapes_run(tmp_path_factory, shapes_dir):
    """A one-epoch run on the generated shapes (120 images, 4 classes)."""
    tmp = tmp_path_factory.mktemp("shapes-run")
    config = write_config(tmp, shapes_dir, train={"epochs": 1})
    assert run_here("train", config, "--run-dir", tmp / "run").returncode == 0
    return tmp / "run"


def test_an_audit_names_what_it_cannot_do(tmp_path, shapes_run):
    assert run_here("audit", tmp_path / "nowhere").returncode == 2
    done = run_here("audit", shapes_run, "--folds", "100")
    assert done.returncode == 2 and "--folds 100: class" in done.stderr and "Traceback" not in done.stderr


def test_files_that_are_not_images_are_listed_as_unreadable_and_the_rest_audited(tmp_path, shapes_run, shapes_dir):
    """The audit opens each file once (its network's pass, not a scan first): a 0-byte `.png` and a text file named
    `.png` in a class folder are listed with why, and every image is audited."""
    import shutil

    import yaml

    folder = tmp_path / "shapes"
    shutil.copytree(shapes_dir, folder)
    (folder / "circle" / "empty.png").write_bytes(b"")
    (folder / "circle" / "notes.png").write_text("not an image")
    run = tmp_path / "run"
    shutil.copytree(shapes_run, run, ignore=shutil.ignore_patterns("audit"))
    config = yaml.safe_load((run / "config.yaml").read_text())
    config["data"]["train_dir"] = str(folder)
    (run / "config.yaml").write_text(yaml.safe_dump(config))
    done = run_here("audit", run, "--json")
    assert done.returncode == 0, done.stderr[-2000:]
    report = json.loads(done.stdout)
    assert report["images"] == 120
    assert sorted(report["skipped"]) == [str(folder / "circle" / "empty.png"), str(folder / "circle" / "notes.png")]
    assert all(why.startswith("cannot read image") for why in report["skipped"].values())


@pytest.mark.slow
def test_fold_runs_give_each_image_probabilities_from_a_run_that_never_saw_it(shapes_run, shapes_dir):
    """--oof runs: two training runs with the run's recipe, each without one fold (left out by its own manifest,
    the folder untouched); together they hold out every labelled image once."""
    from trainer.core.events import read_events
    from trainer.core.rundir import RunDir
    from trainer.data.manifest import read_manifest

    before = tree_state(shapes_dir)
    done = run_here("audit", shapes_run, "--oof", "runs", "--folds", "2")
    assert done.returncode == 0, done.stderr[-2000:]
    assert "2 training runs with the run's recipe, each without one fold" in done.stdout
    images = {str(p) for p in shapes_dir.rglob("*.png")}
    held = [set(read_manifest(shapes_run / "audit" / "folds" / f"fold-{f}.exclude.yaml").exclude)
            for f in (1, 2)]
    assert held[0] | held[1] == {os.path.realpath(p) for p in images} and not held[0] & held[1]
    for f in (1, 2):
        start = next(e for e in read_events(RunDir(shapes_run / "audit" / "folds" / f"fold-{f}").events)
                     if e["event"] == "run_start")
        assert start["train_size"] + start["val_size"] == len(images) - len(held[f - 1])
    rows = list(csv.DictReader((shapes_run / "audit" / "label_issues.csv").open()))
    assert all(r["fold"] in ("0", "1") for r in rows)
    assert tree_state(shapes_dir) == before


def test_the_map_keeps_each_class_together_by_opentsne_and_without_it(monkeypatch):
    """The audit's map (`--map`): embeddings of three classes projected to two dimensions, by openTSNE where
    installed (linear in the images), else scikit-learn's t-SNE; either way an image's nearest on the map is of its
    own class, and the method is named."""
    import sys

    import numpy as np

    from trainer.deploy.data_map import project

    rng = np.random.default_rng(0)
    centres = rng.normal(size=(3, 64)) * 3
    labels = np.repeat(np.arange(3), 100)
    embeddings = (centres[labels] + rng.normal(size=(300, 64))).astype(np.float32)
    monkeypatch.setitem(sys.modules, "umap", None)
    for hidden, method in ((None, "openTSNE"), ("openTSNE", "scikit-learn")):
        if hidden:
            monkeypatch.setitem(sys.modules, hidden, None)
        xy, how = project(embeddings)
        assert xy.shape == (300, 2) and method in how
        distances = ((xy[:, None, :] - xy[None, :, :]) ** 2).sum(-1) + np.eye(300) * 1e9
        assert (labels[distances.argmin(axis=1)] == labels).mean() >= 0.98


def test_a_map_of_more_images_than_t_sne_fits_places_the_others_beside_their_own_kind(monkeypatch):
    """Past data_map.FIT_UP_TO images openTSNE fits a sample and places the rest among it: every image gets a point,
    and a placed image's nearest fitted point is of its own class; the method says so."""
    import numpy as np

    from trainer.deploy import data_map

    rng = np.random.default_rng(1)
    centres = rng.normal(size=(3, 64)) * 3
    labels = np.repeat(np.arange(3), 200)
    embeddings = (centres[labels] + rng.normal(size=(600, 64))).astype(np.float32)
    monkeypatch.setattr(data_map, "FIT_UP_TO", 200)
    xy, how = data_map.project(embeddings)
    assert xy.shape == (600, 2) and np.isfinite(xy).all()
    assert "fitted on 200 of the 600 images" in how
    distances = ((xy[:, None, :] - xy[None, :, :]) ** 2).sum(-1) + np.eye(600) * 1e9
    assert (labels[distances.argmin(axis=1)] == labels).mean() >= 0.98
    assert len({(round(x, 6), round(y, 6)) for x, y in xy}) >= 590  # placed at their own spots, not piled up
    fitted = np.zeros(600, bool)
    fitted[np.sort(np.random.default_rng(0).choice(600, 200, replace=False))] = True  # project()'s draw (seed 0)
    for c in range(3):  # each class's placed images spread as its fitted ones do: no dense core in the cluster
        centre = xy[(labels == c) & fitted].mean(axis=0)
        spread = [np.linalg.norm(xy[(labels == c) & (fitted == f)] - centre, axis=1).mean() for f in (True, False)]
        assert 0.7 * spread[0] <= spread[1] <= 1.3 * spread[0], spread


def test_the_gallery_says_which_suspects_are_below_the_line():
    """Issue #69: the audit lists confident learning's flags, then as many of the least confident; the Results
    gallery counts the flags in its title and says of each one below the line that it was not flagged."""
    from app.state.audit_gallery import audit_gallery, audit_measure

    report = {"images": 10, "suspects": [
        {"path": "a.png", "given": "1", "suggested": "7", "score": 0.01, "flagged": True},
        {"path": "b.png", "given": "2", "suggested": "3", "score": 0.2, "flagged": False}]}
    found, title = audit_gallery(report, "suspects")
    assert title.startswith("1 of 10 images probably labelled wrong") and "then 1 below the line" in title
    assert "below the line" not in audit_measure(found[0]) and "below the line" in audit_measure(found[1])
    older = {"images": 10, "suspects": [{k: v for k, v in s.items() if k != "flagged"} for s in report["suspects"]]}
    assert audit_gallery(older, "suspects")[1].startswith("2 of 10"), "an older audit's list: every one flagged"
