"""Evaluation: metrics against hand-computed values, per-image predictions that match the exported model, the test
set at the end of a run, the best epoch's validation predictions, and folders that do not fit."""

import csv
import json
import math
import os
import shutil

import pytest
import torch
from helpers import train_here, write_config

from trainer import cli
from trainer.core.events import read_events
from trainer.deploy.evaluation import Predictions, classification_metrics, write_evaluation


def test_metrics_match_hand_computed_values(tmp_path):
    classes = ["a", "b", "c"]
    # true:      a  a  a  b  b  c
    # predicted: a  a  b  b  c  c   (logits put the predicted class first, with these confidences)
    labels = torch.tensor([0, 0, 0, 1, 1, 2])
    predicted = [0, 0, 1, 1, 2, 2]
    confidence = [0.9, 0.6, 0.8, 0.7, 0.55, 0.95]
    logits = torch.full((6, 3), -10.0)
    for i, (p, c) in enumerate(zip(predicted, confidence)):
        others = (1 - c) / 2
        logits[i] = torch.log(torch.tensor([others] * 3))
        logits[i, p] = math.log(c)
    m = classification_metrics(logits, labels, classes)
    assert m["accuracy"] == pytest.approx(4 / 6)
    assert m["confusion"] == [[2, 1, 0], [0, 1, 1], [0, 0, 1]]
    assert m["per_class"]["a"] == pytest.approx({"precision": 1.0, "recall": 2 / 3, "f1": 0.8, "support": 3})
    assert m["per_class"]["b"] == pytest.approx({"precision": 0.5, "recall": 0.5, "f1": 0.5, "support": 2})
    assert m["per_class"]["c"] == pytest.approx({"precision": 0.5, "recall": 1.0, "f1": 2 / 3, "support": 1})
    expected_loss = -sum(math.log(c if p == t else (1 - c) / 2) for p, t, c in zip(predicted, labels.tolist(),
                                                                                   confidence)) / 6
    assert m["loss"] == pytest.approx(expected_loss, rel=1e-5)
    # ECE over 15 equal bins: each prediction alone in its bin except none share; |correct - confidence| averaged
    correct = [p == t for p, t in zip(predicted, labels.tolist())]
    assert m["ece"] == pytest.approx(sum(abs(float(ok) - c) for ok, c in zip(correct, confidence)) / 6, rel=1e-5)
    assert sum(b["count"] for b in m["reliability"]) == 6 and "top5_accuracy" not in m


def test_a_class_never_predicted_or_never_present_is_null_not_zero():
    m = classification_metrics(torch.tensor([[5.0, 0, 0], [5.0, 0, 0]]), torch.tensor([0, 1]), ["a", "b", "c"])
    assert m["per_class"]["b"]["precision"] is None and m["per_class"]["b"]["recall"] == 0.0
    assert m["per_class"]["c"] == {"precision": None, "recall": None, "f1": None, "support": 0}


def test_metrics_and_predictions_agree_when_logits_tie(tmp_path):
    """bf16 rounds close logits to equal ones: metrics.json and predictions.csv give each image one prediction."""
    classes = [f"c{i}" for i in range(6)]
    gen = torch.Generator().manual_seed(0)
    logits = torch.randn(300, 6, generator=gen).bfloat16().float()
    tied = torch.arange(0, 300, 2)
    logits[tied, 4] = logits[tied, 1] = logits[tied].max(1).values + 1  # exact ties, the higher index after
    labels = torch.randint(0, 6, (300,), generator=gen)
    labels[tied[::2]], labels[tied[1::2]] = 1, 4  # half the tied images are right one way, half the other
    metrics = write_evaluation(tmp_path, "t", Predictions([f"{i}.png" for i in range(300)], labels, logits), classes)
    rows = list(csv.DictReader(open(tmp_path / "eval" / "t" / "predictions.csv")))
    right = sum(r["true"] == r["predicted"] for r in rows)
    assert json.loads((tmp_path / "eval" / "t" / "metrics.json").read_text())["accuracy"] == right / 300
    assert metrics["confusion"] == [[sum(r["true"] == t and r["predicted"] == p for r in rows) for p in classes]
                                    for t in classes]
    assert all(r["predicted"] == "c1" and r["top_k"].startswith("c1:") for r in rows[::2]), "a tie: the lower class"


def test_predictions_csv_rows(tmp_path):
    preds = Predictions(["x.png", "y.png"], torch.tensor([1, 0]), torch.tensor([[0.0, 2.0, 1.0], [3.0, 0.0, 0.0]]))
    write_evaluation(tmp_path, "val", preds, ["a", "b", "c"])
    rows = list(csv.DictReader(open(tmp_path / "eval" / "val" / "predictions.csv")))
    assert [r["predicted"] for r in rows] == ["b", "a"] and rows[0]["true"] == "b"
    assert rows[0]["top_k"].startswith("b:0.66") and len(rows[0]["top_k"].split(";")) == 3
    assert json.loads((tmp_path / "eval" / "val" / "metrics.json").read_text())["accuracy"] == 1.0


