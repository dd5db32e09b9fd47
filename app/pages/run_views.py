"""The Runs page's views of the runs shown: their curves compared, a metric against a hyper-parameter, a sweep's
parallel coordinates. Built when the Runs page is first shown (its pyqtgraph plots are not part of the start-up)."""

from __future__ import annotations

import math
import re
from collections.abc import Callable

import pyqtgraph as pg
from PySide6.QtCore import QTimer
from PySide6.QtWidgets import QComboBox, QHBoxLayout, QLabel, QSplitter, QTabWidget, QVBoxLayout, QWidget

from app.state.experiments import METRICS, column_title, varying_keys
from app.state.grad_views import elide_middle
from app.widgets.plots import COLORS, make_plot, retitle, with_log_toggle

# the hyper-parameter first plotted against the metric, when it differs between the runs: what sweeps vary most
PREFERRED_X = ("optimizer.lr", "optimizer.weight_decay", "data.batch_size", "model.name")
LOG_AXIS_RATIO = 10  # a positive axis spanning this factor or more is drawn on a log scale (0.02..0.2 included)
PARALLEL_COLOURS = 8  # parallel-coordinates lines are drawn in this many colour bands, one plot item each
LEGEND_CHARS = 24  # a compared run's legend entry


class RunViews(QTabWidget):
    def __init__(self, model, shown_rows: Callable[[], list[dict]]):
        super().__init__()
        self.setObjectName("runViews")
        self.model = model  # the Runs page's ExperimentModel: rows and the hyper-parameters that differ
        self.compare_pending: list = []  # compared runs not drawn yet (show_compare draws one a turn)
        self.shown_rows = shown_rows  # the rows the filter lets through, in the table's order
        self.scatter_log_x = False  # whether the metric-vs-hyper-parameter plot's x axis is log10 of the values
        self.compare_loss = make_plot("Training loss", "loss")
        self.compare_acc = make_plot("Validation accuracy", "accuracy", "epoch")
        compare = QSplitter()
        compare.addWidget(with_log_toggle(self.compare_loss))
        compare.addWidget(with_log_toggle(self.compare_acc))
        self.scatter_x = QComboBox()
        self.scatter_x.setObjectName("scatterX")
        self.scatter_y = QComboBox()
        self.scatter_y.setObjectName("scatterY")
        self.scatter_y.addItems(list(METRICS))
        self.scatter_y.setCurrentText("best val acc")  # every run has one; a test set only some
        self.scatter_plot = make_plot("Metric against a hyper-parameter (runs shown)", "accuracy", "")
        self.scatter_x.currentTextChanged.connect(lambda _: self.draw_scatter())
        self.scatter_y.currentTextChanged.connect(lambda _: self.draw_scatter())
        scatter = with_controls(self.scatter_plot, "x", self.scatter_x, "y", self.scatter_y)
        self.sweep_choice = QComboBox()
        self.sweep_choice.setObjectName("parallelSweep")
        self.sweep_choice.currentTextChanged.connect(lambda _: self.draw_parallel())
        self.parallel_plot = make_plot("Parallel coordinates (each line: one run; colour: best accuracy)", "", "")
        self.parallel_plot.getAxis("left").setTicks([[(0, "low"), (1, "high")]])
        parallel = with_controls(self.parallel_plot, "Sweep", self.sweep_choice)
        self.addTab(compare, "Compare curves")
        self.addTab(scatter, "Metric vs hyper-parameter")
        self.addTab(parallel, "Parallel coordinates")

    def refresh(self) -> None:
        """The hyper-parameter and sweep choices for the runs now listed (the chosen ones kept where they still
        exist), then both plots drawn again."""
        x = self.scatter_x.currentText()
        self.scatter_x.blockSignals(True)
        self.scatter_x.clear()
        self.scatter_x.addItems(self.model.params)
        if x not in self.model.params:  # first shown: the swept key (the learning rate), not the first column
            x = next((k for k in PREFERRED_X if k in self.model.params), x)
        if x in self.model.params:
            self.scatter_x.setCurrentText(x)
        self.scatter_x.blockSignals(False)
        sweep = self.sweep_choice.currentText()
        sweeps = sorted({r["sweep"] for r in self.model.rows if r["sweep"]})
        self.sweep_choice.blockSignals(True)
        self.sweep_choice.clear()
        self.sweep_choice.addItems(sweeps)
        if sweep in sweeps:
            self.sweep_choice.setCurrentText(sweep)
        self.sweep_choice.blockSignals(False)
        self.draw_scatter()
        self.draw_parallel()

    def draw_scatter(self) -> None:
        """The chosen metric against the chosen hyper-parameter, one point per run shown (text values spread out
        as categories)."""
        plot, key, metric = self.scatter_plot, self.scatter_x.currentText(), self.scatter_y.currentText()
        plot.clear()
        points = [(r["params"].get(key), r[metric], r["run"]) for r in self.shown_rows() if r.get(metric) is not None]
        if not key or not points:
            return
        xs, categories = axis_values([p[0] for p in points])
        plot.setLabel("left", METRICS[metric])
        self.scatter_log_x = not categories and min(xs) > 0 and max(xs) / min(xs) >= LOG_AXIS_RATIO
        if categories:
            ticks = [list(categories.items())]
        elif self.scatter_log_x:
            # log10 of the values, plotted as they are (a scatter item ignores the plot's log mode), each tick
            # labelled with a run's own value (a range of a decade or two has no powers of ten to label)
            xs = [math.log10(v) for v in xs]
            ticks = [[(x, f"{10 ** x:g}") for x in sorted(set(xs))]]
        else:
            ticks = None
        plot.getAxis("bottom").setTicks(ticks)
        plot.setLabel("bottom", key + (" (log scale)" if self.scatter_log_x else ""))
        plot.addItem(pg.ScatterPlotItem(x=xs, y=[p[1] for p in points], size=9, brush=COLORS[0],
                                        data=[p[2] for p in points], hoverable=True, tip=lambda x, y, data: data))

    def draw_parallel(self) -> None:
        """Each run of the chosen sweep as a line across its varying hyper-parameters and the metric, each axis
        scaled from its lowest to its highest value; colour from low (light) to high (dark) best accuracy."""
        plot = self.parallel_plot
        plot.clear()
        rows = [r for r in self.model.rows if r["sweep"] and r["sweep"] == self.sweep_choice.currentText()]
        keys = varying_keys(rows)
        if not rows or not keys:
            return
        axes = keys + ["best val acc"]
        columns = [axis_values([r["params"].get(k) if k in r["params"] else r.get(k) for r in rows])[0] for k in axes]
        scaled = []
        for values in columns:
            finite = [v for v in values if v is not None]
            low, high = (min(finite), max(finite)) if finite else (0, 1)
            logscale = low > 0 and high / low >= 100
            f = (lambda v: math.log10(v)) if logscale else (lambda v: v)
            lo, hi = f(low), f(high)
            scaled.append([0.5 if v is None or hi == lo else (f(v) - lo) / (hi - lo) for v in values])
        plot.getAxis("bottom").setTicks([[(i, column_title(k) if k in keys else k) for i, k in enumerate(axes)]])
        accs = [r["best val acc"] or 0 for r in rows]
        lo, hi = min(accs), max(accs)
        cmap = pg.colormap.get("CET-L12")
        xs = list(range(len(axes))) + [float("nan")]
        bands: dict[int, tuple[list, list]] = {}
        for i, acc in enumerate(accs):  # one item per colour band, lines separated by NaN: fast with 500 runs
            band = 0 if hi == lo else min(PARALLEL_COLOURS - 1, int((acc - lo) / (hi - lo) * PARALLEL_COLOURS))
            bx, by = bands.setdefault(band, ([], []))
            bx.extend(xs)
            by.extend([s[i] for s in scaled] + [float("nan")])
        for band, (bx, by) in sorted(bands.items()):
            colour = cmap.map(0.25 + 0.75 * (band + 0.5) / PARALLEL_COLOURS)
            plot.plot(bx, by, pen=pg.mkPen(colour, width=2), connect="finite")

    def compare_note(self, text: str) -> None:
        """What Compare is doing before it can draw (its loss plot's note)."""
        retitle(self.compare_loss, text)

    def show_compare(self, curves: list) -> None:
        """The selected runs' loss and validation-accuracy curves overlaid, one colour each: drawn one run an
        event-loop turn (ten runs at once held the GUI thread for 0.15 s); a newer Compare replaces one still drawing."""
        retitle(self.compare_loss, "")
        for plot in (self.compare_loss, self.compare_acc):
            plot.clear()
            plot.addLegend(offset=(-10, 10))
            plot.setToolTip(self.compare_tooltip([name for name, _ in curves]))
        self.compare_pending = list(enumerate(curves))
        self._draw_next_compared()

    def _draw_next_compared(self) -> None:
        if not self.compare_pending:
            return
        i, (name, data) = self.compare_pending.pop(0)
        name = legend_label(name)
        pen = pg.mkPen(COLORS[i % len(COLORS)], width=2)
        if data["steps"]:
            xs, ys = zip(*data["steps"])
            self.compare_loss.plot(xs, ys, pen=pen, name=name)
        if data["epochs"]:
            xs, ys = zip(*data["epochs"])
            self.compare_acc.plot(xs, ys, pen=pen, name=name, symbol="o", symbolSize=5, symbolPen=pen,
                                  symbolBrush=COLORS[i % len(COLORS)])  # each run's points its colour too
        if self.compare_pending:
            QTimer.singleShot(1, self._draw_next_compared)  # a timer: paints and input go between

    def compare_tooltip(self, run_names: list[str]) -> str:
        """One line per compared run: its legend and the hyper-parameters that differ between the runs shown."""
        lines = []
        for name in run_names:
            row = next((r for r in self.model.rows if r["run"] == name), None)
            values = ", ".join(f"{column_title(k)}={row['params'].get(k)}" for k in self.model.params) if row else ""
            lines.append(f"{legend_label(name)}: {values or name}")
        return "\n".join(lines)


