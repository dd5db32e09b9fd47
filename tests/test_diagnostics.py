"""Gradient statistics against a reference, divergence, what disabled statistics cost, histograms, lr-find."""

import math

import pytest
import torch
from helpers import poisoned_model, run_here, train_here, write_config

from trainer.core.config import ModelConfig
from trainer.core.events import read_events
from trainer.core.rundir import RunDir
from trainer.data.demo_data import write_demo_dataset
from trainer.model.models import create_model
from trainer.train.stats import LAYER_STATS, AnomalyWatch, GradMonitor, global_norm, histogram


def test_layer_stats_match_a_reference_computation():
    torch.manual_seed(0)
    model = create_model(ModelConfig(name="resnet18"), 5)
    model.fc.weight.requires_grad_(True)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    x, y = torch.randn(4, 3, 32, 32), torch.tensor([0, 1, 2, 3])
    torch.nn.functional.cross_entropy(model(x), y).backward()
    monitor = GradMonitor(model)
    norms = monitor.grad_norms()
    zero = monitor.zero_fractions()
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    ref_grad = {n: p.grad.norm().item() for n, p in model.named_parameters()}
    ref_zero = {n: (p.grad == 0).float().mean().item() for n, p in model.named_parameters()}
    monitor.snapshot_weights()
    opt.step()
    stats = dict(zip(LAYER_STATS, monitor.layer_table(norms, zero).tolist()))
    for i, (name, p) in enumerate(model.named_parameters()):
        assert stats["grad_norm"][i] == pytest.approx(ref_grad[name], rel=1e-5, abs=1e-7)
        assert stats["weight_norm"][i] == pytest.approx(p.norm().item(), rel=1e-5)
        ratio = (p.detach() - before[name]).norm().item() / p.norm().item()
        assert stats["update_ratio"][i] == pytest.approx(ratio, rel=1e-4, abs=1e-9)
        assert stats["zero_frac"][i] == pytest.approx(ref_zero[name], abs=1e-6)
    total = torch.nn.utils.get_total_norm([p.grad for p in model.parameters()]).item()
    assert global_norm(norms).item() == pytest.approx(total, rel=1e-5)


def test_injected_nan_stops_the_run_naming_the_layer(shapes_dir, tmp_path):
    model = poisoned_model(tmp_path, "nan", (4,))
    cfg = write_config(tmp_path, shapes_dir, model={"name": model}, monitor={"log_every": 1})
    result = run_here("train", cfg, "--run-dir", tmp_path / "run")
    assert result.returncode == 3
    status = RunDir(tmp_path / "run").read_status()
    assert status["state"] == "diverged"
    assert "step 4" in status["message"] and "first non-finite gradient in head.weight" in status["message"]
    events = read_events(tmp_path / "run" / "events.jsonl")
    assert events[-2]["event"] == "error" and events[-2]["kind"] == "diverged"
    assert events[-1] == {**events[-1], "event": "run_end", "status": "diverged"}
    # without gradient statistics the loss still gives it away, one step later, without a layer name
    result = run_here("train", cfg, "--run-dir", tmp_path / "run2", "--set", "monitor.grad_stats=false")
    assert result.returncode == 3 and "step 5" in RunDir(tmp_path / "run2").read_status()["message"]


def test_skip_mode_skips_the_bad_step_and_finishes(shapes_dir, tmp_path):
    model = poisoned_model(tmp_path, "nan", (4,))
    cfg = write_config(tmp_path, shapes_dir, model={"name": model},
                       train={"on_nonfinite": "skip", "epochs": 1}, monitor={"log_every": 1})
    run, code = train_here(cfg, tmp_path / "runs")
    assert code == 0
    skipped = [e for e in read_events(run.events) if e["event"] == "warning" and e["kind"] == "nonfinite_skipped"]
    assert len(skipped) == 1 and skipped[0]["layer"] == "head.weight" and skipped[0]["step"] == 4
    from trainer.model.checkpoint import load_weights_only

    assert all(torch.isfinite(v).all() for v in load_weights_only(run.checkpoints / "last.pt")["model"].values())


