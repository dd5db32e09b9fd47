"""Many runs: early stopping on the watched metric, extending a finished run with the documented schedule rule."""

import pytest
from helpers import run_here, train_here, write_config

from trainer.core.config import EarlyStopConfig, SchedulerConfig
from trainer.core.events import read_events
from trainer.core.rundir import RunDir
from trainer.core.schedule import lr_factor
from trainer.model.checkpoint import TrainState
from trainer.train.plan import no_longer_improving


@pytest.mark.parametrize("metric, values, patience, min_delta, share, stops_at", [
    ("val_loss", [1.0, 0.9, 0.95, 0.91, 0.92], 2, 0.0, 0.0, 4),  # no new low after 0.9 for two epochs
    ("val_loss", [1.0, 0.9, 0.87, 0.86, 0.5], 2, 0.05, 0.0, 4),  # 0.03 and 0.04 are below min_delta
    ("val_acc", [0.5, 0.6, 0.6, 0.7, 0.7, 0.7], 2, 0.0, 0.0, 6),  # a tie is not an improvement
    ("val_acc", [0.5, 0.4, 0.3], 0, 0.0, 0.5, None),  # patience 0: off, whatever the share
    ("val_acc", [0.5, 0.6] + [0.6] * 6, 2, 0.0, 0.5, 6),  # half of 8 epochs: waits 4, not 2
])
def test_early_stopping_on_a_scripted_metric(metric, values, patience, min_delta, share, stops_at):
    es = EarlyStopConfig(metric=metric, patience=patience, min_delta=min_delta, share=share)
    st = TrainState()
    stopped = [epoch for epoch, v in enumerate(values, start=1) if no_longer_improving(es, st, {metric: v}, 8)]
    assert (stopped[0] if stopped else None) == stops_at


def test_a_run_re_planned_longer_waits_longer_before_it_stops():
    """Auto's patience was a third of the plan: a probe that read a busy machine slow planned 16 epochs (patience 5),
    the trainer re-planned 49, and early stopping ended it at epoch 15 with 41% of its budget unused. With
    early_stop.share the wait follows the epochs as they stand."""
    es, st = EarlyStopConfig(metric="val_acc", patience=3, share=0.33), TrainState()
    values = [0.5, 0.7] + [0.7] * 20
    stopped = [epoch for epoch, v in enumerate(values, start=1) if no_longer_improving(es, st, {"val_acc": v}, 49)]
    assert stopped and stopped[0] == 2 + 16, "a third of 49 epochs, not of the 16 first planned"


def test_an_early_stopped_run_is_completed_and_can_be_extended_on_the_documented_schedule(tmp_path, shapes_dir):
    cfg = write_config(tmp_path, shapes_dir, train={"epochs": 10, "early_stop": {"metric": "val_acc", "patience": 1,
                                                                                 "min_delta": 2.0}},
                       monitor={"log_every": 1}, scheduler={"name": "cosine"})
    run, code = train_here(cfg, tmp_path / "runs")
    assert code == 0
    end = read_events(run.events)[-1]
    assert end["event"] == "run_end" and end["status"] == "completed"
    assert end["reason"] == "early_stop" and end["early_stop_epoch"] == 2 and end["epochs_completed"] == 2
    status = run.read_status()
    assert status["state"] == "completed" and status["reason"] == "early_stop" and "early stop at epoch 2" in \
        status["message"]

    refused = run_here("resume", run.path, "--epochs", "2")
    assert refused.returncode == 2 and "give a larger total" in refused.stderr
    result = run_here("resume", run.path, "--epochs", "4")
    assert result.returncode == 0, result.stderr
    assert "cosine schedule recomputed for 4 epochs and continued at epoch 3" in result.stdout
    events = read_events(run.events)
    start = next(e for e in events if e["event"] == "run_start")
    spe, base = start["steps_per_epoch"], 0.05
    steps = [e for e in events if e["event"] == "step"]
    first, extension = [e for e in steps if e["step"] <= 2 * spe], [e for e in steps if e["step"] > 2 * spe]
    sched = SchedulerConfig(name="cosine")
    for e in first:  # before: the 10-epoch schedule the run was started with
        assert e["lr"][0] == pytest.approx(base * lr_factor(e["step"], spe, 10 * spe, sched))
    for e in extension:  # after: recomputed for 4 epochs, continued at the current step
        assert e["lr"][0] == pytest.approx(base * lr_factor(e["step"], spe, 4 * spe, sched))
    # the extension had its full patience again (one epoch, the metric still not improving by 2.0): it stopped at 3
    assert extension and extension[-1]["step"] == 3 * spe
    assert events[-1]["reason"] == "early_stop" and events[-1]["early_stop_epoch"] == 3
    assert RunDir(run.path).read_status()["epoch"] == 3


def test_tensorboard_files_are_continuous_across_a_resume(tmp_path, shapes_dir):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    cfg = write_config(tmp_path, shapes_dir, train={"epochs": 2}, monitor={"log_every": 1, "tensorboard": True,
                                                                          "histogram_every": 4,
                                                                          "histogram_layers": ["fc"]},
                       checkpoint={"keep_last": 3})
    run, code = train_here(cfg, tmp_path / "runs")
    assert code == 0
    spe = next(e for e in read_events(run.events) if e["event"] == "run_start")["steps_per_epoch"]
    # as if the process had died after logging epoch 2 but before its checkpoint: only epoch 1's is left
    for p in run.checkpoints.iterdir():
        if "e0002" in p.name or p.name in ("last.pt", "best.pt"):
            p.unlink()
    result = run_here("resume", run.path, "--force")
    assert result.returncode == 0, result.stderr
    acc = EventAccumulator(str(run.path / "tensorboard"), size_guidance={"scalars": 0, "histograms": 0})
    acc.Reload()
    steps = [s.step for s in acc.Scalars("train/loss")]
    assert steps == list(range(1, 2 * spe + 1)), steps  # every step once, epoch 2 from the resumed process
    assert [s.step for s in acc.Scalars("val/acc")] == [spe, 2 * spe]
    assert "train/lr/group0" in acc.Tags()["scalars"] and any(t.startswith("grad/fc") for t in acc.Tags()["histograms"])
    assert acc.PluginTagToContent("hparams")  # the HPARAMS tab has the run's hyper-parameters
    logged = [e for e in read_events(run.events) if e["event"] == "epoch"]
    assert acc.Scalars("val/acc")[-1].value == pytest.approx(logged[-1]["val_acc"])
