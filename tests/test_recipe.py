"""The recipe ingredients (issue #24): what each one changes, and that a run resumed with it ends exactly where an
uninterrupted one does."""

import json
import shutil
import time

import pytest
import torch
from helpers import run_here, write_config

from trainer.core.rundir import RunDir
from trainer.model.checkpoint import load_weights_only, numbered_checkpoints
from trainer.model.ema import WeightAverage, warmed_decay


def test_the_average_moves_towards_the_weights_by_one_minus_the_warmed_decay():
    net = torch.nn.Sequential(torch.nn.Linear(3, 2), torch.nn.BatchNorm1d(2))
    average = WeightAverage(net, decay=0.99)
    start = {k: v.clone() for k, v in net.state_dict().items()}
    with torch.no_grad():
        for p in net.parameters():
            p.add_(1.0)
    net[1].running_mean.add_(2.0)
    net[1].num_batches_tracked.add_(5)
    average.update(step=1)
    d = warmed_decay(0.99, 1)
    assert d == pytest.approx(2 / 11)  # the warm-up: early steps count for more
    got = average.module.state_dict()
    torch.testing.assert_close(got["0.weight"], start["0.weight"] + (1 - d) * 1.0)
    torch.testing.assert_close(got["1.running_mean"], start["1.running_mean"] + (1 - d) * 2.0)
    assert got["1.num_batches_tracked"] == 5  # integer buffers are copied
    assert warmed_decay(0.99, 10_000) == 0.99
    assert not any(p.requires_grad for p in average.module.parameters())


def test_with_ema_the_averaged_weights_are_validated_checkpointed_and_evaluated(shapes_dir, tmp_path):
    import csv

    from trainer.deploy.inference import load_run_model

    cfg = write_config(tmp_path, shapes_dir, train={"epochs": 2, "ema": 0.9})
    run_dir = tmp_path / "run"
    result = run_here("train", cfg, "--run-dir", run_dir)
    assert result.returncode == 0, result.stderr[-2000:]
    state = load_weights_only(run_dir / "checkpoints" / "best.pt")
    assert set(state["trained_model"]) == set(state["model"])
    assert not torch.equal(state["trained_model"]["fc.weight"], state["model"]["fc.weight"])
    # the best epoch's validation predictions (written by the trainer) are the averaged network's, which is
    # what the checkpoint holds as its model (and so what evaluate, predict and export load)
    rows = list(csv.DictReader((run_dir / "eval" / "val" / "predictions.csv").open()))
    loaded = load_run_model(RunDir(run_dir), "best")
    images = torch.stack([loaded.preprocess.decode(r["path"]) for r in rows])
    averaged = loaded.logits(images).softmax(1).max(1).values
    torch.testing.assert_close(averaged, torch.tensor([float(r["confidence"]) for r in rows]), atol=1e-4, rtol=0)
    loaded.net.load_state_dict(state["trained_model"])
    trained = loaded.logits(images).softmax(1).max(1).values
    assert (trained - averaged).abs().max() > 1e-3


def resume_from_the_middle(straight: RunDir, copy_to) -> RunDir:
    """A copy of a finished run as it was at its first mid-epoch checkpoint of epoch 2, marked stopped: what a
    stopped run looks like, without the race of a signal."""
    shutil.copytree(straight.path, copy_to)
    run = RunDir(copy_to)
    checkpoints = numbered_checkpoints(run.checkpoints)[::-1]  # oldest first
    middle = next(p for p in checkpoints if load_weights_only(p)["epoch"] == 1 and load_weights_only(p)["batch_in_epoch"])
    for p in checkpoints[checkpoints.index(middle) + 1:]:
        p.unlink()
    for name in ("last.pt", "best.pt"):
        (run.checkpoints / name).unlink(missing_ok=True)
    shutil.copy(middle, run.checkpoints / "last.pt")
    run.write_status(state="stopped", message="")
    return run


INGREDIENTS = {
    "ema": {"train": {"ema": 0.8}},
    "norm_weight_decay": {"optimizer": {"norm_weight_decay": 0.0, "weight_decay": 0.01}},
    "label_smoothing": {"loss": {"label_smoothing": 0.1}},
    "onecycle": {"scheduler": {"name": "onecycle"}},
    "progressive_resize": {"train": {"epochs": 3, "progressive_resize": 0.5}, "data": {"image_size": 32}},
    "augment_policies": {"data": {"augment": {"policy": "trivial_augment", "random_erasing": 0.5, "mixup": 0.2,
                                               "cutmix": 1.0}}},
}


