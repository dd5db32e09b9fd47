"""Auto (issue #24): from a folder and a time budget to a completed, evaluated and exported run, every choice with
its reason; and the pieces it stands on (train.budget, data.test_split, export.formats)."""

import csv
import json
import math
import os
import subprocess
import sys
import time

import pytest
from helpers import REPO, OtherPrograms, run_here, simulated_device, write_config
from test_pretrained import weights_server  # noqa: F401 - a fixture

from trainer.core.config import RunConfig, load_config
from trainer.core.events import read_events
from trainer.core.rundir import RunDir


def tree_state(folder):
    return sorted((str(p), p.stat().st_size, p.stat().st_mtime_ns) for p in folder.rglob("*"))


@pytest.mark.slow  # Auto spends its whole 30 s budget, then tests and exports
def test_auto_trains_evaluates_and_exports_within_its_budget_with_every_choice_explained(
        shapes_dir, tmp_path, torch_home):
    """With a machine busy while Auto probes (each timed probe step made slower), the plan has too few epochs: the
    trainer re-plans them from what it measures and fills its budget, the schedule's annealing completed."""
    before = tree_state(shapes_dir)
    busy = dict(os.environ, TRAINDECK_PROBE_BUSY_S="0.3", TRAINDECK_SIMULATED_DEVICE=simulated_device(10))
    result = run_here("auto", shapes_dir, "--minutes", "0.5", "--runs-dir", tmp_path / "runs",
                      "--set", "train.early_stop.patience=0", env=busy)  # no early stop: the budget is the rule
    assert result.returncode == 0, result.stderr[-3000:]
    (run_dir,) = (tmp_path / "runs").iterdir()
    run = RunDir(run_dir)
    events = read_events(run.events)
    status = run.read_status()
    assert status["state"] == "completed"
    cfg = load_config(run.config)
    # the trainer's own clock: re-planned up from the probe's too-few epochs, ≥ 90% of its budget trained, inside it
    (replan, *_) = [e for e in events if e["event"] == "replan"] or [None]
    assert replan is not None and replan["old_epochs"] == cfg.train.epochs < replan["epochs"], "re-planned up"
    budget_s, first = 60 * cfg.train.budget, events[0]["time"]
    steps = [e for e in events if e["event"] == "step"]
    epochs = [e for e in events if e["event"] == "epoch"]
    interval = max(b["time"] - a["time"] for a, b in zip(steps, steps[1:]))
    kept = [e for e in events if e["event"] == "replan"][-1]["kept_s"]  # the test set and export's, inside it
    assert cfg.train.finish_images > 0 and kept > 0
    assert epochs[-1]["time"] - first >= 0.9 * (budget_s - kept), (epochs[-1]["time"] - first, budget_s, kept)
    assert steps[-1]["time"] - first <= budget_s - kept + interval
    ended = next(e for e in events if e["event"] == "run_end")
    assert ended["time"] - first <= budget_s, "the test set and the export inside the budget"
    # (the budget is read at every step: the last epoch, cut short, has no log step after its last step)
    assert epochs[-1]["lr"][0] < 0.1 * max(s["lr"][0] for s in steps), "the one-cycle schedule annealed to its end"
    choices = json.loads(run.auto_choices.read_text())["choices"]
    assert {"model.name", "data.image_size", "data.batch_size", "optimizer.lr", "train.epochs", "train.budget",
            "train.amp", "data.test_split", "train.replan"} <= {c["key"] for c in choices}
    raw = cfg.to_dict()
    for c in choices:
        assert c["why"].strip(), c["key"]
        node = raw
        for part in c["key"].split("."):
            node = node[part]
        assert node == c["value"], f"{c['key']}: the run trained with {node!r}, auto.json says {c['value']!r}"
    assert "model.name" in result.stdout and "optimizer.lr" in result.stdout  # the choices, printed
    # a stratified test set held out of the folder, never validated on; the folder untouched
    test_rows = list(csv.DictReader((run_dir / "eval" / "test" / "predictions.csv").open()))
    val_rows = list(csv.DictReader((run_dir / "eval" / "val" / "predictions.csv").open()))
    assert {r["true"] for r in test_rows} == {"circle", "cross", "square", "triangle"}
    assert len(test_rows) == round(0.15 * 30) * 4
    assert not {r["path"] for r in test_rows} & {r["path"] for r in val_rows}
    start = next(e for e in read_events(run.events) if e["event"] == "run_start")
    assert start["train_size"] + start["val_size"] + len(test_rows) == 120
    assert tree_state(shapes_dir) == before
    # the ONNX file, and what it predicts is what the run's checkpoint predicts
    export = next(e for e in read_events(run.events) if e["event"] == "export")
    assert export["format"] == "onnx" and os.path.getsize(export["path"]) == export["bytes"] > 0
    assert run_here("predict", export["path"], shapes_dir / "circle", "--json").returncode == 0
    # an ordinary config: it trains again as it stands
    assert RunConfig.from_dict(raw).train.budget == cfg.train.budget > 0


@pytest.mark.slow  # probes pretrained networks at 64 px and up
def test_auto_takes_cached_pretrained_weights_and_the_folder_s_own_test_split(tmp_path, torch_home, simulated):
    from test_pretrained import seed_resnet18

    from trainer.data.demo_data import write_demo_dataset

    seed_resnet18(torch_home)  # under torchvision's own file name
    write_demo_dataset(tmp_path / "data" / "train", per_class=12, size=24, seed=1)
    write_demo_dataset(tmp_path / "data" / "test", per_class=3, size=24, seed=2)
    result = run_here("auto", tmp_path / "data", "--minutes", "2", "--plan-only")
    assert result.returncode == 0, result.stderr[-3000:]
    plan = json.loads(result.stdout)
    by_key = {c["key"]: c for c in plan["choices"]}
    assert by_key["model.name"]["value"] == "resnet18" and by_key["model.weights"]["value"] == "DEFAULT"
    assert "resnet18" in by_key["model.name"]["why"] and "cache" in by_key["model.name"]["why"]
    assert plan["config"]["data"]["test_dir"] == str(tmp_path / "data" / "test")
    assert plan["config"]["data"]["train_dir"] == str(tmp_path / "data" / "train")
    assert plan["config"]["data"]["test_split"] == 0
    assert plan["probes"] and all(p["train_images_per_s"] > 0 for p in plan["probes"])
    assert plan["config"]["train"]["budget"] == pytest.approx(2 - plan["planning_s"] / 60, abs=0.02)


