"""Runs page: the runs directory as a table of experiments (a column for each hyper-parameter that differs, best
and final metrics, duration, tags and notes; filter and sort), compare overlays, a metric against a hyper-parameter
and parallel coordinates of a sweep; open, resume, continue, export, open folder, delete."""

from __future__ import annotations

import math
import os
import re
import shutil
from pathlib import Path

import pyqtgraph as pg
from PySide6.QtCore import QAbstractTableModel, QModelIndex, QSortFilterProxyModel, Qt, QTimer, QUrl, Signal
from PySide6.QtGui import QColor, QDesktopServices
from PySide6.QtWidgets import (
    QComboBox,
    QHBoxLayout,
    QHeaderView,
    QLabel,
    QLineEdit,
    QMessageBox,
    QPushButton,
    QSplitter,
    QTableView,
    QTabWidget,
    QVBoxLayout,
    QWidget,
)

from app.dialogs.export_dialog import ExportDialog
from app.dialogs.run_dialogs import NotesDialog
from app.jobs.background import run_in_thread
from app.state.experiments import column_title, format_duration, summarize, varying_keys
from app.state.grad_views import elide_middle
from app.widgets.plots import COLORS, make_plot, with_log_toggle
from trainer.core.events import read_events
from trainer.core.rundir import RunDir, list_runs, state_text


def load_curves(paths: list[str]) -> list[tuple[str, dict]]:
    out = []
    for path in paths:
        events = read_events(Path(path) / "events.jsonl")
        steps = [(e["step"], e["loss"]) for e in events if e["event"] == "step" and e.get("loss") is not None]
        epochs = [(e["epoch"], e["val_acc"]) for e in events if e["event"] == "epoch"]
        out.append((Path(path).name, {"steps": steps, "epochs": epochs}))
    return out


# what matters first (the accuracies were off-screen at 1024 px behind the hyper-parameters), then what was run
BASE_COLUMNS = ["run", "status", "test acc", "best val acc", "last val acc", "model", "dataset"]
METRIC_COLUMNS = ["trained", "duration", "started", "tags"]
# the hyper-parameter first plotted against the metric, when it differs between the runs: what sweeps vary most
PREFERRED_X = ("optimizer.lr", "optimizer.weight_decay", "data.batch_size", "model.name")
LOG_AXIS_RATIO = 10  # a positive axis spanning this factor or more is drawn on a log scale (0.02..0.2 included)
FOLLOW_MS = 2000  # while the Runs page is shown, how often it looks for status changes
RESIZE_ROWS = 60  # rows measured when fitting the columns to their contents (all of 500 took 0.6 s)
PARALLEL_COLOURS = 8  # parallel-coordinates lines are drawn in this many colour bands, one plot item each
LEGEND_CHARS = 24  # a compared run's legend entry
LONGEST_CELL = 40  # characters; longer values (parameter groups) are elided in the middle, whole on hover
STATUS_COLORS = {"completed": "#2b7a2b", "failed": "#c9302c", "diverged": "#c9302c", "stopped": "#b8860b",
                 "running": "#1f77b4", "queued": "#777777"}
METRICS = {"test acc": "test-set accuracy (of best.pt, where a test set was evaluated)",
           "best val acc": "best validation accuracy", "last val acc": "final validation accuracy"}