@pytest.fixture(scope="module")
def run_with_test_set(tmp_path_factory, shapes_dir):
    tmp = tmp_path_factory.mktemp("evaluated")
    test = tmp / "test"
    shutil.copytree(shapes_dir, test)
    (test / "circle" / "broken.png").write_bytes(b"not a png")
    cfg = write_config(tmp, shapes_dir, data={"test_dir": str(test)}, train={"epochs": 2})
    run, code = train_here(cfg, tmp / "runs")
    assert code == 0, run.tail_log()
    return run, test


def test_the_test_set_is_evaluated_at_the_end_with_best_pt(run_with_test_set):
    run, test = run_with_test_set
    events = read_events(run.events)
    tested = next(e for e in events if e["event"] == "test")
    assert [e["event"] for e in events[-2:]] == ["test", "run_end"]
    metrics = json.loads((run.path / "eval" / "test" / "metrics.json").read_text())
    assert tested["accuracy"] == metrics["accuracy"] and metrics["images"] == 120
    assert metrics["skipped"] == [{"path": str(test / "circle" / "broken.png"), "reason": "not an image "
                                   "(unrecognised format)"}]
    assert metrics["checkpoint"].endswith("best.pt")


def test_predictions_agree_with_the_exported_model(run_with_test_set, tmp_path):
    from trainer.deploy.export import export_run, predict

    run, _ = run_with_test_set
    rows = list(csv.DictReader(open(run.path / "eval" / "test" / "predictions.csv")))
    model = export_run(run, "onnx", tmp_path / "model.onnx")
    fresh = predict(model, [__import__("pathlib").Path(r["path"]) for r in rows[:40]])
    for row, r in zip(rows, fresh):
        assert row["path"] == r.path and row["predicted"] == r.label
        assert float(row["confidence"]) == pytest.approx(r.probability, abs=1e-3)


def test_the_best_epoch_s_validation_predictions_are_kept(run_with_test_set):
    run, _ = run_with_test_set
    events = read_events(run.events)
    best = max((e for e in events if e["event"] == "epoch"), key=lambda e: e["val_acc"])
    metrics = json.loads((run.path / "eval" / "val" / "metrics.json").read_text())
    rows = list(csv.DictReader(open(run.path / "eval" / "val" / "predictions.csv")))
    start = next(e for e in events if e["event"] == "run_start")
    assert len(rows) == start["val_size"] and metrics["epoch"] == best["epoch"]
    assert metrics["accuracy"] == pytest.approx(best["val_acc"], abs=1e-6)
    assert metrics["confusion"] == best["confusion"]


def test_evaluate_any_folder_and_refuse_other_classes(run_with_test_set, shapes_dir, tmp_path, capsys):
    run, _ = run_with_test_set
    assert cli.main(["evaluate", str(run.path), "--data", str(shapes_dir), "--checkpoint", "last"]) == 0
    out = capsys.readouterr().out
    assert "120 images: accuracy" in out and (run.path / "eval" / shapes_dir.name / "predictions.csv").exists()
    other = tmp_path / "other"
    shutil.copytree(shapes_dir, other)
    shutil.rmtree(other / "cross")
    (other / "star").mkdir()
    shutil.copy(next(shapes_dir.glob("circle/*.png")), other / "star" / "s.png")
    assert cli.main(["evaluate", str(run.path), "--data", str(other)]) == 2
    err = capsys.readouterr().err
    assert "its classes differ from the run's (extra: star; missing: cross)" in err and "Traceback" not in err


def test_predict_a_folder_with_a_run_names_the_unreadable_file_and_shows_the_rest(run_with_test_set, tmp_path,
                                                                                    capsys):
    from trainer.deploy.export import export_run, predict

    run, test = run_with_test_set
    notes = tmp_path / "notes.txt"
    notes.write_text("not an image")
    code = cli.main(["predict", str(run.path), str(test / "circle"), str(notes), "--top", "3", "--json"])
    out, err = capsys.readouterr()
    results = json.loads(out)
    assert code == 2 and f"{test / 'circle' / 'broken.png'}: cannot read image" in err and f"{notes}: cannot" in err
    readable = [r for r in results if not r["error"]]
    assert len(readable) == 30 and len(results) == 32 and all(len(r["top"]) == 3 for r in readable)
    exported = export_run(run, "onnx", tmp_path / "model.onnx")
    same = predict(exported, [__import__("pathlib").Path(r["path"]) for r in readable])
    assert [r["top"][0][0] for r in readable] == [r.label for r in same]