@pytest.mark.parametrize("args, expected", [
    (["{missing}", "--minutes", "1"], "no such folder"),
    (["{one_class}", "--minutes", "1"], "only one class folder"),
    (["{data}", "--minutes", "0"], "--minutes: give a number of minutes from 0.5"),
    (["{data}", "--minutes", "nan"], "got nan"),
    (["{data}", "--minutes", "inf"], "got inf"),
])
def test_auto_refuses_bad_input_in_one_line_before_making_anything(shapes_dir, tmp_path, args, expected):
    (tmp_path / "one" / "cat").mkdir(parents=True)
    (shapes_dir / "circle").iterdir()
    import shutil

    shutil.copy(next((shapes_dir / "circle").iterdir()), tmp_path / "one" / "cat" / "a.png")
    names = {"missing": tmp_path / "nowhere", "one_class": tmp_path / "one", "data": shapes_dir}
    argv = [a.format(**names) for a in args]
    result = run_here("auto", *argv, "--runs-dir", tmp_path / "runs")
    assert result.returncode == 2
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and expected in errors[0], result.stderr
    assert "Traceback" not in result.stderr
    assert not (tmp_path / "runs").exists()


@pytest.mark.slow
def test_a_budget_run_stopped_and_resumed_spends_what_was_left_on_the_epochs_it_re_planned(shapes_dir, tmp_path):
    """train.budget is the run's, not each segment's: stopped after its first re-plan and resumed, the run goes on
    with the epochs it re-planned, the learning rate from where it was, and the budget its first segment left; it ends
    inside it with a model. Planned for 1 epoch and re-planned to many, its learning rate is a function of the
    budget's share spent: it rises again to the one-cycle peak after the re-plan (it stayed annealed at 1e-6 for
    the rest of the budget) and ends annealed at the budget's end. Through the trainer's own clock (its events),
    not this machine's speed."""
    budget_s = 9
    config = write_config(tmp_path, shapes_dir, train={"epochs": 1, "budget": budget_s / 60, "replan": True},
                          scheduler={"name": "onecycle"}, monitor={"log_every": 1})
    run = RunDir(tmp_path / "run")
    device = simulated_device(40)  # an epoch of the 84 training images at 16 px: 0.86 s of the run's own clock
    stopped = dict(os.environ, TRAINDECK_SIMULATED_DEVICE=simulated_device(40, sigterm_at_s=3.5))  # Stop, at 3.5 s
    proc = subprocess.run([sys.executable, str(REPO / "main.py"), "train", str(config), "--run-dir", str(run.path)],
                          stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=stopped, timeout=240)
    assert run.read_status()["state"] == "stopped", proc.stderr[-2000:]
    replan = next(e for e in read_events(run.events) if e["event"] == "replan")
    result = run_here("resume", run.path, env=dict(os.environ, TRAINDECK_SIMULATED_DEVICE=device))
    assert result.returncode == 0, result.stderr[-2000:]

    events = read_events(run.events)
    starts = [i for i, e in enumerate(events) if e["event"] == "run_start"]
    first, second = events[:starts[1]], events[starts[1]:]
    replanned = [e["epochs"] for e in first if e["event"] == "replan"][-1]
    assert second[0]["config"]["train"]["epochs"] == replanned, "the resumed run kept the epochs it had re-planned"
    lr_before = [e["lr"][0] for e in first if e["event"] == "step"][-1]
    lr_after = [e["lr"][0] for e in second if e["event"] == "step"][0]
    assert 0.5 < lr_after / lr_before < 2, ("the schedule went on from where it was", lr_before, lr_after)
    steps = [e["time"] for e in events if e["event"] == "step"]
    interval = max(b - a for a, b in zip(steps, steps[1:]) if b > a)
    trained = sum(max(e["time"] for e in part if e["event"] == "step") - part[0]["time"] for part in (first, second))
    assert trained <= budget_s + interval, f"{trained:.1f} s trained over both segments: the budget is the run's"
    peak = load_config(config).optimizer.lr
    after = [e["lr"][0] for e in events if e["event"] == "step" and e["time"] > replan["time"]]
    assert max(after) >= 0.3 * peak, ("after the re-plan the rate rises again, not annealed", max(after), peak)
    assert after[-1] <= 0.1 * max(after), ("annealed at the budget's end", after[-1], max(after))
    status = run.read_status()
    planned = [e["epochs"] for e in events if e["event"] == "replan"][-1]
    assert status["state"] == "completed" and (status["epoch"] == planned or status["reason"] == "budget"), status
    assert events[-1]["event"] == "run_end" and status["epoch"] > replan["epoch"] + 1
    assert (run.checkpoints / "best.pt").exists()
    # continued for more epochs, as its end message says: the epochs given are the rule, the budget was the run's
    more = run_here("resume", run.path, "--epochs", status["epoch"] + 1)
    added = f"epochs {status['epoch'] + 1} to {status['epoch'] + 1} added train without one"
    assert more.returncode == 0 and added in more.stdout, more.stderr[-2000:]
    assert run.read_status()["epoch"] == status["epoch"] + 1 and run.read_status()["reason"] is None


def test_a_budget_spent_inside_the_first_epoch_cuts_it_short_and_still_validates_it(shapes_dir, tmp_path):
    cfg = write_config(tmp_path, shapes_dir, train={"epochs": 3, "budget": 0.001},  # 60 ms: spent while preparing
                       data={"batch_size": 1}, monitor={"log_every": 5})
    result = run_here("train", cfg, "--run-dir", tmp_path / "run")
    assert result.returncode == 0, result.stderr[-2000:]
    run = RunDir(tmp_path / "run")
    epochs = [e for e in read_events(run.events) if e["event"] == "epoch"]
    # one process reads the budget at every step, not only at log steps (every 5 here; minutes apart on a slow
    # machine at 224 px): cut at the first step, which found it spent, long before the epoch's 96 steps
    assert len(epochs) == 1 and epochs[0]["step"] == 1 and "val_acc" in epochs[0]
    assert run.read_status()["reason"] == "budget" and (run.checkpoints / "best.pt").exists()


