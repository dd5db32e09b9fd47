"""Multi-label training (issue #36) on images built from real handwritten digits: mosaics of 2-4 of scikit-learn's
digits, labelled with the set of digits shown. A short run learns every label well above its frequency, chooses a
threshold per label on validation, scores its held-out test set at them, and its ONNX export gives the checkpoint's
probabilities; a bad labels file or a config of one label per image is refused before a run directory exists."""

from __future__ import annotations

import csv
import json
import os

import pytest
import torch
import yaml
from helpers import digit_mosaics, plant_label_set_errors, run_here

from trainer.core.config import RunConfig
from trainer.deploy.multilabel import average_precision, best_f1_threshold


@pytest.fixture(scope="module")
def mosaics(tmp_path_factory):
    """(root, the labels file, the planted label errors): 1,500 mosaics, 5% of them given one wrong or one missing
    label (each such image's path -> its real and its given label set)."""
    root = tmp_path_factory.mktemp("mosaics")
    labels = digit_mosaics(root / "data", 1500)
    return root, labels, plant_label_set_errors(labels, 0.05)


@pytest.fixture(scope="module")
def mosaic_run(mosaics):
    """A real run (8 epochs of the 1,275 mosaics left after a 15% test split), exported to ONNX."""
    root, labels, _ = mosaics
    config = mosaic_config(root, labels, test_split=0.15)
    done = run_here("train", config, "--runs-dir", root / "runs", "--set", "export.formats=[onnx]",
                    "--set", "train.amp=none")  # fp32 like the export: their probabilities compare to 1e-4
    assert done.returncode == 0, done.stderr[-3000:]
    (run,) = (root / "runs").iterdir()
    return run, done


def mosaic_config(root, labels_file, **data) -> str:
    raw = {"data": {"train_dir": str(labels_file.parent), "labels": str(labels_file), "image_size": 32,
                    "batch_size": 64, "num_workers": 0, **data},
           "model": {"name": "small_cnn"}, "loss": {"name": "bce"}, "optimizer": {"name": "adamw", "lr": 0.003},
           "train": {"epochs": 8, "seed": 0, "early_stop": {"metric": "val_map"}}}
    path = root / "multilabel.yaml"
    path.write_text(yaml.safe_dump(raw))
    return str(path)


@pytest.mark.slow  # a real run (8 epochs of 1,275 mosaics), its test set and an ONNX export
def test_a_short_run_learns_every_label_and_its_onnx_export_gives_the_checkpoint_s_probabilities(mosaics, mosaic_run):
    _, labels, _ = mosaics
    run, done = mosaic_run
    assert "val_map" in done.stdout and "best val_map" in done.stdout
    val = json.loads((run / "eval" / "val" / "metrics.json").read_text())
    frequency = {n: v["support"] / val["images"] for n, v in val["per_label"].items()}  # each digit: ~3 in 10
    # measured: mAP 0.85 (val), 0.84 (test) after 8 epochs; every label's AP above 0.65, its frequency about 0.3
    assert val["map"] >= 0.7, val["map"]
    assert all(v["ap"] >= frequency[n] + 0.25 for n, v in val["per_label"].items()), val["per_label"]
    thresholds = val["thresholds"]
    assert len({round(t, 3) for t in thresholds.values()}) > 1, "each label has a threshold of its own"
    test = json.loads((run / "eval" / "test" / "metrics.json").read_text())
    assert test["thresholds"] == thresholds and not test["thresholds_chosen_here"], "the test set at val's thresholds"
    assert test["images"] == round(0.15 * 1500) and test["map"] >= 0.7
    rows = list(csv.DictReader((run / "eval" / "test" / "predictions.csv").open()))
    given = {row[0]: set(row[1].split(";")) for row in csv.reader(labels.open()) if row[0] != "file"}
    assert all(set(r["true"].split(";")) == given["images/" + r["path"].rsplit("/", 1)[-1]] for r in rows)

    # evaluate on a labels file: the run's thresholds, its images' labels; a folder is refused for a multi-label run
    part = labels.parent / "first300.csv"
    part.write_text("".join(labels.read_text().splitlines(keepends=True)[:301]))
    said = run_here("evaluate", run, "--labels", part)
    assert said.returncode == 0 and "300 images: mAP" in said.stdout, said.stderr
    again = json.loads((run / "eval" / "first300" / "metrics.json").read_text())
    assert again["thresholds"] == thresholds and again["images"] == 300
    refused = run_here("evaluate", run, "--data", labels.parent)
    assert refused.returncode == 2 and "a multi-label run is evaluated on a labels file" in refused.stderr

    # the ONNX file: every label's probability, the checkpoint's to 1e-4; the labels at their thresholds
    images = [r["path"] for r in rows[:20]]
    from_run = json.loads(run_here("predict", run, *images, "--json").stdout)
    from_onnx = json.loads(run_here("predict", run / "exports" / "model.onnx", *images, "--json").stdout)
    for a, b in zip(from_run, from_onnx):
        assert a["probabilities"].keys() == b["probabilities"].keys() == thresholds.keys()
        assert max(abs(a["probabilities"][n] - b["probabilities"][n]) for n in thresholds) < 1e-4
        assert [n for n, _ in b["labels"]] == [n for n, p in sorted(b["probabilities"].items(), key=lambda x: -x[1])
                                               if p >= thresholds[n]]
    card = json.loads((run / "exports" / "model.onnx.json").read_text())
    assert card["task"] == "multilabel" and card["thresholds"] == [thresholds[n] for n in card["classes"]]
    assert card["metrics"]["agreement"] == 1.0 and card["metrics"]["map"] == pytest.approx(test["map"], abs=1e-6)


