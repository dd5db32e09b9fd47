"""Long runs and many runs (issue #50): opening a run of 10^4 / 10^5 / 10^6 steps in the app, and Compare of 10 runs
of 10^5 steps, through the runs' summaries (`trainer.core.summary`) and, beside them, through their whole event
files as before (the summary moved aside). Each step is a `step` and a `grad_stats` event as a real run writes them
(1.3 kB together, like the issue's files), with epochs, checkpoints and system samples at their rates, written by
the trainer's own `EventWriter` (which keeps the summary). Measured: the wall time until the dashboard has read the
run to its end, the longest gap of a 10 ms timer on the GUI thread, the process's resident memory growth; and the
trainer's cost of keeping the summary per event (the same events written with and without it).

python bench/scale.py [--steps 10000 100000 1000000] [--full-up-to 100000] [--compare-runs 10]   (offscreen)
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
import time
from pathlib import Path

from common import REPO, machine, save_result, scratch

sys.path.insert(0, str(REPO))

LAYERS = 20
STEPS_PER_EPOCH = 1000


def rss_mb() -> float:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmRSS")) / 1024


def write_run(folder, steps: int, offset: float = 0.0, keep_summary: bool = True) -> float:
    """A run of `steps` steps, its events written by EventWriter; the seconds writing took."""
    from trainer.core import events as events_module
    from trainer.core.config import RunConfig
    from trainer.core.rundir import RunDir

    run = RunDir(folder).create()
    cfg = RunConfig.from_dict({"train": {"epochs": math.ceil(steps / STEPS_PER_EPOCH)}, "model": {"name": "resnet18"},
                               "data": {"train_dir": "/data/photos/train"}}).to_dict()
    started = time.perf_counter()
    writer = events_module.EventWriter(run.events)
    if not keep_summary:  # the writer as it was before the summary: the same events, no keeper
        writer.summary = type("NoKeeper", (), {"add": lambda *a: None, "maybe_write": lambda *a: None,
                                                "write": lambda *a: None})()
    writer.emit("run_start", config=cfg, classes=["a", "b"], param_groups=[{"name": "all"}],
                layers=[f"layer{i}.weight" for i in range(LAYERS)], train_size=64_000, val_size=8_000,
                device="cpu", cache="decoded images", world_size=1, workers=0, steps_per_epoch=STEPS_PER_EPOCH,
                precision="fp32", memory_format="channels_last", compiled=False, parameters=11_177_538,
                trainable=11_177_538, start_epoch=0, start_step=0, augment=[])
    for step in range(1, steps + 1):
        epoch = (step - 1) // STEPS_PER_EPOCH + 1
        loss = 2.0 / (1 + step / 1000) + offset + 0.02 * math.sin(step)
        writer.emit("step", step=step, epoch=epoch, batch=(step - 1) % STEPS_PER_EPOCH + 1, batches=STEPS_PER_EPOCH,
                    loss=loss, lr=[0.1 * (1 - step / (steps + 1))], images_per_s=566.6169415507549,
                    grad_norm=1.480833888053894)
        writer.emit("grad_stats", step=step, grad_norm=[0.28374189138412476 + i / 100 for i in range(LAYERS)],
                    weight_norm=[1.0] * LAYERS, update_ratio=[0.001] * LAYERS)
        if step % 50 == 0:
            writer.emit("system", cpu_percent=180.0, rss_mb=745.0546875, processes=1, gpus=[])
        if step % STEPS_PER_EPOCH == 0:
            writer.emit("epoch", epoch=epoch, train_loss=loss, val_loss=loss * 1.1, val_acc=min(0.99, step / steps),
                        seconds=30.0)
            writer.emit("checkpoint", epoch=epoch, step=step, path=f"checkpoints/ckpt-e{epoch:04d}.pt", best=True)
    writer.emit("run_end", status="completed", message="", best_acc=0.99, epochs_completed=steps // STEPS_PER_EPOCH,
                step=steps)
    writer.close()
    return time.perf_counter() - started


class GapMeter:
    """The longest interval between the ticks of a 10 ms timer on the GUI thread, beyond its 10 ms, and the GUI
    thread's own CPU time inside each interval (`time.thread_time`: what the GUI thread did itself, not the workers
    or the other processes that a busy machine's wall gap also holds)."""

    def __init__(self):
        from PySide6.QtCore import QTimer

        self.longest, self.over_100, self.longest_at = 0.0, 0, 0.0
        self.longest_cpu, self.cpu_over_50 = 0.0, 0
        self.long_gaps: list[tuple[float, int]] = []  # (when, ms) of each gap over 100 ms
        self._last = self.started = time.perf_counter()
        self._last_cpu = time.thread_time()
        self.timer = QTimer()
        self.timer.setInterval(10)
        self.timer.timeout.connect(self._tick)
        self.timer.start()

    def _tick(self) -> None:
        now, cpu = time.perf_counter(), time.thread_time()
        gap = now - self._last - 0.010
        held = cpu - self._last_cpu  # the GUI thread's CPU between two ticks
        self.longest_cpu = max(self.longest_cpu, held)
        self.cpu_over_50 += held > 0.050
        self._last_cpu = cpu
        if gap > self.longest:
            self.longest, self.longest_at = gap, self._last - self.started
        if gap > 0.100:
            self.long_gaps.append((round(self._last - self.started, 2), round(1000 * gap)))
        self.over_100 += gap > 0.100
        self._last = now

    def stop(self) -> dict:
        self.timer.stop()
        return {"longest_gap_ms": round(1000 * self.longest, 1), "longest_gap_at_s": round(self.longest_at, 2),
                "gaps_over_100ms": self.over_100, "long_gaps": self.long_gaps[:10],
                "longest_gap_gui_cpu_ms": round(1000 * self.longest_cpu, 1), "gaps_over_50ms_gui_cpu": self.cpu_over_50}