def test_export_formats_are_written_at_the_end_of_a_completed_run(shapes_dir, tmp_path):
    cfg = write_config(tmp_path, shapes_dir, train={"epochs": 1}, export={"formats": ["safetensors", "onnx"]})
    assert run_here("train", cfg, "--run-dir", tmp_path / "run").returncode == 0
    run = RunDir(tmp_path / "run")
    exports = [e for e in read_events(run.events) if e["event"] == "export"]
    assert [e["format"] for e in exports] == ["safetensors", "onnx"]
    for e in exports:
        assert os.path.getsize(e["path"]) == e["bytes"] and os.path.exists(e["path"] + ".json")
    assert read_events(run.events)[-1]["event"] == "run_end"


def test_an_export_that_fails_at_the_end_leaves_the_run_completed_with_a_warning(shapes_dir, tmp_path):
    (tmp_path / "run" / "exports" / "model.onnx").mkdir(parents=True)  # where the export goes is a folder
    cfg = write_config(tmp_path, shapes_dir, train={"epochs": 1}, export={"formats": ["onnx"]})
    result = run_here("train", cfg, "--run-dir", tmp_path / "run")
    assert result.returncode == 0, result.stderr[-2000:]
    run = RunDir(tmp_path / "run")
    assert run.read_status()["state"] == "completed" and (run.checkpoints / "best.pt").exists()
    (warning,) = [e for e in read_events(run.events) if e["event"] == "warning" and e["kind"] == "export_failed"]
    assert "main.py export" in warning["message"] and "is a folder" in warning["message"]


def test_a_scan_that_took_the_probe_s_whole_share_still_plans_on_one_measured_probe(shapes_dir, torch_home,
                                                                                   simulated):
    """A folder whose scan (a busy machine, 5,000 classes) took the probe's time crashed with `max() arg is an empty
    sequence`: at least one candidate is measured, whatever the clock says."""
    from trainer.auto import AutoError, plan
    from trainer.core import clock

    result = plan(str(shapes_dir), 0.5, started=clock.now() - 8)  # past the probe's share (4.5 s of 30)
    assert len(result.probes) >= 1
    chosen = {c.key: c.value for c in result.choices}
    assert chosen["model.name"] == result.probes[0].model
    with pytest.raises(AutoError, match="leaves nothing to train in"):
        plan(str(shapes_dir), 0.5, started=clock.now() - 60)  # the whole budget gone: said, not a crash


def simulated_probe(monkeypatch, rates: dict[str, float]) -> None:
    """A slow device on the trainer's clock (seconds per megapixel of a training image, by network; validation at
    0.3 of that): Auto's probe steps cost it what they would cost there (charged to the clock, not computed), and the
    learning-rate sweep is given."""
    from trainer import auto
    from trainer.core import clock

    monkeypatch.setenv("TRAINDECK_SIMULATED_DEVICE", simulated_device(rates, eval_share=0.3))

    def measure(name, weights, size, batch, classes, device, precision, reject_below=0.0):
        image_s = clock.simulated().image_s(name, size * size)
        if reject_below and 1 / image_s < reject_below / 3:  # far too slow: dropped after its warm-up step
            clock.charge_seconds(image_s * batch)
            return auto.Measured(name, weights, size, batch, 1 / image_s, 1 / image_s)
        clock.charge_seconds(image_s * batch * (1 + auto.PROBE_STEPS) + image_s * 0.3 * batch)
        return auto.Measured(name, weights, size, batch, 1 / image_s, 1 / (0.3 * image_s))

    monkeypatch.setattr(auto, "measure", measure)
    monkeypatch.setattr(auto, "sweep_lr", lambda cfg, steps: (1e-3, "given"))


@pytest.mark.parametrize("rates, minutes, fits", [
    ({"resnet18": 60.0, "resnet9": 8.0, "small_cnn": 3.0}, 2.0, True),
    ({"resnet18": 100.0, "resnet9": 30.0, "small_cnn": 40.0}, 2.0, False),
    ({"resnet18": 20000.0, "resnet9": 2000.0, "small_cnn": 3000.0}, 10.0, False)])  # not one epoch of any
def test_the_probe_measures_or_predicts_every_candidate_it_names_and_picks_one_that_fits(
        tmp_path, torch_home, monkeypatch, rates, minutes, fits):
    """On a slow device (the trainer's clock): every candidate, best first, is in the plan with its epochs, measured or
    predicted from a measured one by its operations per image; fewer are measured than there are; the reasons name
    no other network; the pick is the first candidate that truly trains the minimum epochs on that device (worked out
    here from its rates), measured, or, when none does, the one that truly trains the most, the fastest of those
    (on a device too slow for one epoch of any, not the largest: a busy laptop got 1 epoch of resnet18 at 224 px)."""
    from trainer import auto
    from trainer.data.demo_data import write_demo_dataset
    from trainer.data.scan import scan_image_folder

    simulated_probe(monkeypatch, rates)
    folder = write_demo_dataset(tmp_path / "big", per_class=30, size=96, seed=0)
    result = auto.plan(str(folder), minutes)
    sizes = auto.candidate_sizes(scan_image_folder(folder, full=False), False)
    order = [(n, s) for n in auto.SCRATCH for s in sizes if s >= auto.SCRATCH_MIN_SIZE.get(n, 0)]
    table = {(p.model, p.size): p for p in result.probes}
    assert list(table) == order, "every candidate, best first"
    assert all(p.how == "measured" or p.how.startswith("predicted from ") for p in table.values())
    assert 1 <= sum(p.how == "measured" for p in table.values()) < len(order)
    why = {c.key: c.why for c in result.choices}
    assert not {"resnet50", "mobilenet", "efficientnet", "convnext"} & set(why["model.name"].replace(",", " ").split())

    def truly(name, size):  # the epochs the device allows, by the plan's own arithmetic, from its rates
        image_s = rates[name] * size * size / 1e6
        m = auto.Measured(name, None, size, auto.batch_for(size, False), 1 / image_s, 1 / (0.3 * image_s))
        m.finish_s = auto.finish_seconds(m, 18, False)  # 15% of 120 held out for the test
        m.epoch_s = auto.epoch_seconds(m, 87, 15, False)
        epochs = (minutes * 60 * (1 - auto.PLAN_SHARE) - auto.STARTUP_S - m.finish_s) * auto.EPOCH_MARGIN // m.epoch_s
        return max(0, int(epochs))

    need = auto.MIN_EPOCHS["scratch"]
    chosen = table[(result.config.model.name, result.config.data.image_size)]
    fastest_most = max(order, key=lambda c: (truly(*c), 1 / (rates[c[0]] * c[1] ** 2)))
    expected = next((c for c in order if truly(*c) >= need), None) if fits else fastest_most
    assert (fits and expected is not None) or (not fits and truly(*expected) < need)
    assert (chosen.model, chosen.size) == expected, ({c: truly(*c) for c in order}, table)
    assert chosen.how == "measured" and abs(chosen.epochs - truly(*expected)) <= 1
    assert f"{chosen.epochs} epochs at" in why["model.name"]
    assert ("the first of" if fits else "none of") in why["model.name"]