@pytest.mark.parametrize("ingredient", INGREDIENTS)
def test_a_run_resumed_with_each_ingredient_ends_as_an_uninterrupted_one(shapes_dir, tmp_path, ingredient):
    sections = {"train": {"epochs": 2, "seed": 3}, "checkpoint": {"every_steps": 2, "keep_last": 50},
                "data": {"batch_size": 12},  # resumed in the middle of the second epoch
                "device": {"share_cpu": False}}  # a thread count fitted to a busy machine changes the float sums
    for section, values in INGREDIENTS[ingredient].items():
        sections.setdefault(section, {}).update(values)
    cfg = write_config(tmp_path, shapes_dir, **sections)
    assert run_here("train", cfg, "--run-dir", tmp_path / "straight").returncode == 0
    straight = RunDir(tmp_path / "straight")
    resumed = resume_from_the_middle(straight, tmp_path / "resumed")
    result = run_here("resume", resumed.path)
    assert result.returncode == 0, result.stderr[-2000:]
    a = load_weights_only(straight.checkpoints / "last.pt")
    b = load_weights_only(resumed.checkpoints / "last.pt")
    assert a["step"] == b["step"]
    for part in ("model", "trained_model"):
        for key, value in a.get(part, {}).items():
            torch.testing.assert_close(b[part][key], value, rtol=1e-5, atol=1e-6, msg=f"{part} {key}")