def settle(app, seconds: float = 0.5) -> None:
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        app.processEvents()
        time.sleep(0.01)


def open_run(app, run_path, limit_s: float) -> dict:
    """The dashboard shows the run, read to its end (or `limit_s`: the share read then)."""
    from PySide6.QtCore import QEventLoop, QTimer

    from app.jobs.run_model import RunModel
    from app.training.dashboard import Dashboard
    from trainer.core.rundir import RunDir

    dashboard = Dashboard()
    dashboard.resize(1280, 720)
    dashboard.show()
    settle(app)  # shown and painted before the run is opened, as in the app's window
    before = rss_mb()
    meter = GapMeter()
    started = time.perf_counter()
    model = RunModel(RunDir(run_path))
    dashboard.set_model(model)
    model.watch()
    loop = QEventLoop()
    check = QTimer()
    check.setInterval(20)
    check.timeout.connect(lambda: (not model.watching or time.perf_counter() - started > limit_s) and loop.quit())
    check.start()
    loop.exec()
    check.stop()
    seconds = time.perf_counter() - started
    settle(app)  # the dashboard's own ticks draw what is left (the gaps are measured through them)
    size = os.path.getsize(model.run.events)
    read = 1.0 if not model.watching else model._events.offset / size
    result = {"seconds": round(seconds, 2), "read_share": round(read, 3), **meter.stop(),
              "rss_growth_mb": round(rss_mb() - before, 1), "points": len(model.step_loss)}
    model.close()
    dashboard.close()
    dashboard.deleteLater()
    app.processEvents()
    return result


def compare(app, paths: list[str]) -> dict:
    """Compare as the Runs page does it: the curves read (on its thread pool), then drawn on the GUI thread."""
    from app.pages.runs_page import RunsPage, load_curves

    page = RunsPage()
    page.resize(1280, 720)
    page.show()
    settle(app)
    before = rss_mb()
    started = time.perf_counter()
    curves = load_curves(paths)
    read = time.perf_counter() - started
    meter = GapMeter()
    drawing = time.perf_counter()
    page.views.show_compare(curves)
    while page.views.compare_pending:  # drawn one run an event-loop turn
        app.processEvents()
    settle(app, 0.2)  # and painted
    draw = time.perf_counter() - drawing - 0.2
    result = {"seconds": round(time.perf_counter() - started, 2), "read_s": round(read, 2), "draw_s": round(draw, 3),
              "points": sum(len(c["steps"]) for _, c in curves), "rss_growth_mb": round(rss_mb() - before, 1),
              **meter.stop()}
    page.close()
    return result