@pytest.mark.parametrize("rates, expected", [
    ({"resnet18": 150.0, "resnet9": 40.0, "small_cnn": 60.0}, ("resnet9", 64)),  # 1 epoch at 112 px: below it
    ({"resnet18": 150.0, "resnet9": 8.0, "small_cnn": 12.0}, ("resnet9", 112))])  # 3+ at 112 px: the usual sizes
def test_a_machine_too_busy_for_a_few_epochs_at_the_images_half_size_trains_smaller_ones(
        tmp_path, torch_home, monkeypatch, rates, expected):
    """Issue #68: on a machine busy all along, the size floor (half the images' own size) left Auto one epoch of
    resnet9 at 112 px, which scored 25%, 64% and 99% in three runs. Below FEW_EPOCHS there, smaller sizes are
    candidates and the first (best first) that trains FEW_EPOCHS is taken; at FEW_EPOCHS or more, nothing changes."""
    from trainer import auto
    from trainer.data.demo_data import write_demo_dataset

    simulated_probe(monkeypatch, rates)
    folder = write_demo_dataset(tmp_path / "photos", per_class=30, size=224, seed=0)
    result = auto.plan(str(folder), 2.0)
    table = {(p.model, p.size): p for p in result.probes}
    assert min(size for _, size in table) < 112, "the sizes below the floor are in the plan, measured or predicted"
    chosen = (result.config.model.name, result.config.data.image_size)
    assert chosen == expected, str({k: p.epochs for k, p in table.items()})
    why = {c.key: c.why for c in result.choices}
    if expected[1] < 112:
        assert table[chosen].epochs >= auto.FEW_EPOCHS > max(p.epochs for (_, size), p in table.items() if size >= 112)
        assert "below it, the first that does" in why["model.name"] and "below the images' half size" in why[
            "data.image_size"]
        assert result.config.train.min_epochs in (0, auto.FEW_EPOCHS), "it makes way only short of what it was for"
    else:
        assert "below" not in why["model.name"]


def test_auto_offers_imagenet_weights_for_photographs_and_plans_with_them_once_downloaded(
        tmp_path, torch_home, monkeypatch, weights_server):  # noqa: F811 - the fixture imported above
    """Photograph-sized images and no weights cached: the plan offers resnet18's ImageNet weights with their size
    and how to get them; `auto --download-weights` offline says why it plans from scratch, naming the address; from
    a (local) server it downloads them with progress, and the plan fine-tunes them. Small images get no offer."""
    from test_pretrained import serve_resnet18

    from trainer import auto
    from trainer.data.demo_data import write_demo_dataset

    simulated_probe(monkeypatch, {"*": 5.0})
    folder = write_demo_dataset(tmp_path / "photos", per_class=12, size=128, seed=0)
    first = auto.plan(str(folder), 2.0)
    assert first.config.model.weights is None and first.offer["model"] == "resnet18"
    why = {c.key: c.why for c in first.choices}["model.weights"]
    assert f"{first.offer['megabytes']:.1f} MB" in why and "--download-weights" in why, why
    assert auto.offer_for(write_demo_dataset(tmp_path / "icons", per_class=3, size=32, seed=0)) is None

    served, url = weights_server
    serve_resnet18(served, monkeypatch, "http://127.0.0.1:1")  # offline: nothing answers there
    offline = run_here("auto", folder, "--minutes", "2", "--plan-only", "--download-weights")
    assert offline.returncode == 0, offline.stderr[-2000:]
    assert "http://127.0.0.1:1/resnet18-" in offline.stderr and "planning from scratch" in offline.stderr
    assert json.loads(offline.stdout.splitlines()[-1])["config"]["model"]["weights"] is None

    name, _ = serve_resnet18(served, monkeypatch, url)
    online = run_here("auto", folder, "--minutes", "2", "--plan-only", "--download-weights")
    assert online.returncode == 0, online.stderr[-2000:]
    assert f"auto: {name}: " in online.stderr and (torch_home / "hub" / "checkpoints" / name).is_file()
    plan = json.loads(online.stdout.splitlines()[-1])
    assert plan["config"]["model"] == {**plan["config"]["model"], "name": "resnet18", "weights": "DEFAULT"}
    assert plan["offer"] is None and "found in the cache" in {c["key"]: c["why"] for c in plan["choices"]}[
        "model.weights"]


def probe_reads(monkeypatch, speeds: dict[str, float], slowdown: dict | None = None) -> None:
    """Auto's probe reads `speeds` (images/s at 96 px, by network; in proportion to the pixels at other sizes; divided
    by `slowdown["factor"]`, a busy machine) instead of measuring this machine: the rules are tested, not its speed."""
    from trainer import auto

    def measure(name, weights, size, batch, classes, device, precision, reject_below=0.0):
        speed = speeds[name] * (96 / size) ** 2 / (slowdown or {}).get("factor", 1.0)
        return auto.Measured(name, weights, size, batch, speed, 3 * speed)

    monkeypatch.setattr(auto, "measure", measure)