class ExperimentModel(QAbstractTableModel):
    """The runs as rows; columns: name and status, each hyper-parameter that differs between them, metrics."""

    SORT_ROLE = Qt.ItemDataRole.UserRole + 1

    def __init__(self):
        super().__init__()
        self.rows: list[dict] = []
        self.params: list[str] = []
        self.columns: list[str] = BASE_COLUMNS + METRIC_COLUMNS

    def set_rows(self, rows: list[dict], params: list[str] | None = None) -> None:
        """Show `rows` (fresh dicts from summarize()); `params`, the differing keys, when already worked out off the
        GUI thread."""
        self.beginResetModel()
        self.rows = rows
        self.params = varying_keys(rows) if params is None else params
        # model.name has its own column (BASE_COLUMNS' "model"): not a second one when it differs between runs
        self.columns = BASE_COLUMNS + [p for p in self.params if p != "model.name"] + METRIC_COLUMNS
        self.endResetModel()

    def rowCount(self, parent=QModelIndex()) -> int:  # noqa: N802 - Qt's name
        return 0 if parent.isValid() else len(self.rows)

    def columnCount(self, parent=QModelIndex()) -> int:  # noqa: N802
        return 0 if parent.isValid() else len(self.columns)

    def value(self, row: dict, column: str):
        if column in self.params:
            return row["params"].get(column)
        if column == "tags":
            return ", ".join(row["tags"])
        return row.get(column)

    def data(self, index: QModelIndex, role=Qt.ItemDataRole.DisplayRole):
        if not index.isValid():
            return None
        row, column = self.rows[index.row()], self.columns[index.column()]
        value = self.value(row, column)
        if role == Qt.ItemDataRole.DisplayRole:
            if column in METRICS:
                return "—" if value is None else f"{100 * value:.1f}%"
            if column == "duration":
                return format_duration(value)
            if column == "status":
                return state_text(value, row.get("reason"))
            text = "—" if value is None else (f"{value:.4g}" if isinstance(value, float) else str(value))
            return elide_middle(text, LONGEST_CELL)
        if role == self.SORT_ROLE:  # compared by Qt itself (no Python per comparison): numbers, else text
            if column == "started":
                return row["started_ts"]
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                return float(value)
            return -1e300 if value is None and column in (*METRICS, "duration") else str(value)
        if role == Qt.ItemDataRole.ForegroundRole and column == "status":
            return QColor(STATUS_COLORS.get(value, "#222"))
        if role == Qt.ItemDataRole.ToolTipRole:
            return "\n".join(filter(None, [str(value) if column in self.params else "", row["notes"], row["path"]]))
        return None

    def headerData(self, section: int, orientation, role=Qt.ItemDataRole.DisplayRole):  # noqa: N802
        if orientation != Qt.Orientation.Horizontal or section >= len(self.columns):
            return None
        column = self.columns[section]
        if role == Qt.ItemDataRole.DisplayRole:
            return column_title(column) if column in self.params else column
        if role == Qt.ItemDataRole.ToolTipRole:
            return column
        return None


class RunFilter(QSortFilterProxyModel):
    """Rows whose text in any column contains every word typed (lr=0.01 matches the lr column's 0.01)."""

    def __init__(self):
        super().__init__()
        self.words: list[str] = []
        self.setSortRole(ExperimentModel.SORT_ROLE)

    def set_text(self, text: str) -> None:
        self.beginFilterChange()
        self.words = text.lower().split()
        self.endFilterChange(QSortFilterProxyModel.Direction.Rows)

    def filterAcceptsRow(self, source_row: int, parent) -> bool:  # noqa: N802
        if not self.words:
            return True
        m: ExperimentModel = self.sourceModel()
        row = m.rows[source_row]
        if "_filter_text" not in row:  # worked out once per row and table, on the first filter typed
            row["_filter_text"] = [f"{m.headerData(c, Qt.Orientation.Horizontal) or ''}="
                                   f"{m.data(m.index(source_row, c)) or ''}".lower() for c in range(m.columnCount())]
            row["_filter_text"].append(row["notes"].lower())
        return all(any(w in cell for cell in row["_filter_text"]) for w in self.words)