def compare_without_summaries(app, paths: list[str]) -> dict:
    """Compare of runs without summaries, as the Runs page does it (`RunsPage._compare`: the summaries built by
    `main.py summarize` processes, as many side by side as the machine has cores, then read and drawn): from the
    click to the last run drawn, and the GUI thread's CPU inside each gap."""
    from app.pages.runs_page import RunsPage
    from trainer.core.rundir import RunDir

    page = RunsPage()
    page.resize(1280, 720)
    page.show()
    settle(app)
    shown: list[float] = []
    draw = page.views.show_compare
    page.views.show_compare = lambda curves: (shown.append(time.perf_counter()), draw(curves))
    page.selected = lambda: paths
    meter = GapMeter()
    started = time.perf_counter()
    page._compare()
    while not shown or page.views.compare_pending:
        app.processEvents()
        time.sleep(0.005)
        if time.perf_counter() - started > 600:
            break
    seconds = time.perf_counter() - started
    settle(app, 0.2)
    result = {"seconds": round(seconds, 2), "summaries_built_s": round(shown[0] - started, 2) if shown else None,
              "summaries": sum(RunDir(p).summary.exists() for p in paths), **meter.stop()}
    page.close()
    return result


def runs_folder(root, count: int):
    """`count` finished runs (copies of one run of 2,000 steps, learning rates and seeds varied), as a sweep leaves."""
    import shutil

    import yaml

    from trainer.core.rundir import RunDir

    first = root / "run-0000"
    write_run(first, 2_000)
    RunDir(first).write_status(state="completed", epoch=2, step=2_000, best_acc=0.9, val_acc=0.88, started=1.0,
                               ended=100.0, reason=None)
    raw = yaml.safe_load((first / "config.yaml").read_text()) if (first / "config.yaml").exists() else None
    if raw is None:
        from trainer.core.config import RunConfig

        raw = RunConfig.from_dict({"data": {"train_dir": "/data/photos/train"}}).to_dict()
    for i in range(count):
        folder = root / f"run-{i:04d}"
        if i:
            shutil.copytree(first, folder)
        raw["optimizer"]["lr"] = 10 ** -(1 + i % 30 / 10)
        raw["train"]["seed"] = i
        (folder / "config.yaml").write_text(yaml.safe_dump(raw))
        RunDir(folder).write_status(best_acc=0.5 + (i % 97) / 200)
    return root


def runs_page(app, root) -> dict:
    """The Runs page listing the runs, then following one run's status change (as when a queued run starts)."""
    from app.pages.runs_page import RunsPage
    from trainer.core.rundir import RunDir

    page = RunsPage()
    page.resize(1280, 720)
    page.show()
    settle(app)
    count = sum(1 for _ in root.iterdir())
    meter = GapMeter()
    started = time.perf_counter()
    page.set_runs_dir(root)
    while page.model.rowCount() < count:
        app.processEvents()
        time.sleep(0.002)
    listed = time.perf_counter() - started
    settle(app)
    first = meter.stop()
    page._signature = ()  # what the page last saw: taken now, as its follow timer does
    from app.pages.runs_page import status_signature

    page._signature = status_signature(root)
    meter = GapMeter()
    changed = sorted(root.iterdir())[500]
    while page._reading:  # the page idle first: no read under way that would see the change by itself
        app.processEvents()
    RunDir(changed).write_status(state="failed", message="changed")
    started = time.perf_counter()
    page._check_changes()
    while next(r["status"] for r in page.model.rows if r["path"] == str(changed)) != "failed":
        app.processEvents()
        time.sleep(0.002)
    followed = time.perf_counter() - started
    settle(app)
    result = {"runs": count, "listed_s": round(listed, 2), "listing": first, "follow_change_s": round(followed, 2),
              "following": meter.stop()}
    page.close()
    return result