def test_a_run_too_slow_for_its_budget_makes_way_for_a_faster_candidate(tmp_path, torch_home, monkeypatch, simulated):
    """Measured again after a first epoch that showed too few epochs fit: only the candidates after the slow one
    (its smaller sizes, then the faster networks) are measured, the reason says why, and there is no third round;
    after the last candidate there is nothing to go on with."""
    from trainer.auto import AutoError, candidate_sizes, plan
    from trainer.data.demo_data import write_demo_dataset
    from trainer.data.scan import scan_image_folder

    folder = write_demo_dataset(tmp_path / "big", per_class=12, size=96, seed=0)  # resnet18 at 96 px, then the others
    probe_reads(monkeypatch, {"resnet18": 10.0, "resnet9": 25.0, "small_cnn": 60.0})
    first = plan(str(folder), 2.0)
    chosen = {c.key: c for c in first.choices}
    assert (first.config.model.name, first.config.data.image_size) == ("resnet18", 96)
    assert chosen["train.min_epochs"].value == first.config.train.min_epochs == 12
    slow = (first.config.model.name, first.config.data.image_size, "it was too slow in its first epoch")
    again = plan(str(folder), 2.0, faster_than=slow)
    assert (again.config.model.name, again.config.data.image_size) != slow[:2]
    assert again.config.data.image_size < slow[1] or again.config.model.name != slow[0]
    assert all((p.model, p.size) != slow[:2] for p in again.probes), "the slow one is not measured again"
    reasons = {c.key: c.why for c in again.choices}
    assert "measured again because it was too slow in its first epoch" in reasons["model.name"]
    assert again.config.train.min_epochs == 0 and "measured again once already" in reasons["train.min_epochs"]
    last = ("small_cnn", min(candidate_sizes(scan_image_folder(folder, full=False), False)), "too slow")
    with pytest.raises(AutoError, match="no network faster than small_cnn"):
        plan(str(folder), 2.0, faster_than=last)


def test_a_plan_measured_on_a_busy_machine_checks_the_larger_networks_again_after_its_first_epoch(tmp_path, torch_home,
                                                                                                    monkeypatch,
                                                                                                    simulated):
    """On a busy machine every candidate reads slow and the probe passes over the larger ones: the plan's run ends
    after its first epoch if 1.5x its planned epochs fit (train.recheck_epochs), naming the networks passed over; a
    quiet probe leaves it off. Measured again (`recheck_of`), the candidates are measured best first as the machine
    is now, once: the second plan checks nothing again. The probe's speeds are given (a table by network and
    size, slower when "busy"), so the rule is what is tested, not this machine's speed."""
    from trainer import auto
    from trainer.data.demo_data import write_demo_dataset

    folder = write_demo_dataset(tmp_path / "big", per_class=12, size=96, seed=0)
    slowdown = {"factor": 4.0}  # a busy machine: every speed a quarter
    probe_reads(monkeypatch, {"resnet18": 10.0, "resnet9": 25.0, "small_cnn": 60.0}, slowdown)
    monkeypatch.setattr(auto.OtherLoad, "share", lambda self: 0.8)
    busy = auto.plan(str(folder), 2.0)
    table = [(p.model, p.size) for p in busy.probes]  # every candidate, measured or predicted, best first
    chosen = (busy.config.model.name, busy.config.data.image_size)
    passed = table[:table.index(chosen)]
    assert passed, table  # larger ones passed over
    chosen_probe, before = busy.probes[len(passed)], busy.probes[len(passed) - 1]
    enough = math.ceil(12 * before.epoch_s / chosen_probe.epoch_s)  # the speed-up at which the next larger fits
    assert busy.config.train.recheck_epochs == max(math.ceil(1.5 * busy.config.train.epochs), enough) > 0
    why = {c.key: c.why for c in busy.choices}["train.recheck_epochs"]
    assert "the machine was busy while Auto measured" in why
    assert all(f"{name} at {size} px" in why for name, size in passed[-4:]), why

    monkeypatch.setattr(auto.OtherLoad, "share", lambda self: 0.05)
    quiet = auto.plan(str(folder), 2.0)
    assert quiet.config.train.recheck_epochs == 0
    assert "quiet" in {c.key: c.why for c in quiet.choices}["train.recheck_epochs"]

    slowdown["factor"] = 1.0  # the other programs are gone: measured again, a larger network fits
    again = auto.plan(str(folder), 2.0, recheck_of=(*chosen, "it was faster than measured in its first epoch"))
    assert [(p.model, p.size) for p in again.probes] == table, "every candidate again, best first"
    assert (again.config.model.name, again.config.data.image_size) in passed
    reasons = {c.key: c.why for c in again.choices}
    assert "measured again because it was faster than measured in its first epoch" in reasons["model.name"]
    assert again.config.train.recheck_epochs == again.config.train.min_epochs == 0
    assert "measured again once already" in reasons["train.recheck_epochs"]


def test_auto_picks_a_policy_only_where_its_trial_measured_that_it_helps(tmp_path, torch_home, monkeypatch, simulated):
    """A plan long enough tries data.augment.policy: two short runs, with and without it; the policy is kept only when
    its run scored more than a point higher, and the reason gives both figures. A short plan is not tried (the
    trial is never run), nor is a multi-label one. The trial's scores and the probe's speeds are given: the rule is
    tested here, the trial's own runs in the next test."""
    from trainer import auto
    from trainer.data.demo_data import write_demo_dataset

    folder = write_demo_dataset(tmp_path / "data", per_class=12, size=32, seed=0)
    monkeypatch.setenv(auto.SCRATCH_ENV, "small_cnn")
    monkeypatch.setattr(auto, "sweep_lr", lambda cfg, steps: (1e-3, "given"))
    speeds = {"small_cnn": 400.0}  # at 96 px: about 0.6 s an epoch of this folder at 32 px, 300 epochs in 4 min
    probe_reads(monkeypatch, speeds)
    trials = []

    def scores(given):
        def trial_score(cfg, policy, epochs, timeout_s):
            trials.append((policy, epochs, cfg.model.name, cfg.data.augment.policy))
            return given[policy]
        monkeypatch.setattr(auto, "trial_score", trial_score)

    scores({"none": 0.80, "trivial_augment": 0.83})
    helped = auto.plan(str(folder), 4.0)
    why = {c.key: c.why for c in helped.choices}["data.augment.policy"]
    assert helped.config.data.augment.policy == "trivial_augment", why
    assert "measured to help" in why and "83.0% with trivial_augment, 80.0% without" in why
    assert [t[0] for t in trials] == ["none", "trivial_augment"] and trials[0][1] >= 3
    assert all(t[2] == "small_cnn" and t[3] == "none" for t in trials), "each arm starts from the plan's config"

    scores({"none": 0.80, "trivial_augment": 0.805})  # within the noise: not kept
    even = auto.plan(str(folder), 4.0)
    assert even.config.data.augment.policy == "none"
    assert "not measured to help" in {c.key: c.why for c in even.choices}["data.augment.policy"]

    trials.clear()
    speeds["small_cnn"] = 0.5  # 4.5 images/s at 32 px: a plan too short to try
    short = auto.plan(str(folder), 4.0)
    assert short.config.data.augment.policy == "none" and not trials, short.config.train.epochs
    assert "not tried" in {c.key: c.why for c in short.choices}["data.augment.policy"]

    monkeypatch.chdir(tmp_path)  # a folder given relative to here: the plan's config is read from its run directory
    relative = auto.plan("data", 4.0)
    assert relative.config.data.train_dir == short.config.data.train_dir == str(folder.resolve())