def count_foreach_norm(monkeypatch) -> list:
    calls = []
    real = torch._foreach_norm

    def counting(*args, **kwargs):
        calls.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(torch, "_foreach_norm", counting)
    return calls


def test_disabled_statistics_do_no_work(shapes_dir, tmp_path, monkeypatch):
    calls = count_foreach_norm(monkeypatch)
    off = write_config(tmp_path, shapes_dir, train={"epochs": 1}, monitor={"grad_stats": False, "log_every": 1})
    run, code = train_here(off, tmp_path / "off")
    assert code == 0 and calls == []
    assert not [e for e in read_events(run.events) if e["event"] in ("grad_stats", "histogram")]
    assert all(e["grad_norm"] is None for e in read_events(run.events) if e["event"] == "step")
    on = write_config(tmp_path, shapes_dir, train={"epochs": 1}, monitor={"grad_stats": True, "log_every": 3})
    run, code = train_here(on, tmp_path / "on")
    steps = [e for e in read_events(run.events) if e["event"] == "step"]
    assert code == 0 and len(calls) >= len(steps) > 0


def test_histograms_of_chosen_layers(shapes_dir, tmp_path):
    cfg = write_config(tmp_path, shapes_dir, train={"epochs": 1},
                       monitor={"histogram_every": 2, "histogram_layers": ["fc"], "histogram_bins": 16})
    run, code = train_here(cfg, tmp_path / "runs")
    assert code == 0
    hists = [e for e in read_events(run.events) if e["event"] == "histogram"]
    assert {(e["layer"], e["kind"]) for e in hists} == {("fc.weight", "weight"), ("fc.weight", "grad"),
                                                        ("fc.bias", "weight"), ("fc.bias", "grad")}
    weight = next(e for e in hists if e["layer"] == "fc.weight" and e["kind"] == "weight")
    assert len(weight["counts"]) == 16 and sum(weight["counts"]) == 4 * 128 and weight["min"] < weight["max"]
    assert histogram(torch.tensor([0.0, 1.0, 1.0, 3.0]), 3) == {"min": 0.0, "max": 3.0, "counts": [1, 2, 1]}


def test_anomaly_watch_warns_on_spikes_and_gradient_extremes():
    watch = AnomalyWatch(spike_factor=3, explode=100, vanish=1e-6)
    assert watch.check(1, 1.0, 1.0) == [] and watch.check(2, 1.1, 2.0) == []
    kinds = [w["kind"] for w in watch.check(3, 10.0, 500.0)]
    assert kinds == ["loss_spike", "exploding_gradients"]
    assert [w["kind"] for w in watch.check(4, 1.0, 1e-9)] == ["vanishing_gradients"]


def test_lr_finder_smoothing_starts_at_the_losses_not_above_them():
    from trainer.train.lr_find import SmoothedLoss

    smoother = SmoothedLoss()
    flat = [smoother.add(2.37) for _ in range(20)]
    assert flat == pytest.approx([2.37] * 20), "a flat loss draws a flat curve (it began at 23.7, 12.5, 8.8 ...)"
    smoother = SmoothedLoss(beta=0.5)
    assert [smoother.add(x) for x in (4.0, 2.0)] == pytest.approx([4.0, (0.25 * 4 + 0.5 * 2) / 0.75])


def test_lr_finder_suggests_nothing_when_the_range_holds_no_minimum_and_says_which_way_to_extend_it():
    """The curve of SGD with momentum on a CPU with bf16 (issue #66): flat, then falling to the end of the range, the
    lowest loss at 10. Any value suggested from it is a guess (a tenth of the lowest trained a 32% run): issue #69
    asks for none, the reason, and a wider range; a curve that never falls asks for lower rates."""
    from trainer.train.lr_find import _result

    lrs = [1e-6 * (1e7) ** (i / 199) for i in range(200)]
    losses = [1.4 if lr < 1e-3 else 1.4 - 0.2 * math.log10(lr / 1e-3) for lr in lrs]  # falls from 1e-3 to 10
    found = _result(lrs, losses, losses, 1e-6, 10)
    assert found["min_loss_lr"] == pytest.approx(10), "the lowest loss at the end of the range"
    assert found["suggested_lr"] is None and "still falling at 10" in found["why"], found["why"]
    assert found["extend"] == pytest.approx([1e-6, 1000])
    rising = [1.0 + 0.5 * i / 199 for i in range(200)]
    found = _result(lrs, rising, rising, 1e-6, 10)
    assert found["suggested_lr"] is None and "rose from the range's start" in found["why"]
    assert found["extend"] == pytest.approx([1e-8, 10])
    flat = [1.0 + 0.001 * math.sin(i) for i in range(200)]
    found = _result(lrs, flat, flat, 1e-6, 10)
    assert found["suggested_lr"] is None and "hardly moved" in found["why"]
    assert found["extend"] == pytest.approx([1e-6, 1000])


