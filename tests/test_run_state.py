"""The app's model layer without Qt: RunState folds events into what the views show; CSV from the events."""

import csv
import json
import subprocess
import sys

import pytest
from helpers import REPO

from app.state.csv_export import export_run_csv
from app.state.run_state import RunState
from trainer.core.config import RunConfig
from trainer.core.rundir import RunDir
from trainer.device.devices import auto_precision, device_problems, refusals


def events_for(epochs=2, steps_per_epoch=4, groups=("fc", "default")):
    yield {"event": "prepare", "phase": "cache", "message": "decoding 3/10", "done": 3, "total": 10}
    yield {"event": "run_start", "config": {"train": {"epochs": epochs}}, "classes": ["a", "b"],
           "param_groups": [{"name": g} for g in groups], "layers": ["conv.weight", "fc.weight"]}
    step = 0
    for epoch in range(1, epochs + 1):
        for batch in range(1, steps_per_epoch + 1):
            step += 1
            yield {"event": "step", "step": step, "epoch": epoch, "batch": batch, "batches": steps_per_epoch,
                   "loss": 1.0 / step, "lr": [0.1, 0.01], "images_per_s": 100.0, "grad_norm": None if step == 2 else 2.0,
                   "time": 1000.0 + step}
            yield {"event": "grad_stats", "step": step, "grad_norm": [1.0, 2.0], "weight_norm": [1, 1],
                   "update_ratio": [0, 0], "zero_frac": [0, 0]}
        yield {"event": "epoch", "epoch": epoch, "val_acc": 0.5 + epoch / 10, "train_loss": 0.5, "val_loss": 0.6,
               "confusion": [[1, 0], [0, 1]]}
    yield {"event": "test", "accuracy": 0.9, "images": 10}
    yield {"event": "run_end", "status": "completed", "message": ""}


def test_events_become_buffers_summaries_and_change_kinds(tmp_path):
    state = RunState(RunDir(tmp_path))
    kinds = [state.apply(e, now=float(i)) for i, e in enumerate(events_for())]
    assert kinds[:3] == ["preparing", "runStarted", "stepLogged"] and kinds[3] is None  # grad_stats: no signal
    assert kinds[-2:] == ["tested", "finished"] and state.ended and state.state == "completed"
    assert state.test_event["accuracy"] == 0.9
    assert state.epochs == 2 and state.group_names == ["fc", "default"]
    assert list(state.step_loss.x) == list(range(1, 9)) and state.step_loss.y[-1] == pytest.approx(1 / 8)
    assert len(state.grad_norm) == 7, "a step without a gradient norm leaves no point"
    assert [list(s.y) for s in state.lr] == [[0.1] * 8, [0.01] * 8]
    assert state.layer_grad.rows == 2 and len(state.layer_grad) == 8
    assert state.best_epoch["epoch"] == 2 and list(state.val_score.y) == pytest.approx([0.6, 0.7])


def test_eta_follows_the_pace_since_progress_was_first_seen(tmp_path):
    state = RunState(RunDir(tmp_path))
    events = [e for e in events_for(epochs=4) if e["event"] in ("run_start", "step")]
    for i, e in enumerate(events):
        state.apply(e, now=10.0 * i)  # 10 s per logged step, 4 steps per epoch, 16 steps
    # after step 16 (all done): 0 s left; after step 8 the estimate was 80 s
    assert state.eta_s == pytest.approx(0.0)
    state = RunState(RunDir(tmp_path))
    for i, e in enumerate(events[:9]):
        state.apply(e, now=10.0 * i)
    assert state.eta_s == pytest.approx(80.0)


def test_a_trainer_gone_without_a_word_is_noticed(tmp_path):
    run = RunDir(tmp_path).create()
    run.write_status(state="running", pid=2**22 + 12345)  # no such process
    state = RunState(run)
    assert state.check_process() and state.state == "failed" and "gone" in state.message
    assert not state.check_process(), "reported once"


@pytest.mark.slow
def test_csv_export_has_every_step_at_full_resolution(tmp_path):
    events = tmp_path / "events.jsonl"
    lines = list(events_for(epochs=3, steps_per_epoch=20_000))
    events.write_text("".join(json.dumps(e) + "\n" for e in lines))
    steps_csv, epochs_csv = export_run_csv(events, tmp_path / "out.csv")
    rows = list(csv.DictReader(open(steps_csv)))
    assert len(rows) == 60_000, "not the thinned copy the plots show"
    assert rows[0].keys() == {"step", "epoch", "loss", "images_per_s", "grad_norm", "lr_fc", "lr_default"}
    assert rows[1]["grad_norm"] == "" and float(rows[-1]["loss"]) == pytest.approx(1 / 60_000)
    epochs = list(csv.DictReader(open(epochs_csv)))
    assert [int(r["epoch"]) for r in epochs] == [1, 2, 3]