def test_a_policy_trial_trains_a_throwaway_run_and_reads_its_validation_score(tmp_path, monkeypatch):
    """`trial_score` trains the config in a trainer process of its own, in a temporary directory it removes, and
    returns the run's best validation top-1; the user's folder is only read."""
    from trainer import auto
    from trainer.data.demo_data import write_demo_dataset

    folder = write_demo_dataset(tmp_path / "data", per_class=10, size=32, seed=0)
    before = sorted(p.name for p in folder.rglob("*"))
    temp = tmp_path / "temp"
    temp.mkdir()
    monkeypatch.setattr(auto.tempfile, "tempdir", str(temp))
    cfg = RunConfig.from_dict({"data": {"train_dir": str(folder), "image_size": 24, "batch_size": 16,
                                        "num_workers": 0},
                               "model": {"name": "small_cnn"}, "export": {"formats": ["onnx"]},
                               "train": {"budget": 0.5, "replan": True, "ema": 0.99}})
    score = auto.trial_score(cfg, "trivial_augment", 2, timeout_s=300)
    assert score is not None and 0.0 <= score <= 1.0
    assert list(temp.iterdir()) == [], "the trial's run directory is removed"
    assert sorted(p.name for p in folder.rglob("*")) == before
    assert cfg.data.augment.policy == "none" and cfg.train.epochs == 10, "the plan's config is left as it was"


def test_a_run_that_made_way_and_goes_on_as_it_was_trains_the_epochs_its_first_epoch_showed_fit(
        tmp_path, shapes_dir, monkeypatch):
    """Measured again after a first epoch, the same network at the same size is still the best: the first run goes
    on, with the epochs its first epoch showed fit (it had ended before re-planning them; resumed with its planned
    1 epoch it trained nothing more and left most of the budget unused, on a busy laptop), and no second check."""
    from types import SimpleNamespace

    from trainer import auto, cli
    from trainer.core.config import save_config
    from trainer.runs import runner

    cfg = RunConfig.from_dict(load_config(write_config(tmp_path, shapes_dir)).to_dict())
    cfg.train.epochs, cfg.train.budget, cfg.train.replan, cfg.train.recheck_epochs = 1, 1.5, True, 2
    run = RunDir(tmp_path / "run")
    run.path.mkdir()
    save_config(cfg, run.config)
    run.write_status(state="completed", reason="too_fast", fit_epochs=9, message="9 epochs fit ...: faster than measured")
    monkeypatch.setattr(auto, "plan", lambda *a, **k: (_ for _ in ()).throw(auto.AutoError("still the best")))
    launched = []
    monkeypatch.setattr(runner, "launch", lambda run, cfg, **kw: launched.append((cfg, kw)) or 0)
    args = SimpleNamespace(minutes=2.0, folder=str(shapes_dir), set=[], labels=None)
    same, code = cli._measure_again(run, args, time.time(), lambda text: None)
    assert same.path == run.path and code == 0
    ((resumed, kw),) = launched
    assert kw == {"resume": True} and resumed.train.epochs == 9
    assert resumed.train.min_epochs == resumed.train.recheck_epochs == 0


@pytest.mark.slow  # a 1-minute Auto, trained in this process
def test_auto_after_a_busy_probe_goes_on_with_the_larger_network_its_first_epoch_showed_fits(tmp_path, torch_home,
                                                                                              monkeypatch):
    """`main.py auto` whose probe read a busy machine (given speeds, an eighth of the quiet ones, and other programs
    at 80% of the CPU): it plans small_cnn at 32 px; the real first epoch is far faster than that plan, so the run
    makes way (completed, too_fast, neither tested nor exported), the larger candidates are measured again as the
    machine is now (quiet), and resnet9 at 64 px trains in a new run to the end of the budget, tested and exported."""
    from trainer import auto
    from trainer.data.demo_data import write_demo_dataset

    folder = write_demo_dataset(tmp_path / "shapes64", per_class=30, size=64, seed=0)  # sizes 64, 48, 32
    slowdown = {"factor": 8.0}  # busy: nothing trains 12 epochs, small_cnn at 32 px the most; quiet: resnet9 at 64 does
    probe_reads(monkeypatch, {"resnet9": 40.0, "small_cnn": 30.0}, slowdown)
    # the runs' own clock: a device a third as fast as the quiet probe reads (40 and 30 images/s at 96 px): the first
    # run is still far faster than the busy plan, and the second one re-plans its epochs down (less work here)
    monkeypatch.setenv("TRAINDECK_SIMULATED_DEVICE", simulated_device({"resnet9": 8.1, "small_cnn": 10.9}))

    class Busy:  # only Auto's reading of the machine: the trainer's own threads follow the real one
        def share(self):
            return 0.8 if slowdown["factor"] > 1 else 0.0

    monkeypatch.setattr(auto, "OtherLoad", Busy)
    monkeypatch.setattr(auto, "sweep_lr", lambda cfg, steps: (1e-3, "given"))

    def went_quiet(*args, **kwargs):  # the machine is quiet once the first run has started
        slowdown["factor"] = 1.0
        return launch(*args, **kwargs)

    from trainer.runs import runner
    launch = runner.launch
    monkeypatch.setattr(runner, "launch", went_quiet)
    result = run_here("auto", folder, "--minutes", "1", "--runs-dir", tmp_path / "runs")
    assert result.returncode == 0, result.stderr[-3000:]
    runs = list((tmp_path / "runs").iterdir())
    (first,) = [p for p in runs if RunDir(p).read_status().get("reason") == "too_fast"]
    (second,) = [p for p in runs if p != first]
    made_way = RunDir(first).read_status()
    assert made_way["state"] == "completed" and made_way["reason"] == "too_fast", made_way
    assert "at least train.recheck_epochs" in made_way["message"] and not (first / "eval" / "test").exists()
    planned = {c["key"]: c for c in json.loads(RunDir(first).auto_choices.read_text())["choices"]}
    assert (planned["model.name"]["value"], planned["data.image_size"]["value"]) == ("small_cnn", 32)
    assert planned["train.recheck_epochs"]["value"] > 0 and "resnet9 at 64 px" in planned["train.recheck_epochs"]["why"]
    assert "measuring all the candidates again" in result.stderr
    again = {c["key"]: c for c in json.loads(RunDir(second).auto_choices.read_text())["choices"]}
    assert (again["model.name"]["value"], again["data.image_size"]["value"]) == ("resnet9", 64)
    assert "small_cnn at 32 px was faster than measured" in again["model.name"]["why"]
    assert again["train.recheck_epochs"]["value"] == 0
    status = RunDir(second).read_status()
    assert status["state"] == "completed", status
    assert (second / "eval" / "test" / "metrics.json").exists() and (second / "exports" / "model.onnx").exists()