def image_folder(root, count: int, classes: int = 10):
    """`count` 32 px PNGs of noise, each its own (no copies for the audit to group), in `classes` class folders
    (kept between runs of the benchmark: writing 100,000 takes a minute or two)."""
    import numpy as np
    from PIL import Image

    done = root / f".done-noise-{count}"
    if done.exists():
        return root
    rng = np.random.default_rng(0)
    for c in range(classes):
        folder = root / f"class{c:02d}"
        folder.mkdir(parents=True, exist_ok=True)
        for i in range(count // classes):
            Image.fromarray(rng.integers(0, 255, (32, 32, 3), dtype=np.uint8)).save(folder / f"{i:06d}.png")
    done.touch()
    return root


def dataset_page(app, folder, work) -> dict:
    """The main window's Dataset page given a folder of many images, as a user picks one: until the page shows it."""
    from PySide6.QtCore import QSettings

    from app.main_window import MainWindow
    from trainer.core.config import RunConfig, save_config

    first = image_folder(work / "few", 100)
    config = work / "dataset-page.yaml"
    save_config(RunConfig.from_dict({"data": {"train_dir": str(first)}}), config)
    window = MainWindow(QSettings(str(work / "settings.ini"), QSettings.Format.IniFormat), work / "runs", config)
    window.resize(1280, 720)
    window.show()
    page = window.dataset_page
    while page.scan_result is None:
        app.processEvents()
    settle(app, 1.0)
    before = rss_mb()
    meter = GapMeter()
    started = time.perf_counter()
    window.binder.widgets["data.train_dir"].setText(str(folder))
    while page.scan_result is None or len(page.scan_result.samples) < 1000:
        app.processEvents()
        time.sleep(0.002)
    shown = time.perf_counter() - started
    settle(app)
    result = {"images": len(page.scan_result.samples), "shown_s": round(shown, 2), **meter.stop(),
              "rss_growth_mb": round(rss_mb() - before, 1)}
    window._leave_running = True
    window.close()
    settle(app, 0.2)
    return result


def audit(work, images_dir: Path, count: int) -> dict:
    """`main.py audit RUN --map` on a run of `count` images (small_cnn, one epoch, 32 px): its wall time, its peak
    memory, and the phases its log names."""
    import subprocess

    import yaml

    folder = image_folder(images_dir / str(count), count)
    config = work / f"audit-{count}.yaml"
    config.write_text(yaml.safe_dump({"data": {"train_dir": str(folder), "image_size": 32, "batch_size": 256,
                                               "val_split": 0.1}, "model": {"name": "small_cnn"},
                                      "train": {"epochs": 1}, "optimizer": {"name": "adamw", "lr": 0.003}}))
    runs = work / f"audit-runs-{count}"
    subprocess.run([sys.executable, str(REPO / "main.py"), "train", str(config), "--runs-dir", str(runs)], check=True,
                   capture_output=True)
    run = next(runs.iterdir())
    audited = watched([sys.executable, str(REPO / "main.py"), "audit", str(run), "--map"])  # its own peak, not the run's
    return {"images": count, **audited}


def watched(argv: list[str], done=lambda: False) -> dict:
    """`argv` run to its end, or until `done()` (then stopped): its seconds, the peak memory of its largest process
    (sampled every 20 ms), its exit code and its last output."""
    import subprocess

    import psutil

    started = time.perf_counter()
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    peak, reached = 0.0, None
    while proc.poll() is None:
        try:
            tree = [psutil.Process(proc.pid), *psutil.Process(proc.pid).children(recursive=True)]
            peak = max(peak, max(p.memory_info().rss for p in tree) / 2**20)
        except psutil.Error:
            pass
        if reached is None and done():
            reached = time.perf_counter() - started
            proc.terminate()
        time.sleep(0.02)
    reached = reached if reached is not None else time.perf_counter() - started  # ran to its end
    return {"seconds": round(reached, 2), "peak_rss_mb": round(peak),
            "exit_code": proc.returncode, "said": proc.stderr.read().decode()[-600:]}


def long_run_commands(work, steps: int) -> dict:
    """`resume`, `export` and its model card on a real run whose events file holds `steps` more steps and no summary
    (a run from before summaries, or copied without one): each command's time to its first step (resume) or to its
    file (export, the card beside it), and its peak memory (the largest process, sampled every 20 ms)."""
    import subprocess

    from trainer.core.rundir import RunDir
    from trainer.data.demo_data import write_demo_dataset

    data = work / "long-data"
    if not data.exists():
        write_demo_dataset(data, per_class=100, size=16, seed=0)
    runs = work / f"long-runs-{steps}"
    train = [sys.executable, str(REPO / "main.py"), "train", str(REPO / "resources" / "demo.yaml"), "--set",
             f"data.train_dir={data}", "data.image_size=16", "train.epochs=1", "--runs-dir", str(runs)]
    subprocess.run(train, check=True, capture_output=True)
    run = RunDir(next(runs.iterdir()))
    lines = run.events.read_bytes().splitlines(keepends=True)
    end = next(i for i in range(len(lines) - 1, -1, -1) if lines[i].startswith(b'{"event": "run_end"'))
    last = max((json.loads(line)["step"] for line in lines if line.startswith(b'{"event": "step"')), default=0)
    with open(run.events, "wb") as f:  # the real run's events, `steps` more steps, then its end
        f.writelines(lines[:end])
        for step in range(last + 1, last + steps + 1):
            f.write(json.dumps({"event": "step", "time": 1.0, "step": step, "epoch": 1, "batch": 1, "batches": 1,
                                "loss": 1.0 / (1 + step / 1000), "lr": [0.01], "images_per_s": 500.0,
                                "grad_norm": 1.5}).encode() + b"\n")
            f.write(json.dumps({"event": "grad_stats", "time": 1.0, "step": step,
                                "grad_norm": [0.28 + i / 100 for i in range(LAYERS)], "weight_norm": [1.0] * LAYERS,
                                "update_ratio": [0.001] * LAYERS}).encode() + b"\n")
        f.writelines(lines[end:])
    run.summary.unlink(missing_ok=True)
    size_mb = run.events.stat().st_size / 2**20

    before = run.events.stat().st_size
    resumed = watched([sys.executable, str(REPO / "main.py"), "resume", str(run.path), "--epochs", "2"],
                      lambda: b'"event": "step"' in _tail(run.events, before))
    out = work / f"long-export-{steps}" / "model.safetensors"
    exported = watched([sys.executable, str(REPO / "main.py"), "export", str(run.path), "--format", "safetensors",
                        "--out", str(out)], lambda: False)
    exported["file_and_card"] = out.exists() and out.with_name(out.name + ".md").exists()
    return {"steps_added": steps, "events_mb": round(size_mb), "summary_after": run.summary.exists(),
            "resume_to_first_step": resumed, "export_with_card": exported}


def _tail(path: Path, offset: int) -> bytes:
    """What was appended to `path` after `offset` bytes (the first 64 kB of it)."""
    with open(path, "rb") as f:
        f.seek(offset)
        return f.read(65536)


def moved_aside(run_path):
    """The run without its summary, as every run was before it (a context: put back after)."""
    import contextlib

    from trainer.core.rundir import RunDir

    @contextlib.contextmanager
    def aside():
        summary = RunDir(run_path).summary
        hidden = summary.with_name("hidden-" + summary.name)
        summary.rename(hidden)
        try:
            yield
        finally:
            hidden.rename(summary)
    return aside()


def window_opening(app, work, steps_list: list[int]) -> dict:
    """The real main window, a run opened as the Runs page opens one (`run_actions.open`: the dashboard, built at the
    session's first open, and the run's settings into the forms), each run with its summary and a copy without one
    (written without the summary: a run from before summaries), the first open of the session included. Until the
    dashboard has read the run to its end: the wall time, the time to the first curve point, whether the summary was
    built (once), and the GUI thread's CPU inside each gap of a 10 ms timer."""
    from PySide6.QtCore import QSettings

    from app.main_window import MainWindow
    from trainer.core.rundir import RunDir

    window = MainWindow(QSettings(str(work / "window-settings.ini"), QSettings.Format.IniFormat), work / "win-runs")
    window.resize(1280, 720)
    window.show()
    settle(app, 2.0)
    out: dict = {}
    for steps in steps_list:
        for summary in (True, False):
            path = work / f"win-{steps}-{'summary' if summary else 'none'}"
            written = write_run(path, steps, keep_summary=summary)
            before = rss_mb()
            meter = GapMeter()
            started, first_point = time.perf_counter(), None
            window.run_actions.open(str(path))
            model = window.runs.model
            began = False  # the model watching: after the summary is built, when it had to be
            while time.perf_counter() - started < 900:
                app.processEvents()
                time.sleep(0.005)
                began = began or model.watching
                if first_point is None and len(model.step_loss):
                    first_point = time.perf_counter() - started
                if began and not model.watching:
                    break
            seconds = time.perf_counter() - started
            settle(app)
            out[f"{steps}, {'with' if summary else 'without'} summary"] = {
                "events_mb": round(os.path.getsize(RunDir(path).events) / 2**20, 1), "written_s": round(written, 1),
                "seconds": round(seconds, 2), "first_point_s": round(first_point, 2) if first_point else None,
                "summary_built": not summary and RunDir(path).summary.exists(), **meter.stop(),
                "rss_growth_mb": round(rss_mb() - before, 1), "points": len(model.step_loss)}
            print(steps, summary, json.dumps(out[f"{steps}, {'with' if summary else 'without'} summary"]), flush=True)
    window._leave_running = True
    window.close()
    settle(app, 0.2)
    return out


CASES = ("writer", "opening", "window", "runs_page", "dataset_page", "compare", "audit", "long_run_commands")


def each_in_its_own_process(args) -> None:
    import subprocess
    import tempfile

    passed = [a for a in sys.argv[1:]]
    if "--only" in passed:  # the cases given replace the list, one per process
        at = passed.index("--only")
        end = at + 1
        while end < len(passed) and not passed[end].startswith("--"):
            end += 1
        passed = passed[:at] + passed[end:]
    merged: dict = {"machine": machine()}
    for case in args.only:
        with tempfile.NamedTemporaryFile(suffix=".json") as out:
            subprocess.run([sys.executable, __file__, *passed, "--only", case, "--into", out.name], check=True)
            part = json.loads(Path(out.name).read_text())
        merged.update({k: v for k, v in part.items() if v})
    save_result("scale" if set(args.only) == set(CASES) else "scale_" + "_".join(args.only), merged)  # a part apart
    print(json.dumps(merged, indent=1))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, nargs="+", default=[10_000, 100_000, 1_000_000])
    parser.add_argument("--full-up-to", type=int, default=100_000, help="the whole-file reading is measured up to "
                                                                          "this many steps (10^6 took ~13 min)")
    parser.add_argument("--compare-runs", type=int, default=10)
    parser.add_argument("--writer-steps", type=int, default=20_000)
    parser.add_argument("--runs-page", type=int, default=1000, help="runs listed on the Runs page (0: not measured)")
    parser.add_argument("--default-process-settings", action="store_true",
                        help="without the app's start-up setting (what it built frozen for the garbage collector)")
    parser.add_argument("--images", type=int, default=100_000, help="images in the Dataset page's folder")
    parser.add_argument("--images-dir", default=str(REPO / "bench" / ".data" / "scale-images"),
                        help="where that folder is written (kept for the next run)")
    parser.add_argument("--audit-images", type=int, nargs="+", default=[20_000, 100_000])  # 100,000: ~10 min
    parser.add_argument("--long-steps", type=int, nargs="+", default=[0, 1_000_000],
                        help="steps added to a real run's events for resume and export (10^6: a 1.3 GB file; 0: the "
                        "same commands on the run as it is, their baseline)")
    parser.add_argument("--collector-on", action="store_true",
                        help="the Dataset page's scan without its pause of the garbage collector (as before #50)")
    parser.add_argument("--only", nargs="+", choices=CASES, default=list(CASES),
                        help="the cases measured, each in a process of its own (one case's garbage is not another's)")
    parser.add_argument("--into", help=argparse.SUPPRESS)  # a case's process: where its result goes
    args = parser.parse_args()
    os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
    if len(args.only) > 1 or not args.into:
        each_in_its_own_process(args)
        return
    work = scratch("td-scale-")
    from PySide6.QtWidgets import QApplication

    app = QApplication([])
    if not args.default_process_settings:
        import importlib

        from app.main import quiet_garbage_collector

        importlib.import_module("app.main_window")  # the app freezes once its window is built: every module imported

        quiet_garbage_collector()  # as the app does at start (frozen before them, the dashboard's modules, imported
        # later, made each full collection ~100 ms: one ran while the first run opened, a 140-170 ms gap)
    result = {"machine": machine(), "opening": {}, "compare": {}, "writer": {},
              "process_settings": "python defaults" if args.default_process_settings else "the app's"}

    # the trainer's cost of keeping the summary: the same events, alternated, 3 pairs
    per_event = {"with": [], "without": []}
    for i in range(3 if "writer" in args.only else 0):
        for keep in (True, False):
            s = write_run(work / f"writer-{keep}-{i}", args.writer_steps, keep_summary=keep)
            events = sum(1 for _ in open(work / f"writer-{keep}-{i}" / "events.jsonl"))
            per_event["with" if keep else "without"].append(1e6 * s / events)
    result["writer"] = {k: round(statistics.median(v), 2) for k, v in per_event.items() if v}
    result["writer"]["unit"] = "microseconds per event written (median of 3)"
    print("writer:", result["writer"], flush=True)

    for steps in args.steps if "opening" in args.only else []:
        path = work / f"run-{steps}"
        written = write_run(path, steps)
        entry = {"events_mb": round(os.path.getsize(path / "events.jsonl") / 2**20, 1),
                 "summary_mb": round(os.path.getsize(path / "events.summary.jsonl") / 2**20, 2),
                 "written_s": round(written, 1), "summary": open_run(app, path, limit_s=120)}
        if steps <= args.full_up_to:
            with moved_aside(path):
                entry["whole_file"] = open_run(app, path, limit_s=300)
        result["opening"][str(steps)] = entry
        print(steps, json.dumps(entry), flush=True)

    if "window" in args.only:
        result["window"] = window_opening(app, work, args.steps)
    if args.runs_page and "runs_page" in args.only:
        result["runs_page"] = runs_page(app, runs_folder(work / "runs", args.runs_page))
        print("runs page:", result["runs_page"], flush=True)
    if "dataset_page" in args.only:
        folder = image_folder(Path(args.images_dir) / str(args.images), args.images)
        if args.collector_on:
            import contextlib

            import app.pages.dataset_page as page_module

            page_module.without_collection_pauses = contextlib.nullcontext
        result["dataset_page"] = dataset_page(app, folder, work)
        result["dataset_page"]["collector"] = "on during the scan" if args.collector_on else "paused during the scan"
        print("dataset page:", result["dataset_page"], flush=True)
    if "long_run_commands" in args.only:
        result["long_run_commands"] = [long_run_commands(work, n) for n in args.long_steps]
        print("resume and export:", result["long_run_commands"], flush=True)
    if "audit" in args.only:
        result["audit"] = [audit(work, Path(args.images_dir), n) for n in args.audit_images]
        print("audit:", result["audit"], flush=True)
    if args.compare_runs and "compare" in args.only:
        paths = []
        for r in range(args.compare_runs):
            write_run(work / f"cmp{r}", 100_000, offset=r * 0.01)
            paths.append(str(work / f"cmp{r}"))
        result["compare"]["summary"] = compare(app, paths)
        print("compare:", result["compare"]["summary"], flush=True)
        from trainer.core.rundir import RunDir

        for p in paths:  # the runs as runs from before summaries: their summaries gone for good
            RunDir(p).summary.unlink()
        result["compare"]["without_summaries"] = compare_without_summaries(app, paths)
        print("compare, without summaries:", result["compare"]["without_summaries"], flush=True)
    Path(args.into).write_text(json.dumps(result))


if __name__ == "__main__":
    main()
