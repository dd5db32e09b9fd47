"""Compare on the Runs page with long runs (issue #50): 10 runs of 10^5 step events each (schema-true lines), read as
the page reads them (on its thread pool: `load_curves`) and drawn (the GUI thread's part: plotting and one paint);
how much the process's peak memory grew while reading.

python bench/compare_runs.py [--runs 10] [--steps 100000]   (offscreen)
"""

import argparse
import json
import os
import resource
import sys
import time

from common import REPO, machine, save_result, scratch

sys.path.insert(0, str(REPO))


def write_run(folder, steps: int, offset: float) -> None:
    folder.mkdir(parents=True)
    with open(folder / "events.jsonl", "w") as f:
        for step in range(1, steps + 1):
            f.write(json.dumps({"event": "step", "step": step, "loss": 2.0 / (1 + step / 1000) + offset, "lr": [0.1],
                                "grad_norm": 1.0, "images_per_s": 500.0, "epoch": step // 10_000}) + "\n")
            if step % 10_000 == 0:
                f.write(json.dumps({"event": "epoch", "epoch": step // 10_000, "val_acc": step / steps}) + "\n")


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--steps", type=int, default=100_000)
    args = parser.parse_args()
    os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
    work = scratch("td-compare-")
    paths = []
    for r in range(args.runs):
        write_run(work / f"run{r}", args.steps, r * 0.01)
        paths.append(str(work / f"run{r}"))
    from PySide6.QtWidgets import QApplication

    app = QApplication([])
    from app.pages.runs_page import RunsPage, load_curves

    page = RunsPage()
    page.resize(1200, 800)
    page.show()
    app.processEvents()
    peak_before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    start = time.perf_counter()
    curves = load_curves(paths)
    read = time.perf_counter() - start
    peak_reading = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024 - peak_before
    start = time.perf_counter()
    page.views.show_compare(curves)
    app.processEvents()
    draw = time.perf_counter() - start
    result = {"machine": machine(), "runs": args.runs, "steps": args.steps, "read_s": read, "draw_and_paint_s": draw,
              "points_drawn": sum(len(c["steps"]) for _, c in curves),
              "peak_memory_growth_reading_mb": peak_reading}
    save_result("compare_runs", result)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