def test_the_first_epoch_ends_a_run_far_slower_or_faster_than_planned():
    """train.min_epochs: after the first epoch (30 s) of a 2-minute budget only 3 more fit, fewer than 12: the run
    ends there (completed, reason too_slow), saying why; a run that had resumed mid-way is left to re-plan.
    train.recheck_epochs (a probe on a busy machine): after a first epoch of 5 s, 22 fit, at least the 15 asked: the
    run ends there too (reason too_fast) so that the larger networks are measured again."""
    from types import SimpleNamespace

    from trainer.core.config import RunConfig
    from trainer.core.schedule import Stretch
    from trainer.model.checkpoint import TrainState
    from trainer.train.budget import Budget
    from trainer.train.plan import EpochPlan

    def plan_after_epoch_1(step, epoch_s=30.0, **train):
        cfg = RunConfig.from_dict({"train": {"epochs": 20, "budget": 2.0, "replan": True, **train}})
        events = []
        reporter = SimpleNamespace(epochs=20, emit=lambda event, **fields: events.append(fields))
        plan = EpochPlan(cfg, Budget(cfg.train, started=time.time() - epoch_s), Stretch(2000), 100, reporter)
        plan.epoch_seconds = [epoch_s]
        plan.replan(TrainState(epoch=1, step=step))
        return plan, events

    plan, events = plan_after_epoch_1(100, min_epochs=12)
    assert plan.made_way["reason"] == "too_slow"
    assert plan.made_way["why"].startswith("3 epochs fit") and "fewer than train.min_epochs (12)" in plan.made_way["why"]
    assert plan.end_reason(TrainState(epoch=1)) == {"reason": "too_slow", "made_way": plan.made_way["why"],
                                                    "fit_epochs": 3}
    assert events[-1]["epochs"] == 1 and "the run ends here" in events[-1]["why"]
    resumed, _ = plan_after_epoch_1(150, min_epochs=12)  # not its first epoch's end (a resumed run): re-planned, not ended
    assert not resumed.made_way and resumed.cfg.train.epochs == 3

    fast, events = plan_after_epoch_1(100, epoch_s=5.0, epochs=10, recheck_epochs=15)
    assert fast.made_way["reason"] == "too_fast" and fast.made_way["why"].startswith("22 epochs fit")
    assert "at least train.recheck_epochs (15): faster than measured" in fast.made_way["why"]
    assert fast.end_reason(TrainState(epoch=1))["reason"] == "too_fast" and "the run ends here" in events[-1]["why"]
    as_planned, _ = plan_after_epoch_1(100, epoch_s=5.0, epochs=20, recheck_epochs=30)  # 22 fit: goes on as planned
    assert not as_planned.made_way and as_planned.cfg.train.epochs == 20


def test_early_stopping_under_a_budget_anneals_the_learning_rate_before_the_run_ends():
    """Early stopping's patience (6) ran out a third of the way through a budget's schedule: stopping there would
    keep the weights of a high learning rate. The run anneals over the next 2 epochs (a third of the patience), the
    schedule reaching its end at the end of the second, and ends there, early stopped; at the end of the schedule
    it stops at once."""
    from types import SimpleNamespace

    from trainer.core.config import RunConfig
    from trainer.core.schedule import Stretch
    from trainer.model.checkpoint import TrainState
    from trainer.train.budget import Budget
    from trainer.train.plan import EpochPlan

    def plan_at(epoch, spent_s, budget_s=120.0):
        cfg = RunConfig.from_dict({"train": {"epochs": 30, "budget": budget_s / 60, "replan": True,
                                             "early_stop": {"patience": 6}}})
        now = time.time()
        events = []
        reporter = SimpleNamespace(epochs=30, emit=lambda event, **fields: events.append(fields))
        plan = EpochPlan(cfg, Budget(cfg.train, started=now - spent_s),
                         Stretch(3000, deadline=(now - spent_s, now - spent_s + budget_s)), 100, reporter)
        plan.epoch_seconds = [4.0] * epoch
        return plan, TrainState(epoch=epoch, step=100 * epoch), events

    plan, st, events = plan_at(epoch=10, spent_s=40.0)
    stretch = plan.stretch
    assert stretch.virtual(1000) < 0.5 * stretch.total
    assert plan.anneal_before_stopping(st)
    assert plan.cfg.train.epochs == 12 and events[-1]["epochs"] == 12
    assert "anneals over 2 more epochs, then the run ends" in events[-1]["why"]
    assert 0.5 * stretch.total < stretch.virtual(1100) < stretch.total
    assert stretch.virtual(1200) == stretch.total, "annealed at the end of the last epoch"
    st.epoch, st.step = 11, 1100
    assert plan.anneal_before_stopping(st), "the annealing epochs go on"
    st.epoch, st.step = 12, 1200
    assert not plan.anneal_before_stopping(st)
    assert plan.end_reason(st) == {"reason": "early_stop", "early_stop_epoch": 12}

    annealed, st, events = plan_at(epoch=28, spent_s=115.0)
    assert not annealed.anneal_before_stopping(st) and annealed.cfg.train.epochs == 30 and not events


WATCHER = """import sys
from trainer.device.machine import OtherLoad
load = OtherLoad()
print("ready", flush=True)
sys.stdin.readline()
print(load.share())
"""