@pytest.mark.slow  # the run above, audited
def test_the_audit_lists_the_planted_label_errors_first_with_the_label_to_add_or_remove(mosaics, mosaic_run):
    """5% of the mosaics were given a wrong label (a digit shown replaced by one not shown) or lost one: the top N of
    the audit's list (N the number planted) holds most of them (measured: 80% on this run, 60 of 75, with the probe
    refitted without its first list; 83-89% over four seeds of runs without a test split in bench/multilabel_audit.py),
    and for most of those the change it suggests gives back the real label set (87-94% there), adding and removing
    just the planted labels. The unsure images are each near a label's threshold; the map has every image; --oof runs
    is refused in one line."""
    _, _, planted = mosaics
    run, _ = mosaic_run
    done = run_here("audit", run, "--map", "--json")
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(done.stdout)
    suspects = report["suspects"]
    top = [s for s in suspects[:len(planted)] if os.path.realpath(s["path"]) in planted]
    assert len(top) >= 0.75 * len(planted), (len(top), len(planted))
    right = [s for s in top if s["suggested"] == planted[os.path.realpath(s["path"])]["true"]]
    assert len(right) > 0.75 * len(top), (len(right), len(top))
    for s in right:
        real, given = (set(planted[os.path.realpath(s["path"])][k].split(";")) for k in ("true", "given"))
        assert set(filter(None, s["add"].split(";"))) == real - given and \
            set(filter(None, s["remove"].split(";"))) == given - real, s
    rows = list(csv.DictReader((run / "audit" / "label_issues.csv").open()))
    assert [r["path"] for r in rows] == [s["path"] for s in suspects] and rows[0]["add"] + rows[0]["remove"]
    thresholds = json.loads((run / "eval" / "val" / "metrics.json").read_text())["thresholds"]
    unsure = [o for o in report["outliers"] if o["why"] == "unsure"]
    assert unsure and all(abs(o["top"] - thresholds[o["about"]]) < 0.02 for o in unsure), unsure[:3]
    assert len(list(csv.DictReader((run / "audit" / "map.csv").open()))) == report["images"] == 1500
    refused = run_here("audit", run, "--oof", "runs")
    assert refused.returncode == 2 and "--oof runs" in refused.stderr and "Traceback" not in refused.stderr


