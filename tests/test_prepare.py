"""One way to create a run (`trainer.runs.prepare.prepare_run`): `train`, `queue add` and sweeps all freeze the
data.exclude manifest into the run, and a refused config leaves no run directory, whoever asked."""

import yaml
from helpers import write_config

from trainer import cli
from trainer.core.config import load_config
from trainer.core.rundir import list_runs
from trainer.data.manifest import read_manifest, write_manifest
from trainer.runs import queue


def manifest_config(tmp_path, shapes_dir):
    """A config whose data.exclude leaves two circles out and relabels one to square."""
    manifest = read_manifest(tmp_path / "project" / "cfg.exclude.yaml")
    circles = sorted(shapes_dir.glob("circle/*.png"))
    manifest.mark_excluded(str(circles[0]))
    manifest.mark_excluded(str(circles[1]))
    manifest.mark_relabelled(str(circles[2]), "square")
    write_manifest(manifest)
    return write_config(tmp_path, shapes_dir, data={"exclude": str(manifest.path)}), manifest.path


def assert_frozen_manifest(run, original):
    cfg = load_config(run.config)
    assert cfg.data.exclude == str(run.manifest) and run.manifest.exists(), "the run keeps its own copy"
    frozen = read_manifest(run.manifest)
    assert (len(frozen.exclude), len(frozen.relabel)) == (2, 1)
    assert frozen.entries() == read_manifest(original).entries()  # the same images, stored relative to the copy


def test_queued_and_swept_runs_carry_their_manifest(tmp_path, shapes_dir, capsys):
    cfg_path, original = manifest_config(tmp_path, shapes_dir)
    runs = tmp_path / "runs"
    assert cli.main(["queue", "add", str(cfg_path), "--runs-dir", str(runs)]) == 0
    (queued,) = queue.queued(runs)
    assert_frozen_manifest(queued, original)

    sweep = tmp_path / "sweep.yaml"
    sweep.write_text(yaml.safe_dump({"base": str(cfg_path), "grid": {"optimizer.lr": [0.01, 0.1]}}))
    assert cli.main(["sweep", str(sweep), "--runs-dir", str(runs)]) == 0
    trials = [r for r in queue.queued(runs) if r.path != queued.path]
    assert len(trials) == 2
    for run in trials:
        assert_frozen_manifest(run, original)
    write_manifest(read_manifest(original), original)  # a later edit of the manifest changes no queued run
    capsys.readouterr()


def test_a_refused_config_leaves_no_run_directory_from_any_creator(tmp_path, shapes_dir, capsys):
    runs = tmp_path / "runs"
    bad = write_config(tmp_path, shapes_dir, optimizer={"groups": [{"pattern": "no_such_layer.*", "lr": 0.1}]})
    assert cli.main(["train", str(bad), "--runs-dir", str(runs)]) == 2
    assert cli.main(["train", str(bad), "--run-dir", str(runs / "mine")]) == 2
    assert cli.main(["queue", "add", str(bad), "--runs-dir", str(runs)]) == 2
    err = capsys.readouterr().err
    assert err.count("optimizer.groups[0]") == 3 and "Traceback" not in err

    good = tmp_path / "good.yaml"
    good.write_text(bad.read_text())
    raw = yaml.safe_load(good.read_text())
    raw["optimizer"] = {"name": "sgd", "lr": 0.05}
    good.write_text(yaml.safe_dump(raw))
    sweep = tmp_path / "sweep.yaml"  # the second trial's folder does not exist: nothing of the sweep is queued
    sweep.write_text(yaml.safe_dump({"base": str(good), "grid": {"data.train_dir": [str(shapes_dir),
                                                                                    str(tmp_path / "missing")]}}))
    assert cli.main(["sweep", str(sweep), "--runs-dir", str(runs)]) == 2
    assert "data.train_dir" in capsys.readouterr().err
    assert not (runs / "mine").exists() and list_runs(runs) == []
    assert not runs.exists() or [p.name for p in runs.iterdir() if not p.name.startswith(".")] == []


def test_a_group_the_frozen_backbone_empties_is_refused_before_launch(tmp_path, shapes_dir, capsys):
    """The trainer groups only the parameters that train: with model.freeze_backbone, a backbone pattern gets
    nothing. Pre-flight says so, naming the group, and no run directory is made."""
    runs = tmp_path / "runs"
    cfg = write_config(tmp_path, shapes_dir, model={"name": "resnet18", "freeze_backbone": True},
                       optimizer={"groups": [{"pattern": "fc", "lr": 0.1}, {"pattern": "layer4", "lr": 0.01}]})
    assert cli.main(["train", str(cfg), "--runs-dir", str(runs)]) == 2
    err = capsys.readouterr().err
    assert "optimizer.groups[1].pattern: 'layer4' matches only backbone parameters" in err, err
    assert "groups[0]" not in err and "freeze_backbone" in err and "Traceback" not in err
    assert list_runs(runs) == []
    unfrozen = write_config(tmp_path, shapes_dir, model={"name": "resnet18"},
                            optimizer={"groups": [{"pattern": "fc", "lr": 0.1}, {"pattern": "layer4", "lr": 0.01}]})
    from trainer.train.preflight import preflight

    preflight(load_config(unfrozen))  # the same groups are fine when the backbone trains