def analysed_sweep(decades: float) -> dict:
    """The finder's analysis of a curve as sweeps draw it (1e-6 up, the sweep stopped past the blow-up): flat, a
    straight fall over `decades` to its lowest point at 0.1, then a blow-up."""
    from trainer.train.lr_find import _result

    lrs = [lr for lr in (1e-6 * (1e7) ** (i / 199) for i in range(200)) if lr < 0.5]

    def loss(lr):
        x = math.log10(lr)
        return 2.3 if x < -1 - decades else 2.3 - 1.8 * (x + 1 + decades) / decades if x < -1 else 0.5 + 6 * (x + 1) ** 2

    curve = [loss(lr) for lr in lrs]
    found = _result(lrs, curve, curve, 1e-6, 10, diverged=True)
    assert found["min_loss_lr"] == pytest.approx(0.1, rel=0.1)
    return found


def test_lr_finder_suggests_a_rate_near_a_clear_minimum_inside_the_range():
    """A descent over a decade and a half to the lowest point at 0.1: a rate is suggested, inside the descent, below
    the minimum by less than a factor of 10. (Not within 3x of it: in bench/lr_finder.py a third of the lowest loss's
    rate trained small_cnn with SGD to 32.5%, half-way along the descent to 95.0%.)"""
    found = analysed_sweep(1.5)
    assert found["suggested_lr"] is not None and 10 ** -2.5 < found["suggested_lr"] < 0.1, found["suggested_lr"]
    assert found["suggested_lr"] > found["min_loss_lr"] / 10
    assert found["extend"] is None and "lowest loss at" in found["why"]


def test_lr_finder_suggests_within_a_factor_of_3_of_a_sharp_minimum():
    """Issue #69: a clear minimum, a fall over half a decade to the lowest point at 0.1: the suggestion is within a
    factor of 3 of the minimum, below it (over a long descent, the test above, it stays half-way along it)."""
    found = analysed_sweep(0.5)
    assert found["min_loss_lr"] / 3 <= found["suggested_lr"] < found["min_loss_lr"], found["suggested_lr"]


@pytest.mark.slow  # an LR sweep, then a run at the rate it suggests
def test_lr_finder_suggestion_trains_well(tmp_path):
    data = write_demo_dataset(tmp_path / "demo", per_class=150, size=32, seed=5)
    cfg = write_config(tmp_path, data, data={"image_size": 24, "batch_size": 32}, train={"epochs": 8},
                       optimizer={"lr": 1e-5})
    result = run_here("lr-find", cfg, "--write")
    if "try --start" in result.stdout:  # no minimum inside the range (bf16 on some CPUs): the wider range it offers
        assert result.returncode == 2 and "nothing written" in result.stderr, result.stderr
        start, end = result.stdout.split("try --start ")[1].split(" --end ")
        result = run_here("lr-find", cfg, "--write", "--start", start, "--end", end.split()[0])
    assert result.returncode == 0, result.stderr
    suggested = float(result.stdout.split("suggested optimizer.lr: ")[1].split()[0])
    assert 1e-3 < suggested < 5
    result = run_here("train", cfg, "--run-dir", tmp_path / "run", timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    status = RunDir(tmp_path / "run").read_status()
    assert math.isclose(float(__import__("yaml").safe_load(cfg.read_text())["optimizer"]["lr"]), suggested)
    assert status["best_acc"] >= 0.85