class RunsPage(QWidget):
    openRequested = Signal(str)
    resumeRequested = Signal(str)
    extendRequested = Signal(str)

    def __init__(self, parent: QWidget | None = None):
        super().__init__(parent)
        self.runs_dir: Path | None = None
        self._signature: tuple = ()
        self.scatter_log_x = False  # whether the metric-vs-hyper-parameter plot's x axis is log10 of the values
        self._checking = False
        self._follow = QTimer(self)
        self._follow.setInterval(FOLLOW_MS)
        self._follow.timeout.connect(self._check_changes)
        self.model = ExperimentModel()
        self.proxy = RunFilter()
        self.proxy.setSourceModel(self.model)
        self.table = QTableView()
        self.table.setObjectName("runsTable")
        self.table.setModel(self.proxy)
        self.table.setSortingEnabled(True)
        self.table.sortByColumn(BASE_COLUMNS.index("best val acc"), Qt.SortOrder.DescendingOrder)
        header = self.table.horizontalHeader()
        header.setSectionResizeMode(QHeaderView.ResizeMode.Interactive)
        header.setStretchLastSection(True)
        header.setResizeContentsPrecision(RESIZE_ROWS)
        self.table.setSelectionBehavior(QTableView.SelectionBehavior.SelectRows)
        self.table.setEditTriggers(QTableView.EditTrigger.NoEditTriggers)
        self.table.verticalHeader().hide()
        self.table.doubleClicked.connect(lambda _: self._open())
        self.filter = QLineEdit()
        self.filter.setObjectName("runsFilter")
        self.filter.setPlaceholderText("filter: words or column=value (resnet18  lr=0.01  completed  baseline)")
        self.filter.textChanged.connect(self.proxy.set_text)

        buttons = QHBoxLayout()  # under the filter, not beside it: the row fits a laptop screen
        for text, slot in (("Refresh", self.refresh), ("Open", self._open), ("Compare selected", self._compare),
                           ("Resume", self._resume), ("Continue…", self._extend), ("Notes…", self._notes),
                           ("Export…", self._export), ("Open folder", self._open_folder), ("Delete", self._delete)):
            b = QPushButton(text)
            b.setObjectName(f"runs:{text}")
            b.clicked.connect(slot)
            buttons.addWidget(b)

        self._build_views()

        top = QWidget()
        tl = QVBoxLayout(top)
        tl.setContentsMargins(0, 0, 0, 0)
        tl.addWidget(self.filter)
        tl.addLayout(buttons)
        tl.addWidget(self.table)
        split = QSplitter(Qt.Orientation.Vertical)
        split.addWidget(top)
        split.addWidget(self.views)
        split.setSizes([360, 340])
        layout = QVBoxLayout(self)
        layout.addWidget(split)

    def _build_views(self) -> None:
        """The views of the runs shown: their curves compared, a metric against a hyper-parameter, a sweep's parallel
        coordinates."""
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
        self.views = QTabWidget()
        self.views.addTab(compare, "Compare curves")
        self.views.addTab(scatter, "Metric vs hyper-parameter")
        self.views.addTab(parallel, "Parallel coordinates")

    @property
    def rows(self) -> list[dict]:
        return self.model.rows

    def set_runs_dir(self, runs_dir: Path) -> None:
        self.runs_dir = Path(runs_dir)
        self.refresh()

    def showEvent(self, event) -> None:  # noqa: N802 - Qt's name
        self._follow.start()  # while shown, the table follows status changes by itself (a queued run starting)
        super().showEvent(event)

    def hideEvent(self, event) -> None:  # noqa: N802
        self._follow.stop()
        super().hideEvent(event)

    def _check_changes(self) -> None:
        """Refresh when any run's status.json changed (a cheap stat of each, off the GUI thread)."""
        if self.runs_dir is None or self._checking:
            return
        self._checking = True
        runs_dir = self.runs_dir

        def changed(signature) -> None:
            self._checking = False
            if signature != self._signature:
                self._signature = signature
                self.refresh()

        def failed(_error) -> None:
            self._checking = False

        run_in_thread(lambda: status_signature(runs_dir), changed, failed, owner=self)

    def refresh(self) -> None:
        if self.runs_dir is None:
            return
        runs_dir = self.runs_dir
        run_in_thread(lambda: read_table(runs_dir), lambda table: self._show(*table), owner=self)

    def _show(self, rows: list[dict], params: list[str] | None = None) -> None:
        columns = list(self.model.columns)
        self.model.set_rows(rows, params)
        if self.model.columns != columns:  # fitting columns to their contents is the slow part: only when they change
            self.table.resizeColumnsToContents()
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
        sweeps = sorted({r["sweep"] for r in rows if r["sweep"]})
        self.sweep_choice.blockSignals(True)
        self.sweep_choice.clear()
        self.sweep_choice.addItems(sweeps)
        if sweep in sweeps:
            self.sweep_choice.setCurrentText(sweep)
        self.sweep_choice.blockSignals(False)
        self.draw_scatter()
        self.draw_parallel()

    def shown_rows(self) -> list[dict]:
        """The runs the filter lets through, in the table's order."""
        return [self.model.rows[self.proxy.mapToSource(self.proxy.index(i, 0)).row()]
                for i in range(self.proxy.rowCount())]

    def selected(self) -> list[str]:
        rows = sorted({self.proxy.mapToSource(i).row() for i in self.table.selectionModel().selectedRows()})
        return [self.model.rows[r]["path"] for r in rows if r < len(self.model.rows)]

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

    def _open(self) -> None:
        for path in self.selected()[:1]:
            self.openRequested.emit(path)

    def _resume(self) -> None:
        for path in self.selected()[:1]:
            self.resumeRequested.emit(path)

    def _extend(self) -> None:
        for path in self.selected()[:1]:
            self.extendRequested.emit(path)

    def _notes(self) -> None:
        for path in self.selected()[:1]:
            dialog = NotesDialog(RunDir(path), self)
            dialog.accepted.connect(self.refresh)
            dialog.open()

    def _compare(self) -> None:
        paths = self.selected()
        if paths:
            run_in_thread(lambda: load_curves(paths), self._show_compare, owner=self)

    def _show_compare(self, curves: list) -> None:
        for plot in (self.compare_loss, self.compare_acc):
            plot.clear()
            plot.addLegend(offset=(-10, 10))
            plot.setToolTip(self.compare_tooltip([name for name, _ in curves]))
        for i, (name, data) in enumerate(curves):
            name = self.legend_label(name)
            pen = pg.mkPen(COLORS[i % len(COLORS)], width=2)
            if data["steps"]:
                xs, ys = zip(*data["steps"])
                self.compare_loss.plot(xs, ys, pen=pen, name=name)
            if data["epochs"]:
                xs, ys = zip(*data["epochs"])
                self.compare_acc.plot(xs, ys, pen=pen, name=name, symbol="o", symbolSize=5)

    def legend_label(self, run_name: str) -> str:
        """A compared run's legend: its short name (its start time without the day, at most LEGEND_CHARS); what differs
        between the runs shown goes into the plots' tooltip (`compare_tooltip`), where it has room."""
        return elide_middle(re.sub(r"^\d{8}-(\d\d)(\d\d)(\d\d)-", r"\1:\2:\3 ", run_name), LEGEND_CHARS)

    def compare_tooltip(self, run_names: list[str]) -> str:
        """One line per compared run: its legend and the hyper-parameters that differ between the runs shown."""
        lines = []
        for name in run_names:
            row = next((r for r in self.model.rows if r["run"] == name), None)
            values = ", ".join(f"{column_title(k)}={row['params'].get(k)}" for k in self.model.params) if row else ""
            lines.append(f"{self.legend_label(name)}: {values or name}")
        return "\n".join(lines)

    def _export(self) -> None:
        for path in self.selected()[:1]:
            ExportDialog(path, self).open()

    def _open_folder(self) -> None:
        for path in self.selected()[:1]:
            QDesktopServices.openUrl(QUrl.fromLocalFile(path))

    def _delete(self) -> None:
        paths = self.selected()
        running = [r["run"] for r in self.model.rows if r["path"] in paths and r["status"] in ("running", "starting")]
        if running:
            QMessageBox.warning(self, "Delete runs", f"Stop {', '.join(running)} before deleting it.")
            return
        if not paths or QMessageBox.question(
                self, "Delete runs", f"Delete {len(paths)} run(s) and their checkpoints from disk?") \
                != QMessageBox.StandardButton.Yes:
            return
        run_in_thread(lambda: [shutil.rmtree(p, ignore_errors=True) for p in paths], lambda _: self.refresh(), owner=self)