@pytest.mark.slow  # the run above, over a pool of new mosaics
def test_a_pool_is_ordered_by_the_label_nearest_its_threshold_and_its_label_sets_join_training(mosaics, mosaic_run,
                                                                                              tmp_path):
    """`main.py label RUN --pool` on a multi-label run: the images whose most undecided label sits nearest its
    threshold first (that label named, its probability, the distance); label sets written as the manifest's additions
    join the training split (the next run trains on them); a label the run lacks is refused naming the manifest."""
    from trainer.data.labels import LabelsError, labelled_scan
    from trainer.data.manifest import edit_manifest, read_manifest

    _, labels, _ = mosaics
    run, _ = mosaic_run
    pool = digit_mosaics(tmp_path / "pool", 40, seed=7)
    done = run_here("label", run, "--pool", pool.parent / "images", "--next", "5", "--json")
    assert done.returncode == 0, done.stderr[-2000:]
    picks = json.loads(done.stdout)["picks"]
    thresholds = json.loads((run / "eval" / "val" / "metrics.json").read_text())["thresholds"]
    assert len(picks) == 5 and all(p["about"] in thresholds for p in picks)
    assert all(p["margin"] == pytest.approx(abs(p["probability"] - thresholds[p["about"]]), abs=1e-6) for p in picks)
    assert [p["margin"] for p in picks] == sorted(p["margin"] for p in picks)
    said = run_here("label", run, "--pool", pool.parent / "images", "--next", "3")
    assert "label next: 3 of the 40 pool images" in said.stdout and "unsure of" in said.stdout, said.stdout

    real = {os.path.realpath(pool.parent / row[0]): row[1] for row in csv.reader(pool.open()) if row[0] != "file"}
    chosen = [os.path.realpath(p["path"]) for p in picks[:2]]
    manifest = tmp_path / "exclude.yaml"
    edit_manifest(manifest, lambda m: [m.mark_added(path, real[path]) for path in chosen])
    scan = labelled_scan(str(labels), "data.labels", manifest=read_manifest(manifest), additions=True)
    hot = dict(scan.samples)
    assert scan.added == 2 and all({n for n, on in zip(scan.classes, hot[path]) if on} == set(real[path].split(";"))
                                   for path in chosen)
    assert not labelled_scan(str(labels), "data.labels", manifest=read_manifest(manifest)).added, "training only"
    edit_manifest(manifest, lambda m: m.mark_added(chosen[0], "3;x"))
    with pytest.raises(LabelsError, match="add .*label 'x' is not one of the run's labels"):
        labelled_scan(str(labels), "data.labels", manifest=read_manifest(manifest), additions=True)


@pytest.mark.slow  # two DDP ranks (gloo, torchrun): 2 epochs of 300 mosaics
def test_two_ddp_ranks_measure_the_map_of_the_whole_validation_split(tmp_path):
    """Each rank validates its share; one all-reduce of their rows gives every rank the whole split: the epoch's
    val_map is the mAP of rank 0's own predictions of every validation image (eval/val/metrics.json)."""
    labels = digit_mosaics(tmp_path / "data", 300)
    done = run_here("train", mosaic_config(tmp_path, labels), "--runs-dir", tmp_path / "runs", "--set",
                    "train.epochs=2", "device.parallel=ddp", "device.launcher=torchrun", "device.nproc=2")
    assert done.returncode == 0, done.stderr[-3000:]
    (run,) = (tmp_path / "runs").iterdir()
    epochs = [json.loads(line) for line in (run / "events.jsonl").open() if '"event": "epoch"' in line]
    val = json.loads((run / "eval" / "val" / "metrics.json").read_text())
    assert val["images"] == 60 and max(e["val_map"] for e in epochs) == pytest.approx(val["map"], abs=1e-6)


@pytest.mark.slow  # Auto's probe on 1,500 mosaics
def test_auto_plans_a_multi_label_run_by_map(mosaics, tmp_path):
    """`main.py auto FOLDER --labels FILE --plan-only`: the labels file, the multi-label loss, early stopping on mAP,
    crops that keep the labelled things in view; every choice is the config's value, and the config validates."""
    _, labels, _ = mosaics
    done = run_here("auto", labels.parent, "--labels", labels, "--minutes", "0.5", "--plan-only")
    assert done.returncode == 0, done.stderr[-2000:]
    plan = json.loads(done.stdout)
    cfg = RunConfig.from_dict(plan["config"])
    assert cfg.multilabel and cfg.data.labels == str(labels.resolve()) and cfg.loss.name == "asl"
    assert cfg.train.early_stop.metric == "val_map" and cfg.data.augment.crop_scale_min >= 0.8
    raw = cfg.to_dict()
    for choice in plan["choices"]:
        node = raw
        for part in choice["key"].split("."):
            node = node[part]
        assert node == choice["value"] and choice["why"], choice


