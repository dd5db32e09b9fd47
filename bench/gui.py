"""The GUI under load: a synthetic trainer floods a run directory with events while the real RunModel and
Dashboard (offscreen) ingest and draw them.

Measures the sustained ingest rate, the longest GUI-thread stall (a 10 ms probe timer's largest gap), the redraw
time of each plot at 1,000,000 points, and memory growth.

python bench/gui.py [--steps 300000] [--layers 150] [--rate 5000]
"""

import argparse
import json
import os
import random
import subprocess
import sys
import time
from pathlib import Path

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import psutil  # noqa: E402
from common import machine, save_result, scratch  # noqa: E402

WRITER = r"""
import json, math, random, sys, time
path, steps, layers, rate = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4])
names = [f"block{i // 2}.conv.{'weight' if i % 2 == 0 else 'bias'}" for i in range(layers)]
with open(path, "a") as f:
    f.write(json.dumps({"event": "run_start", "v": 1, "time": time.time(), "config": {"train": {"epochs": 100}},
                        "classes": ["a", "b"], "train_size": 1, "val_size": 1, "world_size": 1, "device": "cpu",
                        "cache": "memory", "trainable": 1, "param_groups": [{"name": "default"}, {"name": "fc"}],
                        "layers": names}) + "\n")
    start = time.time()
    for step in range(1, steps + 1):
        loss = 2 * math.exp(-step / steps * 5) + random.random() * 0.1
        f.write(json.dumps({"event": "step", "v": 1, "time": time.time(), "step": step, "epoch": 1 + step * 100 // steps,
                            "batch": step, "batches": steps, "loss": loss, "lr": [0.1, 0.01],
                            "images_per_s": 1000.0, "grad_norm": 1.0 + random.random()}) + "\n")
        if step % 10 == 0:
            f.write(json.dumps({"event": "grad_stats", "v": 1, "time": time.time(), "step": step,
                                "grad_norm": [random.random() for _ in names], "weight_norm": [1.0] * layers,
                                "update_ratio": [1e-3] * layers, "zero_frac": [0.0] * layers}) + "\n")
        if step % 1000 == 0:
            f.flush()
            ahead = step / rate - (time.time() - start)
            if ahead > 0:
                time.sleep(ahead)
    f.write(json.dumps({"event": "run_end", "v": 1, "time": time.time(), "status": "completed", "message": ""}) + "\n")
"""


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=300_000)
    parser.add_argument("--layers", type=int, default=150)
    parser.add_argument("--rate", type=float, default=5000, help="step events per second the writer aims for")
    args = parser.parse_args()
    from PySide6.QtCore import QElapsedTimer, QTimer
    from PySide6.QtWidgets import QApplication

    from app.jobs.run_model import RunModel
    from app.main import quiet_garbage_collector
    from app.training.dashboard import Dashboard
    from trainer.core.rundir import RunDir

    app = QApplication([])
    run = RunDir(scratch("td-gui-")).create()
    run.write_status(state="running", pid=os.getpid())
    dashboard = Dashboard()
    dashboard.resize(1280, 800)
    dashboard.show()
    app.processEvents()  # the first paint of the whole dashboard happens before the flood, as in the app
    quiet_garbage_collector()  # as the app does once its window is up
    model = RunModel(run)
    dashboard.set_model(model)
    proc = psutil.Process()
    rss_start = proc.memory_info().rss
    writer = subprocess.Popen([sys.executable, "-c", WRITER, str(run.events), str(args.steps), str(args.layers),
                               str(args.rate)])
    gaps, clock, t0 = [], QElapsedTimer(), time.perf_counter()
    clock.start()
    probe = QTimer()
    probe.setInterval(10)
    probe.timeout.connect(lambda: gaps.append(clock.restart()))
    probe.start()
    model.watch()
    done = {}

    def finished(state, message):
        done["t"] = time.perf_counter() - t0
        QTimer.singleShot(300, app.quit)

    model.finished.connect(finished)
    app.exec()
    writer.wait()
    probe.stop()
    rss_end = proc.memory_info().rss
    events = args.steps + args.steps // 10  # step + grad_stats events written and ingested
    ingested = {"step_points_kept": len(model.step_loss), "heatmap_columns_kept": len(model.layer_grad)}

    # redraw time of each plot with 1,000,000 points
    from app.state.buffers import Series, Smoothed

    big = Series()  # as the app keeps it: long histories decimated to at most Series.max_points
    for i in range(1_000_000):
        big.append(i, 1.0 / (1 + i) + random.random() * 1e-3)
    model.step_loss = model.images_per_s = model.grad_norm = big
    model.lr = [big, big]
    dashboard.curves.smoother = Smoothed(big, dashboard.curves.smoother.weight)
    dashboard.curves._versions.clear()
    t = time.perf_counter()
    dashboard.redraw()
    set_data_ms = (time.perf_counter() - t) * 1000
    paint = {}
    curves = dashboard.curves
    for name, plot in (("loss", curves.loss_plot), ("lr", curves.lr_plot), ("throughput", curves.speed_plot),
                       ("grad norm", curves.norm_plot)):
        t = time.perf_counter()
        plot.grab()
        paint[name] = (time.perf_counter() - t) * 1000
    result = {"steps": args.steps, "layers": args.layers, "ingest_s": done.get("t"),
              **ingested, "events_per_s": events / done["t"] if done else None,
              "max_stall_ms": max(gaps[3:]) if len(gaps) > 3 else None,
              "p99_gap_ms": sorted(gaps)[int(0.99 * len(gaps))] if gaps else None,
              "rss_growth_mb": (rss_end - rss_start) / 2**20, "setdata_1M_ms": set_data_ms,
              "paint_1M_ms": paint, "points_kept_of_1M": len(big)}
    print(json.dumps(result))
    print(f"machine: {machine()}")
    save_result("gui", {**result, "gaps_ms": gaps[3:], "machine": machine()})
    dashboard.stop_updates()
    model.close()


if __name__ == "__main__":
    main()
