"""The plots of docs/benchmarks.md, drawn from the raw numbers the benchmarks keep in bench/results/*.json.

python bench/plots.py        -> docs/images/bench_*.png (offscreen; pyqtgraph, like the app)
"""

import json
import os
import statistics
import sys
from pathlib import Path

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import numpy as np  # noqa: E402
import pyqtgraph as pg  # noqa: E402
from pyqtgraph.exporters import ImageExporter  # noqa: E402
from PySide6.QtWidgets import QApplication  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results"
IMAGES = Path(__file__).resolve().parent.parent / "docs" / "images"
COLORS = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd"]


def new_plot(title: str, y_label: str) -> pg.PlotWidget:
    plot = pg.PlotWidget(title=title)
    plot.setBackground("w")
    plot.showGrid(y=True, alpha=0.25)
    plot.setLabel("left", y_label)
    plot.resize(900, 450)
    plot.addLegend(offset=(-10, 10))
    return plot


def grouped_bars(plot: pg.PlotWidget, groups: list[str], series: dict[str, list[list[float]]]) -> None:
    """One bar per (group, series) at the median, with a min–max whisker and the median written on top."""
    width = 0.8 / len(series)
    for k, (name, per_group) in enumerate(series.items()):
        xs = np.arange(len(groups)) + (k - (len(series) - 1) / 2) * width
        med = [statistics.median(v) for v in per_group]
        plot.addItem(pg.BarGraphItem(x=xs, height=med, width=width * 0.9, brush=COLORS[k % len(COLORS)],
                                     name=name if len(series) > 1 else None))
        lo = [m - min(v) for m, v in zip(med, per_group)]
        hi = [max(v) - m for m, v in zip(med, per_group)]
        plot.addItem(pg.ErrorBarItem(x=xs, y=np.array(med), top=np.array(hi), bottom=np.array(lo), beam=width * 0.3))
        for x, m in zip(xs, med):
            label = pg.TextItem(f"{m:.3g}", color="k", anchor=(0.5, 1.2))
            label.setPos(x, m)
            plot.addItem(label)
    plot.getAxis("bottom").setTicks([list(enumerate(groups))])


def target_line(plot: pg.PlotWidget, y: float, text: str) -> None:
    line = pg.InfiniteLine(pos=y, angle=0, pen=pg.mkPen("#d62728", width=1, style=pg.QtCore.Qt.PenStyle.DashLine),
                           label=text, labelOpts={"color": "#d62728", "position": 0.08, "anchors": [(0, 1), (0, 1)]})
    plot.addItem(line)


def save(plot: pg.PlotWidget, name: str) -> None:
    IMAGES.mkdir(parents=True, exist_ok=True)
    exporter = ImageExporter(plot.plotItem)
    exporter.parameters()["width"] = 900
    path = IMAGES / f"bench_{name}.png"
    exporter.export(str(path))
    print(path)


def throughput(r: dict) -> None:
    plot = new_plot(f"End to end, {r['args']['model']} batch {r['args']['batch']}, {r['args']['epochs']} epochs "
                    "(median, min–max)", "training images / s")
    groups = list(r["table"])
    names = {"a": "(a) plain PyTorch loop", "b": "(b) main.py train, whole process",
             "b_train": "(b) its training phase", "c": "(c) in-memory ceiling (loop only)"}
    grouped_bars(plot, groups, {label: [r["table"][g][k] for g in groups] for k, label in names.items()})
    save(plot, "throughput")


def overhead(r: dict) -> None:
    plot = new_plot("Cost of the live statistics, small_cnn 32 px (median, min–max)", "training images / s")
    names = {"a": "(a) plain loop", "b": "(b) stats off", "c": "(c) every 10 steps", "d": "(d) every step"}
    grouped_bars(plot, [""], {names[k]: [r["results"][k]] for k in "abcd"})
    save(plot, "overhead")


def amp_parity(r: dict) -> None:
    plot = new_plot(f"Final val accuracy, fp32 vs bf16, {r['args']['model']} {r['args']['epochs']} epochs, "
                    f"{r['args']['seeds']} seeds (median, min–max)", "accuracy")
    groups = list(r["results"])
    grouped_bars(plot, groups, {"fp32": [r["results"][g]["none"] for g in groups],
                                "bf16": [r["results"][g]["bf16"] for g in groups]})
    plot.setYRange(0, 1.1)
    save(plot, "amp_parity")


def gui(r: dict) -> None:
    plot = new_plot(f"GUI-thread gaps between 10 ms probe ticks, {r['steps']:,} steps × {r['layers']} layers",
                    "gap (ms)")
    gaps = np.array(r["gaps_ms"], dtype=float)
    t = np.cumsum(gaps) / 1000
    plot.plot(t, gaps, pen=pg.mkPen(COLORS[0], width=1), name="probe gap")
    target_line(plot, 50, "target: 50 ms")
    plot.setLabel("bottom", "seconds into the flood")
    save(plot, "gui")


def startup(r: dict) -> None:
    plot = new_plot("Start-up (median, min–max over repeats)", "seconds")
    after = r["after_start"]
    groups = ["window shown", "Start → first prepare event", "Start → run_start", "Start → first step plotted"]
    values = [r["shown_s"], [a["first_prepare"] for a in after], [a["run_start"] for a in after],
              [a["plotted"] for a in after]]
    grouped_bars(plot, groups, {"seconds": values})
    target_line(plot, 1.5, "window target: 1.5 s")
    save(plot, "startup")


def main():
    QApplication.instance() or QApplication([])
    for name, draw in (("throughput", throughput), ("overhead", overhead), ("amp_parity", amp_parity), ("gui", gui),
                       ("startup", startup)):
        path = RESULTS / f"{name}.json"
        if path.exists():
            draw(json.loads(path.read_text()))
        else:
            print(f"{path}: missing (run bench/{name}.py first)")


if __name__ == "__main__":
    main()