def test_the_asymmetric_loss_leaves_easy_negatives_out_and_keeps_positives_as_bce_does():
    """ASL (loss.name asl) by hand: a positive at p = 0.5 costs -log 0.5 as in bce; a negative at p = 0.5 costs
    -log(1 - 0.45) * 0.45^4 (shifted by the 0.05 margin, down-weighted); a negative under the margin costs nothing."""
    import math

    from trainer.train.optim import AsymmetricLoss

    loss = AsymmetricLoss()
    assert float(loss(torch.zeros(1, 1), torch.ones(1, 1))) == pytest.approx(math.log(2))
    assert float(loss(torch.zeros(1, 1), torch.zeros(1, 1))) == pytest.approx(-math.log(0.55) * 0.45 ** 4)
    assert float(loss(torch.full((1, 1), math.log(0.04 / 0.96)), torch.zeros(1, 1))) == 0.0


def test_average_precision_and_the_f1_threshold_on_a_hand_worked_case():
    """Scores 0.9 (pos), 0.8 (neg), 0.7 (pos), 0.6 (pos), 0.2 (neg): precision 1, 2/3, 3/4 at the positives, each
    adding a third of the recall: AP (1 + 2/3 + 3/4) / 3; F1 is best predicting the top four (6/7), so the
    threshold falls between 0.6 and the next score down, 0.2."""
    scores = torch.tensor([0.9, 0.8, 0.7, 0.6, 0.2])
    targets = torch.tensor([1.0, 0.0, 1.0, 1.0, 0.0])
    assert average_precision(scores, targets) == pytest.approx((1 + 2 / 3 + 3 / 4) / 3)
    assert best_f1_threshold(scores, targets) == pytest.approx(0.4)
    assert average_precision(scores, torch.zeros(5)) is None and best_f1_threshold(scores, torch.zeros(5)) == 0.5


@pytest.mark.parametrize("text, said", [
    ("file,labels\nimages/00000.png,1;2\nimages/nope.png,3\n", "data.labels: {labels}: line 3: {root}/images/nope.png "
                                                               "is not an image in the folder"),
    ("file,labels\nimages/00000.png,\nimages/00001.png,\n", "every image has an empty label set"),
    ('file,labels\nimages/00000.png,"3,4"\n', "line 2: label '3,4' holds a comma, a slash"),
    ("file,labels\nimages/00000.png,3/4\n", "line 2: label '3/4' holds a comma, a slash"),
    ("file,labels\nimages/00000.png,1\nimages/00000.png,2\n", "line 3: 'images/00000.png' is listed again"),
])
def test_a_bad_labels_file_stops_train_with_one_line_naming_the_row_and_no_run(mosaics, tmp_path, text, said):
    root, labels, _ = mosaics
    bad = labels.parent / "bad.csv"
    bad.write_text(text)
    done = run_here("train", mosaic_config(tmp_path, labels, labels=str(bad)), "--runs-dir", tmp_path / "runs")
    assert done.returncode == 2 and said.format(labels=bad, root=labels.parent) in done.stderr, done.stderr
    assert "Traceback" not in done.stderr and len(done.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "runs").exists() or not any((tmp_path / "runs").iterdir())


@pytest.mark.parametrize("sets, said", [
    (["loss.name=cross_entropy"], "loss.name: a multi-label run (data.labels) trains with bce or asl, not "
                                  "cross_entropy"),
    (["loss.name=asl", "loss.class_weights=auto"], "asl weighs positives and negatives itself"),
    (["data.sampler=balanced"], "data.sampler: balanced draws by class"),
    (["train.early_stop.metric=val_acc"], "train.early_stop.metric: a multi-label run watches val_map or val_loss"),
    (["data.labels=null"], "loss.name: bce is a multi-label loss; set data.labels"),
])
def test_keys_of_one_label_per_image_are_refused_in_a_multi_label_run_and_back(mosaics, tmp_path, sets, said):
    root, labels, _ = mosaics
    args = [a for s in sets for a in ("--set", s)]
    done = run_here("train", mosaic_config(tmp_path, labels), "--runs-dir", tmp_path / "runs", *args)
    assert done.returncode == 2 and said in done.stderr, done.stderr
    assert "Traceback" not in done.stderr