def status_signature(runs_dir: Path) -> tuple:
    """(run, status.json mtime) of every run directory: what changes when any run changes state or progresses."""
    out = []
    try:
        entries = sorted(os.scandir(runs_dir), key=lambda e: e.name)
        remote = os.path.join(runs_dir, "remote")
        if os.path.isdir(remote):  # the mirrors of runs on hosts (trainer/remote/mirror.py)
            entries += sorted((e for host in os.scandir(remote) if host.is_dir() for e in os.scandir(host.path)),
                              key=lambda e: e.path)
    except OSError:
        return ()
    for entry in entries:
        try:
            out.append((entry.path, os.stat(os.path.join(entry.path, "status.json")).st_mtime_ns))
        except OSError:
            continue
    return tuple(out)


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


def read_table(runs_dir: Path) -> tuple[list[dict], list[str]]:
    """Every run's row and the hyper-parameters that differ (on the thread pool: the GUI thread only shows them)."""
    rows = [summarize(r) for r in list_runs(runs_dir, remote=True)]
    return rows, varying_keys(rows)


def axis_values(values: list) -> tuple[list[float | None], dict[float, str]]:
    """Numbers as they are; anything else (model names, switches) as evenly spaced categories, with their labels."""
    if all(isinstance(v, (int, float)) and not isinstance(v, bool) or v is None for v in values):
        return [None if v is None else float(v) for v in values], {}
    labels = sorted({str(v) for v in values})
    index = {label: float(i) for i, label in enumerate(labels)}
    return [index[str(v)] for v in values], {i: label for label, i in index.items()}