def test_the_trainer_s_validation_predictions_equal_evaluate_on_the_same_checkpoint(shapes_dir, tmp_path, capsys):
    """One inference path: eval/val written by the trainer at its best epoch, and `main.py evaluate RUN --data VAL`
    with best.pt, give the same top-1 for every file and the same confidences, at the run's own precision and
    memory format (bf16 and channels_last where this CPU runs them natively)."""
    holdout = tmp_path / "holdout"
    for folder in sorted(shapes_dir.iterdir()):
        (holdout / folder.name).mkdir(parents=True)
        for image in sorted(folder.glob("*.png"))[:12]:
            shutil.copy(image, holdout / folder.name / image.name)
    cfg = write_config(tmp_path, shapes_dir, data={"val_dir": str(holdout)}, train={"epochs": 2, "amp": "auto"})
    run, code = train_here(cfg, tmp_path / "runs")
    assert code == 0, run.tail_log()
    start = next(e for e in read_events(run.events) if e["event"] == "run_start")
    assert cli.main(["evaluate", str(run.path), "--data", str(holdout)]) == 0
    capsys.readouterr()
    trainer_rows = {r["path"]: r for r in csv.DictReader(open(run.path / "eval" / "val" / "predictions.csv"))}
    evaluated = list(csv.DictReader(open(run.path / "eval" / "holdout" / "predictions.csv")))
    assert len(evaluated) == len(trainer_rows) == 48, start
    for row in evaluated:
        mine = trainer_rows[row["path"]]
        assert row["predicted"] == mine["predicted"], row["path"]
        assert float(row["confidence"]) == pytest.approx(float(mine["confidence"]), abs=1e-4), (row, start["precision"])


def test_formula_like_names_are_neutralised_in_the_csv_and_no_evaluation_replaces_another(shapes_dir, tmp_path,
                                                                                          capsys):
    """Issue #27. A folder `=cmd` with classes `+SUM(A1)`, `-2+3`, `@A1`: no cell of predictions.csv starts a
    formula (read back with the csv module), metrics.json and the app read the true names; `evaluate --data
    OTHER/val` writes eval/OTHER-val and leaves the trainer's eval/val byte for byte."""
    from app.state.eval_results import read_evaluation

    hostile = {"circle": "+SUM(A1)", "cross": "-2+3", "square": "@A1", "triangle": "plain"}
    root, val = tmp_path / "=cmd", tmp_path / "OTHER" / "val"
    for source, name in hostile.items():
        images = sorted((shapes_dir / source).glob("*.png"))
        for folder, chosen in ((root / name, images[:20]), (val / name, images[20:])):
            folder.mkdir(parents=True)
            for i, image in enumerate(chosen):
                shutil.copy(image, folder / (f"=HYPERLINK({i}).png" if i % 2 else image.name))
    cfg = write_config(tmp_path, root, data={"val_dir": str(val)}, train={"epochs": 1})
    run, code = train_here(cfg, tmp_path / "runs")
    assert code == 0, run.tail_log()
    trainer_val = run.path / "eval" / "val"
    with open(trainer_val / "predictions.csv", newline="", encoding="utf-8") as f:
        cells = [cell for row in csv.reader(f) for cell in row]
    assert any(c.startswith("'+SUM(A1)") for c in cells) and any("=HYPERLINK(" in c for c in cells)
    assert not [c for c in cells if c.startswith(("=", "+", "-", "@", "\t", "\r"))], "a cell would run"
    metrics = json.loads((trainer_val / "metrics.json").read_text())
    assert metrics["classes"] == sorted(hostile.values())
    shown = read_evaluation(run.path, "val")
    assert {p.true for p in shown.predictions} == set(hostile.values())
    assert all(p.path.startswith(str(val)) and os.path.exists(p.path) for p in shown.predictions)

    before = {p.name: p.read_bytes() for p in trainer_val.iterdir()}
    assert cli.main(["evaluate", str(run.path), "--data", str(val)]) == 0
    assert "OTHER-val" in capsys.readouterr().out
    assert {p.name: p.read_bytes() for p in trainer_val.iterdir()} == before, "eval/val untouched"
    assert (run.path / "eval" / "OTHER-val" / "predictions.csv").exists()
    assert cli.main(["evaluate", str(run.path), "--data", str(val)]) == 2, "the same folder again"
    assert "pass --overwrite" in capsys.readouterr().err
    assert cli.main(["evaluate", str(run.path), "--data", str(val), "--overwrite"]) == 0
    assert cli.main(["evaluate", str(run.path), "--data", str(val), "--name", "val"]) == 2
    assert "--name: val is reserved" in capsys.readouterr().err
