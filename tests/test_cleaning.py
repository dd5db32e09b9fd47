"""Cleaning a dataset without harm: the data.exclude manifest leaves images out or relabels them on the next scan
and run, the run records it, and the dataset folder is untouched."""

import hashlib
import shutil

import pytest
from helpers import run_here, write_config

from trainer.core.events import read_events
from trainer.data.manifest import read_manifest, write_manifest
from trainer.data.scan import DataError, scan_image_folder


def folder_checksums(root):
    return {str(p.relative_to(root)): (hashlib.sha256(p.read_bytes()).hexdigest(), p.stat().st_mtime_ns)
            for p in sorted(root.rglob("*")) if p.is_file()}


@pytest.fixture
def photos(tmp_path, shapes_dir):
    root = tmp_path / "photos" / "train"
    shutil.copytree(shapes_dir, root)
    return root


def test_the_manifest_takes_effect_on_the_next_scan_and_leaves_the_files_alone(photos, tmp_path):
    before = folder_checksums(photos)
    circles = sorted(photos.glob("circle/*.png"))
    manifest = read_manifest(tmp_path / "project" / "exclude.yaml")  # not there yet: empty
    assert len(manifest) == 0
    manifest.mark_excluded(str(circles[0]))
    manifest.mark_excluded(str(circles[1]))
    manifest.mark_relabelled(str(circles[2]), "square")
    write_manifest(manifest)
    text = (tmp_path / "project" / "exclude.yaml").read_text()
    assert "../photos/train/circle/" in text  # stored relative to the manifest: the project can move

    plain = scan_image_folder(photos)
    cleaned = scan_image_folder(photos, manifest=read_manifest(tmp_path / "project" / "exclude.yaml"))
    assert (cleaned.excluded, cleaned.relabelled) == (2, 1)
    assert cleaned.counts["circle"] == plain.counts["circle"] - 3
    assert cleaned.counts["square"] == plain.counts["square"] + 1
    assert (str(circles[2]), cleaned.classes.index("square")) in cleaned.samples
    assert not any(p == str(circles[0]) for p, _ in cleaned.samples)

    again = read_manifest(tmp_path / "project" / "exclude.yaml")
    again.undo(str(circles[0]))  # undo one entry: that image is back
    write_manifest(again)
    assert scan_image_folder(photos, manifest=read_manifest(again.path)).excluded == 1
    assert folder_checksums(photos) == before


def test_a_run_uses_the_manifest_records_it_and_keeps_its_own_copy(photos, tmp_path):
    before = folder_checksums(photos)
    manifest_path = tmp_path / "exclude.yaml"
    m = read_manifest(manifest_path)
    for p in sorted(photos.glob("triangle/*.png"))[:5]:
        m.mark_excluded(str(p))
    m.mark_relabelled(str(next(photos.glob("cross/*.png"))), "circle")
    write_manifest(m)
    cfg = write_config(tmp_path, photos, data={"exclude": "exclude.yaml", "val_split": 0.25}, train={"epochs": 1})
    result = run_here("train", cfg, "--runs-dir", tmp_path / "runs")
    assert result.returncode == 0, result.stderr
    run_dir = next((tmp_path / "runs").iterdir())
    start = next(e for e in read_events(run_dir / "events.jsonl") if e["event"] == "run_start")
    assert start["manifest"]["excluded"] == 5 and start["manifest"]["relabelled"] == 1
    assert start["train_size"] + start["val_size"] == 120 - 5
    copy = read_manifest(run_dir / "exclude.yaml")  # the run's own copy, with paths that still resolve
    assert sorted(copy.exclude) == sorted(m.exclude) and copy.relabel == m.relabel
    assert start["config"]["data"]["exclude"] == str(run_dir / "exclude.yaml")
    m.undo(m.exclude[0])  # a later edit does not change what the run trained with
    write_manifest(m)
    assert len(read_manifest(run_dir / "exclude.yaml")) == 6
    assert folder_checksums(photos) == before

    report = run_here("check-data", photos, "--exclude", manifest_path)
    assert report.returncode == 0 and "the manifest leaves out 4 images, relabels 1 and adds 0" in report.stdout


def test_bad_manifests_are_refused_by_name(photos, tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("relabel:\n  circle/x.png: giraffe\n")
    with pytest.raises(DataError, match=r"bad.yaml: relabels to giraffe, which is not a class"):
        read_manifest(bad).filter([], ["circle", "square"])
    cfg = write_config(tmp_path, photos, data={"exclude": "bad.yaml"})
    result = run_here("train", cfg, "--runs-dir", tmp_path / "runs")
    assert result.returncode == 2 and "giraffe" in result.stderr and "Traceback" not in result.stderr
    assert not (tmp_path / "runs").exists() or not any((tmp_path / "runs").iterdir())
    bad.write_text("- just\n- a list\n")
    with pytest.raises(DataError, match="bad.yaml: expected the keys exclude"):
        read_manifest(bad)
    cfg = write_config(tmp_path, photos, data={"exclude": "missing.yaml"})
    result = run_here("train", cfg, "--runs-dir", tmp_path / "runs")
    assert result.returncode == 2 and "data.exclude:" in result.stderr and "no such manifest file" in result.stderr


def test_images_added_from_a_pool_join_the_training_folder_only(photos, tmp_path):
    """`add:` entries (labelled pool images): in the training folder's scan, not a validation folder's; stored
    relative to the manifest; a pool file gone since is named as unusable; undo takes one out; an unknown class is
    refused; the pool's files are untouched."""
    pool = tmp_path / "pool"
    shutil.copytree(photos / "circle", pool)
    before = folder_checksums(pool)
    m = read_manifest(tmp_path / "exclude.yaml")
    added = sorted(pool.glob("*.png"))[:3]
    for p in added:
        m.mark_added(str(p), "square")
    write_manifest(m)
    assert "add:\n  pool/" in m.path.read_text()
    m = read_manifest(m.path)
    plain = scan_image_folder(photos)
    train = scan_image_folder(photos, manifest=m, additions=True)
    assert train.added == 3 and train.counts["square"] == plain.counts["square"] + 3
    assert (str(added[0].resolve()), train.classes.index("square")) in train.samples
    assert scan_image_folder(photos, manifest=m).added == 0, "a validation folder's scan adds nothing"
    added[2].rename(tmp_path / "gone.png")
    gone = scan_image_folder(photos, manifest=m, additions=True)
    assert gone.added == 3 and len(gone.samples) == len(plain.samples) + 2 and gone.bad_files[0][0].endswith(added[2].name)
    m.undo(str(added[0]))
    assert scan_image_folder(photos, manifest=m, additions=True).added == 2
    m.mark_added(str(added[1]), "giraffe")
    with pytest.raises(DataError, match="giraffe, which is not a class"):
        scan_image_folder(photos, manifest=m, additions=True)
    (tmp_path / "gone.png").rename(added[2])
    assert folder_checksums(pool) == before