def test_the_model_layer_imports_no_qt():
    code = "import sys, app.state.run_state, app.state.csv_export, app.state.buffers; print('PySide6' in sys.modules)"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO)
    assert result.stdout.strip() == "False", result.stderr


# ---- the device rules: one owner, asked with the machine's facts ----------------------------------------

CPU_ONLY = {"gpus": [], "bf16_cpu": False, "backends": {"gloo": True, "nccl": False, "mpi": False}, "horovod": False}
ONE_GPU = {"gpus": [{"index": 0, "name": "G", "memory_gb": 80}], "bf16_cuda": True, "bf16_cuda_supported": True,
           "bf16_cpu": True, "backends": {"gloo": True, "nccl": True, "mpi": False}, "horovod": True}


@pytest.mark.parametrize(("raw", "facts", "expected"), [
    ({"device": {"type": "cuda"}}, CPU_ONLY, ["device.type: cuda, but no CUDA GPU is available here; use cpu"]),
    ({"device": {"type": "cuda", "gpus": [0, 3]}}, ONE_GPU, ["device.gpus: [3] do not exist"]),
    ({"device": {"type": "cuda", "gpus": [0], "parallel": "dp"}}, ONE_GPU, ["device.parallel: dp: DataParallel "
                                                                           "needs at least 2 GPUs; 1 found"]),
    ({"device": {"parallel": "ddp", "backend": "mpi"}}, CPU_ONLY, ["device.backend: mpi: this PyTorch build"]),
    ({"device": {"parallel": "ddp", "launcher": "horovod"}}, CPU_ONLY, ["device.launcher: horovod is not installed"]),
    ({"device": {"parallel": "ddp", "launcher": "horovod"}}, ONE_GPU, []),
    ({"train": {"amp": "fp16"}}, CPU_ONLY, []),  # fp16 + GradScaler runs on CPU
])
def test_device_rules(raw, facts, expected):
    problems = device_problems(RunConfig.from_dict(raw), facts)
    assert len(problems) == len(expected) and all(p.startswith(e) for p, e in zip(problems, expected)), problems


def test_auto_precision_verdicts():
    assert auto_precision("auto", "cpu", CPU_ONLY) == ("fp32", "auto: this CPU has no native bf16")
    assert auto_precision("auto", "cuda", ONE_GPU, "G") == ("bf16", "auto: G runs bf16 natively")
    assert auto_precision("none", "cuda", ONE_GPU)[0] == "fp32" and auto_precision("fp16", "cpu", {})[0] == "fp16"
    assert set(refusals(ONE_GPU)) == {"dp", "mpi", "mps"}
    assert set(refusals({**ONE_GPU, "mps": True, "bf16_mps": False})) == {"dp", "mpi", "bf16_mps"}


def test_the_runs_page_names_a_dataset_people_recognise():
    from app.state.experiments import dataset_label

    assert dataset_label("/data/photos/train") == "photos/train" and dataset_label(None) == "?"


def attempt(epochs, steps_per_epoch, from_step, from_epoch, time0, status="completed", until_step=None):
    """One segment of a run: a run_start that resumes at (from_step, from_epoch), its steps and epochs, its run_end."""
    yield {"event": "run_start", "config": {"train": {"epochs": epochs}}, "classes": ["a", "b"],
           "param_groups": [{"name": "default"}], "layers": ["fc.weight"], "start_step": from_step,
           "start_epoch": from_epoch, "resumed_from": "checkpoints/last.pt" if from_step else None, "time": time0}
    step = from_step
    for epoch in range(from_epoch + 1, epochs + 1):
        for batch in range(1, steps_per_epoch + 1):
            step += 1
            if until_step is not None and step > until_step:
                yield {"event": "run_end", "status": status, "message": "", "time": time0 + step}
                return
            yield {"event": "step", "step": step, "epoch": epoch, "batch": batch, "batches": steps_per_epoch,
                   "loss": 1.0 / step, "lr": [0.1], "time": time0 + step}
        yield {"event": "epoch", "epoch": epoch, "val_acc": 0.1 * epoch, "time": time0 + step}
    yield {"event": "run_end", "status": status, "message": "", "time": time0 + step + 1}


def test_a_resumed_run_drops_the_superseded_steps_and_counts_from_its_latest_segment(tmp_path):
    """An attempt that crashed at step 7 after a checkpoint at step 4 (end of epoch 1), resumed from there and
    continued to 3 epochs: one run, no zig-zag, counters from the last segment."""
    state = RunState(RunDir(tmp_path))
    crashed = [e for e in attempt(2, 4, 0, 0, 1000.0, status="failed", until_step=7)]
    crashed.insert(-1, {"event": "epoch", "epoch": 2, "val_acc": 0.99, "time": 1006.5})  # a superseded best epoch
    resumed = list(attempt(3, 4, 4, 1, 2000.0))
    for e in crashed + resumed:
        state.apply(e)
    assert list(state.step_loss.x) == list(range(1, 13)), "steps 5-7 of the crashed attempt are gone"
    assert list(state.val_score.x) == [1, 2, 3] and state.val_score.y[1] == pytest.approx(0.2)
    assert state.best_epoch["epoch"] == 3 and state.last_epoch["epoch"] == 3
    assert state.epochs == 3 and state.segments == 2 and state.state == "completed"


