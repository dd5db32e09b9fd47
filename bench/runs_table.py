"""The Runs page with many runs on disk: reading N run directories (the thread-pool part) and showing them in the
experiments table (the GUI-thread part: model reset, sort, filter, the scatter plot).

python bench/runs_table.py [--runs 500] [--repeats 5]   (offscreen)
"""

import argparse
import json
import os
import random
import statistics
import sys
import time
from pathlib import Path

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
from common import machine, save_result, scratch  # noqa: E402


def fake_runs(runs_dir: Path, n: int) -> None:
    """N finished runs as the trainer leaves them (config.yaml, status.json, a short events file)."""
    import yaml

    from trainer.core.config import RunConfig
    from trainer.core.rundir import RunDir

    rng = random.Random(0)
    for i in range(n):
        cfg = RunConfig.from_dict({"model": {"name": rng.choice(["resnet18", "resnet50", "small_cnn"])},
                                   "optimizer": {"lr": 10 ** rng.uniform(-4, -1)},
                                   "data": {"batch_size": rng.choice([32, 64, 128])}})
        run = RunDir(runs_dir / f"run-{i:04d}").create()
        run.config.write_text(yaml.safe_dump(cfg.to_dict()))
        acc = rng.uniform(0.3, 0.99)
        run.write_status(state="completed", best_acc=acc, val_acc=acc - 0.01, epoch=10, started=time.time() - 600,
                         ended=time.time(), queue={"sweep": f"sweep-{i % 5}", "values": {}})
        run.events.write_text("".join(json.dumps({"event": "step", "step": s, "loss": 1.0 / s}) + "\n"
                                      for s in range(1, 200)))


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=500)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    from PySide6.QtWidgets import QApplication

    from app.pages.runs_page import RunsPage, read_table
    from app.state.experiments import RowCache

    app = QApplication.instance() or QApplication([])
    runs_dir = scratch("td-runs-table-") / "runs"
    fake_runs(runs_dir, args.runs)
    page = RunsPage()
    page.resize(1280, 700)
    page.show()
    read, shown, filtered = [], [], []
    for _ in range(args.repeats):
        t0 = time.perf_counter()
        rows, params = read_table(runs_dir, RowCache())  # read cold each time
        read.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        page._show(rows, params)
        page.table.sortByColumn(page.model.columns.index("best val acc"), page.table.horizontalHeader().sortIndicatorOrder())
        app.processEvents()
        shown.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        page.filter.setText("resnet18 completed")
        app.processEvents()
        page.filter.setText("")
        app.processEvents()
        filtered.append(time.perf_counter() - t0)
    result = {"runs": args.runs, "repeats": args.repeats, "machine": machine(),
              "read_s": read, "show_s": shown, "filter_s": filtered,
              "read_median_s": statistics.median(read), "show_median_s": statistics.median(shown),
              "filter_median_s": statistics.median(filtered)}
    text = (f"{args.runs} runs, {args.repeats} repeats: reading them (thread pool) {result['read_median_s']:.2f} s, "
            f"showing them (GUI thread: table, sort, plots) {1000 * result['show_median_s']:.0f} ms, a filter typed "
            f"and cleared {1000 * result['filter_median_s']:.0f} ms (medians)")
    print(text)
    save_result("runs_table", {**result, "summary": text})
    return 0


if __name__ == "__main__":
    sys.exit(main())
