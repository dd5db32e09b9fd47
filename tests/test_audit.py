"""Label errors and outliers (issue #35): on real handwritten digits with 5% of the labels flipped by the test and
four crops of a photograph among them, `main.py audit RUN` puts the flipped images at the top of its label issues and
the crops among its outliers, keeps what it computed beside the run, and leaves the folder as it was."""

from __future__ import annotations

import csv
import json

import pytest
from helpers import run_here, write_config

pytest.importorskip("cleanlab", reason="pip install cleanlab (the .[dev] set-up installs it)")


def tree_state(folder):
    return sorted((str(p), p.stat().st_size, p.stat().st_mtime_ns) for p in folder.rglob("*"))


def test_the_flipped_labels_head_the_audit_and_the_folder_is_left_as_it_was(flipped_digits_run):
    run, flipped, _, crops = flipped_digits_run
    before = tree_state(run.path.parent.parent / "digits")
    done = run_here("audit", run.path, "--top", "5")
    assert done.returncode == 0, done.stderr[-2000:]
    assert "label issues:" in done.stdout and "of 1801 images" in done.stdout
    rows = list(csv.DictReader((run.path / "audit" / "label_issues.csv").open()))
    top = [r["path"] for r in rows[:len(flipped)]]
    precision = len(set(top) & set(flipped)) / len(flipped)  # at the number flipped, precision = recall
    assert precision >= 0.75, f"{precision:.2f} of the top {len(flipped)} are the flipped images"  # measured 0.80-0.92
    found = [r for r in rows[:len(flipped)] if r["path"] in flipped]
    right = sum(r["suggested"] == flipped[r["path"]] for r in found) / len(found)
    assert right >= 0.8, f"the suggested label is the digit shown for {right:.0%} of the flipped images found"
    outliers = [r["path"] for r in csv.DictReader((run.path / "audit" / "outliers.csv").open())]
    assert set(crops) <= set(outliers), "every crop of the photograph is beyond the fence"
    assert len(outliers) < 0.03 * 1801, f"{len(outliers)} listed: the fence lets the ordinary digits be"
    again = run_here("audit", run.path, "--json")
    report = json.loads(again.stdout)
    assert [o["path"] for o in report["outliers"]] == outliers
    assert report["reused"] is True and [s["path"] for s in report["suspects"]] == [r["path"] for r in rows]
    assert tree_state(run.path.parent.parent / "digits") == before, "nothing in the folder moved, changed or appeared"


def test_an_audit_names_what_it_cannot_do(tmp_path, shapes_dir):
    assert run_here("audit", tmp_path / "nowhere").returncode == 2
    config = write_config(tmp_path, shapes_dir, train={"epochs": 1})
    assert run_here("train", config, "--run-dir", tmp_path / "run").returncode == 0
    done = run_here("audit", tmp_path / "run", "--folds", "100")
    assert done.returncode == 2 and "--folds 100: class" in done.stderr and "Traceback" not in done.stderr