def test_with_tta_a_mirrored_image_gets_the_same_prediction_in_validation_the_checkpoint_and_onnx(shapes_dir,
                                                                                                 tmp_path):
    import csv

    from trainer.deploy.inference import flip_average, load_model, load_run_model

    cfg = write_config(tmp_path, shapes_dir, train={"epochs": 1}, eval={"tta": True})
    run_dir = tmp_path / "run"
    assert run_here("train", cfg, "--run-dir", run_dir).returncode == 0
    loaded = load_run_model(RunDir(run_dir), "best")
    assert loaded.preprocess.tta
    rows = list(csv.DictReader((run_dir / "eval" / "val" / "predictions.csv").open()))
    images = torch.stack([loaded.preprocess.decode(r["path"]) for r in rows])
    with_tta = loaded.logits(images)
    torch.testing.assert_close(loaded.logits(images.flip(3)), with_tta, atol=1e-3, rtol=1e-3)
    torch.testing.assert_close(with_tta.softmax(1).max(1).values,
                               torch.tensor([float(r["confidence"]) for r in rows]), atol=1e-4, rtol=0)
    with torch.no_grad():
        plain = loaded.net(loaded.preprocess.to_input(images))
    assert (plain - with_tta).abs().max() > 1e-2, "the flip average is not the plain network"

    out = tmp_path / "model.onnx"
    assert run_here("export", run_dir, "--format", "onnx", "--out", out).returncode == 0
    assert json.loads(out.with_name("model.onnx.json").read_text())["tta"] == "graph"
    exported = load_model(out)
    assert not exported.preprocess.tta  # the graph averages; the caller does nothing more
    with torch.no_grad():  # an export runs in fp32 (the run may have validated in bf16)
        fp32 = flip_average(loaded.net, loaded.preprocess.to_input(images))
    torch.testing.assert_close(exported.logits(images), fp32, atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(exported.logits(images.flip(3)), fp32, atol=1e-4, rtol=1e-4)


def test_label_smoothing_gives_a_confident_right_answer_a_loss_above_zero():
    from trainer.core.config import LossConfig
    from trainer.train.optim import build_loss

    logits, labels = torch.tensor([[20.0, 0.0, 0.0]]), torch.tensor([0])
    assert build_loss(LossConfig(), 3)(logits, labels).item() < 1e-6
    smoothed = build_loss(LossConfig(label_smoothing=0.3), 3)(logits, labels).item()
    # 0.3 of the target spread over the 3 classes: the two wrong ones get 0.1 each, at about -20 log-probability
    assert smoothed == pytest.approx(0.1 * 20 * 2, rel=0.01)


def test_the_one_cycle_schedule_warms_up_over_30_percent_then_anneals_to_a_thousandth():
    from trainer.core.config import SchedulerConfig
    from trainer.core.schedule import lr_factor

    cfg = SchedulerConfig(name="onecycle")
    factors = [lr_factor(step, 10, 1000, cfg) for step in range(1000)]
    peak = max(range(1000), key=factors.__getitem__)
    assert 295 <= peak <= 300 and factors[peak] == pytest.approx(1.0, abs=0.01)
    assert factors[0] < 0.01 and factors[-1] == pytest.approx(1e-3, abs=1e-4)
    assert all(a <= b for a, b in zip(factors[:peak], factors[1:peak + 1]))
    assert all(a >= b for a, b in zip(factors[peak:], factors[peak + 1:]))


def test_progressive_resizing_trains_small_then_full_size_and_validates_at_full_size(shapes_dir, tmp_path):
    from trainer.core.events import read_events
    from trainer.core.schedule import progressive_size

    assert [progressive_size(224, 0.5, e, 8) for e in range(8)] == [112, 128, 144, 168, 184, 200, 224, 224]
    assert [progressive_size(224, 0.0, e, 8) for e in range(8)] == [224] * 8
    cfg = write_config(tmp_path, shapes_dir, train={"epochs": 3, "progressive_resize": 0.5}, data={"image_size": 32})
    run_dir = tmp_path / "run"
    assert run_here("train", cfg, "--run-dir", run_dir).returncode == 0
    epochs = [e for e in read_events(run_dir / "events.jsonl") if e["event"] == "epoch"]
    assert [e["image_size"] for e in epochs] == [16, 24, 32]
    assert load_weights_only(run_dir / "checkpoints" / "last.pt")["preprocess"]["image_size"] == 32


def test_a_re_planned_schedule_follows_the_share_of_the_run_and_anneals_at_the_new_end(monkeypatch):
    """train.replan moves a run's end: the schedule goes on from the share of the new plan done and reaches its floor
    there. A run planned for 1 epoch, annealed in it, and re-planned to 10 rises again to the peak (it stayed at the
    floor for the other 9); with a deadline (one process) the rate is the budget's share spent, whatever the plan."""
    from trainer.core import clock
    from trainer.core.config import SchedulerConfig
    from trainer.core.schedule import Stretch, lr_factor

    cfg = SchedulerConfig(name="onecycle")
    total = 10  # 1 epoch of 10 steps, as first planned
    stretch = Stretch(total)
    factor = lambda step: lr_factor(stretch.virtual(step), 10, total, cfg)  # noqa: E731
    assert [stretch.virtual(s) for s in (0, 3, 9)] == [0, 3, 9], "untouched until a re-plan"
    floor = lr_factor(total, 10, total, cfg)
    assert factor(10) == pytest.approx(floor), "annealed at the end of the plan"
    stretch.restretch(10, 100)  # faster than planned: 10 epochs in all
    assert factor(10) == pytest.approx(lr_factor(1, 10, total, cfg)), "from 10% of the new plan"
    assert max(factor(s) for s in range(10, 100)) == pytest.approx(1.0, abs=0.02), "up to the peak again"
    assert factor(100) == pytest.approx(floor), "annealed at the new end"
    stretch.restretch(60, 70)  # then slower: the end comes sooner
    assert factor(70) == pytest.approx(floor)
    assert all(factor(s) >= factor(s + 1) - 1e-12 for s in range(60, 70)), "from there on, only decaying"

    now = time.time()
    monkeypatch.setattr(clock, "now", lambda: now)  # the trainer's clock stands at `now`: no second passes here
    budget = Stretch(10, deadline=(now - 30, now + 70))  # 30 s of a 100 s training budget spent
    assert budget.virtual(5) == pytest.approx(3.0, abs=0.05), "the share of the budget, not of the steps"
    budget.restretch(5, 1000)
    assert budget.virtual(5) == pytest.approx(3.0, abs=0.05), "a re-plan does not move it"
    budget.deadline = (now - 100, now)
    assert lr_factor(budget.virtual(999), 10, 10, cfg) == pytest.approx(floor), "annealed when the budget is spent"
    early = Stretch(500, deadline=(now - 10, now + 90))  # the plan's last epoch starts at 10% of the budget
    early.finish_by(400, 500)
    assert early.virtual(400) == pytest.approx(50, abs=1) and early.virtual(500) == 500, "its end is annealed"
    assert early.virtual(450) == pytest.approx(275, abs=2), "linearly from where the budget's clock was"