def legend_label(run_name: str) -> str:
    """A compared run's legend: its short name (its start time without the day, at most LEGEND_CHARS); what differs
    between the runs shown goes into the plots' tooltip (`compare_tooltip`), where it has room."""
    return elide_middle(re.sub(r"^\d{8}-(\d\d)(\d\d)(\d\d)-", r"\1:\2:\3 ", run_name), LEGEND_CHARS)



def with_controls(plot: pg.PlotWidget, *labelled) -> QWidget:
    """The plot under a row of labelled choices: with_controls(plot, "x", combo_x, "y", combo_y)."""
    panel = QWidget()
    layout = QVBoxLayout(panel)
    layout.setContentsMargins(0, 0, 0, 0)
    row = QHBoxLayout()
    for label, widget in zip(labelled[::2], labelled[1::2]):
        row.addWidget(QLabel(label))
        row.addWidget(widget, 1)
    layout.addLayout(row)
    layout.addWidget(plot, 1)
    return panel


def axis_values(values: list) -> tuple[list[float | None], dict[float, str]]:
    """Numbers as they are; anything else (model names, switches) as evenly spaced categories, with their labels."""
    if all(isinstance(v, (int, float)) and not isinstance(v, bool) or v is None for v in values):
        return [None if v is None else float(v) for v in values], {}
    labels = sorted({str(v) for v in values})
    index = {label: float(i) for i, label in enumerate(labels)}
    return [index[str(v)] for v in values], {i: label for label, i in index.items()}