def test_the_machine_s_other_load_is_measured_without_auto_s_own_work():
    """One window seen by this process and by another program: this process's busy core is the other program's
    "other load" and not its own, whatever else the machine runs meanwhile (the suite's other worker)."""
    import psutil

    from trainer.device.machine import OtherLoad

    watcher = subprocess.Popen([sys.executable, "-c", WATCHER], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                               cwd=REPO)
    assert watcher.stdout.readline().strip() == "ready"
    me = psutil.Process()
    load, wall, cpu = OtherLoad(), time.perf_counter(), sum(me.cpu_times()[:2])
    while sum(me.cpu_times()[:2]) - cpu < 0.5:  # this process's own work: half a CPU second, however long it takes
        pass
    ours = load.share()
    mine = (sum(me.cpu_times()[:2]) - cpu) / ((time.perf_counter() - wall) * (psutil.cpu_count() or 1))
    theirs = float(watcher.communicate("\n", timeout=60)[0])
    # the two shares differ by this process's own work, as its CPU time says, whatever else the machine ran
    assert 0.5 * mine < theirs - ours < 1.5 * mine + 0.02, (ours, theirs, mine)
    load = OtherLoad()
    with OtherPrograms(os.cpu_count() or 1):
        time.sleep(1.5)
        busy = load.share()
    assert busy > 0.5, busy


def test_training_threads_give_way_to_other_programs_and_come_back(monkeypatch):
    """device.share_cpu: with every core kept busy by other programs, torch trains on one thread (a thread sharing its
    core slows every parallel step); once they are gone, on all its threads again."""
    import psutil
    import torch

    from trainer.device import machine
    from trainer.device.machine import CpuThreads

    cores = psutil.cpu_count() or 1
    if cores < 2:
        pytest.skip("one core: nothing to give way")
    before = torch.get_num_threads()
    torch.set_num_threads(cores)
    fit = CpuThreads(cores, every_s=0.5)
    with OtherPrograms(cores):
        time.sleep(1.0)
        changed = fit.check()
    try:
        assert changed is not None and changed[1] == 1 and torch.get_num_threads() == 1, changed
        assert changed[2] > cores / 2, "the other programs' cores, measured"
        # gone: the machine's other load reads nothing (given here: the suite's other worker may keep a core busy)
        monkeypatch.setattr(machine.OtherLoad, "share", lambda self: 0.0)
        time.sleep(0.6)
        back = fit.check()
        assert back == (1, cores, 0.0) and torch.get_num_threads() == cores, back
    finally:
        torch.set_num_threads(before)


def test_the_plan_says_the_machine_was_busy_while_it_measured(shapes_dir, torch_home, monkeypatch, simulated):
    from trainer import auto
    from trainer.core import clock

    monkeypatch.setattr(auto.OtherLoad, "share", lambda self: 0.8)
    result = auto.plan(str(shapes_dir), 0.5, started=clock.now() - 8)  # one probe, no LR sweep
    epochs = next(c for c in result.choices if c.key == "train.epochs")
    assert "the machine was busy while Auto measured (other programs used 80% of the CPU)" in epochs.why
    assert "re-plans the epochs from the speed it measures" in epochs.why
    monkeypatch.setattr(auto.OtherLoad, "share", lambda self: 0.05)
    epochs = next(c for c in auto.plan(str(shapes_dir), 0.5, started=clock.now() - 8).choices if c.key == "train.epochs")
    assert "busy" not in epochs.why and "median of 3 timed steps after a warm-up step" in epochs.why


def test_a_machine_that_slows_down_before_the_last_epoch_still_gets_an_annealed_last_epoch():
    """The machine slowed: after epoch 3 no whole epoch fits in the 20 s left. Ending there left the learning rate
    mid-way (planned for epochs the machine turned out too slow for); one process plans a last epoch instead, which the
    budget cuts short while the deadline anneals its schedule. Across ranks (no deadline) the run ends there."""
    from types import SimpleNamespace

    from trainer.core.config import RunConfig
    from trainer.core.schedule import Stretch
    from trainer.model.checkpoint import TrainState
    from trainer.train.budget import Budget
    from trainer.train.plan import EpochPlan

    def plan_after_epoch_3(deadline, planned=5):
        cfg = RunConfig.from_dict({"train": {"epochs": planned, "budget": 2.0, "replan": True}})
        reporter = SimpleNamespace(epochs=5, emit=lambda *a, **k: None)
        # 20 s of the 120 s budget left; an epoch now takes 30 s
        plan = EpochPlan(cfg, Budget(cfg.train, started=time.time() - 100), Stretch(500, deadline=deadline), 100,
                         reporter, world_size=1 if deadline else 2)
        plan.epoch_seconds = [30.0, 30.0, 30.0]
        plan.replan(TrainState(epoch=3, step=300))
        return plan

    one = plan_after_epoch_3((time.time() - 100, time.time() + 20))
    assert one.cfg.train.epochs == 4 and not one.out_of_budget, "a last epoch, cut short by the budget"
    ranks = plan_after_epoch_3(None)
    assert ranks.cfg.train.epochs == 3 and ranks.out_of_budget
    # its plan done (3 of 3) with 20 s left: the last epoch, cut short, is planned too (the re-plan's margin against
    # noise is for plans with epochs left: a run with a CPU hog ended at 86% of its budget on it, bench/auto.py)
    done = plan_after_epoch_3((time.time() - 100, time.time() + 20), planned=3)
    assert done.cfg.train.epochs == 4 and not done.out_of_budget


def test_auto_keeps_adamw_s_usual_rate_when_its_sweep_finds_no_minimum(monkeypatch):
    """Issue #69's finder suggests nothing for a curve without a minimum inside its range; Auto's plan then takes
    AdamW's usual 1e-3 and says why (it failed with a TypeError on the missing suggestion)."""
    from trainer import auto
    from trainer.train import lr_find

    curve = {"lrs": [1e-6, 1.0], "losses": [1.0, 0.5], "suggested_lr": None, "extend": [1e-6, 100.0],
             "why": "no suggestion: the loss was still falling at 1, the range's end"}
    monkeypatch.setattr(lr_find, "find_lr", lambda *args, **kwargs: curve)
    lr, why = auto.sweep_lr(RunConfig(), 50)
    assert lr == 1e-3 and "suggested none: the loss was still falling at 1" in why, why
    monkeypatch.setattr(lr_find, "find_lr", lambda *args, **kwargs: {**curve, "suggested_lr": 0.02, "why": "valley"})
    assert auto.sweep_lr(RunConfig(), 50)[0] == 3e-3, "a suggestion is still kept within what AdamW tolerates"