def test_a_launched_segment_is_followed_past_the_earlier_segment_s_end(tmp_path):
    run = RunDir(tmp_path).create()
    state = RunState(run)
    first = list(attempt(1, 2, 0, 0, 1000.0))
    for e in first:
        state.apply(e)
    assert state.ended
    state.expect_segment(since=2000.0)
    assert not state.ended and state.state == "starting"
    replay = RunState(run)  # the same launch seen by a dashboard opened on it now: the replay does not end it
    replay.expect_segment(since=2000.0)
    kinds = [replay.apply(e) for e in first]
    assert "finished" not in kinds and not replay.ended and replay.awaiting_start
    run.write_status(state="completed")  # the earlier segment's word, still in status.json
    assert not replay.check_process(), "no liveness verdict before the new segment starts"
    for s in (state, replay):
        for e in attempt(2, 2, 2, 1, 2000.5):
            s.apply(e)
        assert s.ended and s.state == "completed" and list(s.step_loss.x) == [1, 2, 3, 4]


def test_a_launch_that_never_starts_ends_with_its_own_word(tmp_path):
    run = RunDir(tmp_path).create()
    state = RunState(run)
    for e in attempt(1, 2, 0, 0, 1000.0):
        state.apply(e)
    state.expect_segment(since=2000.0)
    state.apply({"event": "run_end", "status": "failed", "message": "checkpoints/last.pt is damaged", "time": 2001.0})
    assert not state.ended
    assert state.launch_ended(1) and state.state == "failed" and "damaged" in state.message


def test_stop_waits_for_a_few_of_this_run_s_steps(tmp_path):
    state = RunState(RunDir(tmp_path))
    assert state.stop_grace_s(15) == 15
    state.apply({"event": "step", "step": 10, "epoch": 1, "time": 100.0})
    state.apply({"event": "step", "step": 20, "epoch": 1, "time": 140.0})  # 4 s a step: a busy machine
    assert state.stop_grace_s(15) == pytest.approx(15 + 5 * 4.0)


def test_a_trainer_killed_after_stop_is_recorded_stopped_not_crashed(tmp_path):
    run = RunDir(tmp_path).create()
    run.write_status(state="running", pid=2**22 + 12345)  # gone
    assert run.effective_state() == "failed"
    assert run.record_forced_stop(20.0)
    status = run.read_status()
    assert run.effective_state() == "stopped" and status["reason"] == "forced" and "20 s" in status["message"]
    assert not run.record_forced_stop(20.0), "an end the trainer recorded itself is kept"


def test_a_malformed_event_is_skipped_not_raised(tmp_path):
    state = RunState(RunDir(tmp_path))
    for bad in (42, None, [1], {"event": "step"}, {"event": "epoch", "epoch": "x"}, {"event": "histogram"}):
        assert state.apply(bad) is None
    assert state.apply({"event": "step", "step": 1, "epoch": 1, "loss": 0.5}) == "stepLogged"
    assert list(state.step_loss.x) == [1]


def test_a_multi_label_run_s_curve_and_best_epoch_are_its_map(tmp_path):
    """A multi-label run's epochs carry val_map: that is the curve and what the best epoch is chosen by (its
    val_acc, the label accuracy at 0.5, can rise while mAP falls)."""
    state = RunState(RunDir(tmp_path))
    for epoch, (acc, mean_ap) in enumerate([(0.80, 0.70), (0.85, 0.65), (0.82, 0.75)], start=1):
        state.apply({"event": "epoch", "epoch": epoch, "val_acc": acc, "val_map": mean_ap, "train_loss": 0.3,
                     "val_loss": 0.3, "time": 1000.0 + epoch}, now=1000.0 + epoch)
    assert state.score_key == "val_map" and list(state.val_score.y) == pytest.approx([0.70, 0.65, 0.75])
    assert state.best_epoch["epoch"] == 3


def test_every_event_the_app_reads_is_a_declared_event_type():
    from app.state.run_state import RunState
    from trainer.core.events import EVENT_TYPES

    assert set(RunState._HANDLERS) <= set(EVENT_TYPES)
    assert set(EVENT_TYPES) - set(RunState._HANDLERS) == {"checkpoint", "export"}, "what no view shows"


def test_configs_the_app_writes_in_one_second_never_share_a_file(tmp_path):
    """Add to queue twice in one second wrote both runs' configs to one configs/config-TIME.yaml."""
    from trainer.core.rundir import new_config_file

    paths = [new_config_file(tmp_path) for _ in range(3)]
    assert len(set(paths)) == 3 and all(p.parent == tmp_path / "configs" and p.exists() for p in paths)
