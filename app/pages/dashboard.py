"""Live dashboard of one run: curves, gradient heatmap and table, results, system panel and log.

Views hold no training state: they read the RunModel's numpy buffers on a 10 Hz timer and redraw only
what changed (curves created once, `setData`, peak downsampling, clip to view).
"""

from __future__ import annotations

import csv
import math
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pyqtgraph as pg
from PySide6.QtCore import Qt, QTimer
from PySide6.QtGui import QFont
from PySide6.QtWidgets import (
    QCheckBox,
    QComboBox,
    QFileDialog,
    QGridLayout,
    QHBoxLayout,
    QHeaderView,
    QLabel,
    QListWidget,
    QPlainTextEdit,
    QProgressBar,
    QPushButton,
    QSlider,
    QSplitter,
    QTableWidget,
    QTableWidgetItem,
    QTabWidget,
    QVBoxLayout,
    QWidget,
)

from app.buffers import Series, Smoothed
from app.run_model import RunModel

COLORS = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f"]
REDRAW_MS = 100
# Step plots redrawn per timer tick, the longest-waiting first: repainting one plot of tens of thousands of
# points costs ~10 ms, so redrawing all four at once under a flood of events would stall the GUI thread.
STEP_PLOTS_PER_TICK = 1
# While the run model is catching up on unread events, redraw only every this many ticks: painting (axes with
# their text, curves) otherwise takes most of the GUI thread and the backlog drains slowly.
CATCHING_UP_EVERY = 5
GRADIENTS_TAB = 1


def make_plot(title: str, y_label: str, x_label: str = "step") -> pg.PlotWidget:
    plot = pg.PlotWidget(title=title)
    plot.setBackground("w")
    plot.showGrid(x=True, y=True, alpha=0.25)
    plot.setLabel("left", y_label)
    plot.setLabel("bottom", x_label)
    # Fixed axis geometry: with auto SI prefixes and text-fitted axis widths, a growing step count made the axis
    # re-layout the plot, which changed the ticks, which changed the layout again: an endless repaint loop.
    for side in ("bottom", "left"):
        plot.getAxis(side).enableAutoSIPrefix(False)
    plot.getAxis("left").setWidth(64)
    plot.addLegend(offset=(-10, 10))
    return plot


def image_plot(title: str, colormap: str, x_label: str = "", y_label: str = "") -> tuple[pg.PlotWidget, pg.ImageItem]:
    """A plot holding one colour-mapped image (heatmaps, histograms over time, confusion matrix); row 0 on top."""
    plot = pg.PlotWidget(title=title)
    plot.setBackground("w")
    image = pg.ImageItem()
    image.setColorMap(pg.colormap.get(colormap))
    plot.addItem(image)
    if x_label:
        plot.setLabel("bottom", x_label)
    if y_label:
        plot.setLabel("left", y_label)
    return plot, image


def curve(plot: pg.PlotWidget, color: str, name: str | None = None, width: float = 2, symbol: str | None = None):
    return plot.plot([], [], pen=pg.mkPen(color, width=width), name=name, symbol=symbol, symbolSize=6,
                     symbolBrush=color if symbol else None)


def show(item, series: Series) -> None:
    """Draw `series` in `item`, thinned to what a plot can show (`Series.display_index`)."""
    shown = series.display_index()
    item.setData(series.x[shown], series.y[shown])


class NumericItem(QTableWidgetItem):
    """Sorts by value, not text."""

    def __lt__(self, other):
        a, b = self.data(Qt.ItemDataRole.UserRole), other.data(Qt.ItemDataRole.UserRole)
        if isinstance(a, (int, float)) and isinstance(b, (int, float)):
            return a < b
        return super().__lt__(other)


class Dashboard(QWidget):
    def __init__(self, parent: QWidget | None = None):
        super().__init__(parent)
        self.model: RunModel | None = None
        self._versions: dict[str, int] = {}

        # ---- curves tab ----
        self.loss_plot = make_plot("Training loss", "loss")
        self.raw_loss = curve(self.loss_plot, "#9ecae1", "raw", width=1)
        self.smooth_loss = curve(self.loss_plot, COLORS[0], "smoothed")
        self.epoch_plot = make_plot("Loss per epoch", "loss", "epoch")
        self.train_epoch = curve(self.epoch_plot, COLORS[0], "train", symbol="o")
        self.val_epoch = curve(self.epoch_plot, COLORS[1], "validation", symbol="o")
        self.acc_plot = make_plot("Validation accuracy", "accuracy", "epoch")
        self.acc_curve = curve(self.acc_plot, COLORS[2], "val acc", symbol="o")
        self.lr_plot = make_plot("Learning rate per group", "lr")
        self.lr_curves: list = []
        self.speed_plot = make_plot("Throughput", "images/s")
        self.speed_curve = curve(self.speed_plot, COLORS[4])
        self.norm_plot = make_plot("Gradient norm (global)", "L2 norm, before clipping")
        self.norm_curve = curve(self.norm_plot, COLORS[3])
        self.step_plots = [self.loss_plot, self.lr_plot, self.speed_plot, self.norm_plot]
        self._warning_lines: list = []

        self.smoothing = QSlider(Qt.Orientation.Horizontal)
        self.smoothing.setObjectName("smoothing")
        self.smoothing.setRange(0, 99)
        self.smoothing.setValue(60)
        self.smoothing.setMaximumWidth(160)
        self.smoothing_label = QLabel("0.60")
        self.smoothing.valueChanged.connect(self._smoothing_changed)
        self.log_scale = QCheckBox("log scale")
        self.log_scale.setObjectName("logScale")
        self.log_scale.toggled.connect(self._log_scale_changed)
        export_png = QPushButton("Export PNG…")
        export_png.clicked.connect(self.export_png)
        export_csv = QPushButton("Export CSV…")
        export_csv.clicked.connect(self.export_csv)
        controls = QHBoxLayout()
        controls.addWidget(QLabel("Smoothing"))
        controls.addWidget(self.smoothing)
        controls.addWidget(self.smoothing_label)
        controls.addWidget(self.log_scale)
        controls.addStretch(1)
        controls.addWidget(export_png)
        controls.addWidget(export_csv)

        self.curves = QWidget()
        grid = QGridLayout(self.curves)
        grid.setContentsMargins(0, 0, 0, 0)
        for i, plot in enumerate([self.loss_plot, self.epoch_plot, self.acc_plot, self.lr_plot, self.speed_plot,
                                  self.norm_plot]):
            grid.addWidget(plot, i // 3, i % 3)
        curves_tab = QWidget()
        cl = QVBoxLayout(curves_tab)
        cl.addLayout(controls)
        cl.addWidget(self.curves, 1)

        # ---- gradients tab ----
        self.heat_plot, self.heat_image = image_plot("Per-layer gradient norm (log10), layers × logged steps",
                                                     "viridis", "logged step", "layer")
        self.heat_plot.getViewBox().invertY(True)
        self.heat_hover = QLabel("hover over the heatmap for layer and value")
        self.heat_hover.setObjectName("heatHover")
        self.heat_plot.scene().sigMouseMoved.connect(self._heat_hover)
        self.layer_table = QTableWidget(0, 5)
        self.layer_table.setObjectName("layerTable")
        self.layer_table.setHorizontalHeaderLabels(["layer", "grad norm", "weight norm", "update/weight", "zero grads"])
        self.layer_table.horizontalHeader().setSectionResizeMode(0, QHeaderView.ResizeMode.Stretch)
        self.layer_table.setSortingEnabled(True)
        self.layer_table.verticalHeader().hide()
        self.layer_table.setEditTriggers(QTableWidget.EditTrigger.NoEditTriggers)
        self.hist_choice = QComboBox()
        self.hist_choice.setObjectName("histogramLayer")
        self.hist_choice.setPlaceholderText("no histograms yet (monitor.histogram_every)")
        self.hist_choice.currentIndexChanged.connect(lambda _: self._versions.pop("hist", None))
        self.hist_plot, self.hist_image = image_plot("Histogram over time (each column: one logged step, own range)",
                                                     "magma", "histogram #", "bin (min → max)")
        self.hist_range = QLabel("")
        hist_box = QWidget()
        hl = QVBoxLayout(hist_box)
        hl.setContentsMargins(0, 0, 0, 0)
        row = QHBoxLayout()
        row.addWidget(QLabel("Layer"))
        row.addWidget(self.hist_choice, 1)
        row.addWidget(self.hist_range)
        hl.addLayout(row)
        hl.addWidget(self.hist_plot, 1)
        grad_tab = QSplitter(Qt.Orientation.Vertical)
        top = QWidget()
        tl = QVBoxLayout(top)
        tl.setContentsMargins(0, 0, 0, 0)
        tl.addWidget(self.heat_plot, 1)
        tl.addWidget(self.heat_hover)
        bottom = QSplitter()
        bottom.addWidget(self.layer_table)
        bottom.addWidget(hist_box)
        bottom.setSizes([560, 420])
        grad_tab.addWidget(top)
        grad_tab.addWidget(bottom)

        # ---- results tab ----
        self.confusion_plot, self.confusion_image = image_plot("Confusion matrix, best epoch (rows: true class)",
                                                               "CET-L12")
        self.confusion_plot.getViewBox().invertY(True)
        self.confusion_plot.setMouseEnabled(x=False, y=False)
        self._confusion_texts: list = []
        self.class_plot = make_plot("Per-class accuracy (best epoch)", "accuracy", "class")
        self.class_plot.setMouseEnabled(x=False, y=False)
        results_tab = QSplitter()
        results_tab.addWidget(self.confusion_plot)
        results_tab.addWidget(self.class_plot)

        # ---- log tab ----
        self.log_view = QPlainTextEdit()
        self.log_view.setObjectName("logView")
        self.log_view.setReadOnly(True)
        self.log_view.setMaximumBlockCount(5000)
        self.log_view.setFont(QFont("monospace", 9))

        self.tabs = QTabWidget()
        self.tabs.addTab(curves_tab, "Curves")
        self.tabs.addTab(grad_tab, "Gradients")
        self.tabs.addTab(results_tab, "Results")
        self.tabs.addTab(self.log_view, "Log")
        self.tabs.currentChanged.connect(lambda _: self.redraw())

        # ---- side panel ----
        self.summary = QLabel("No run yet: press Start.")
        self.summary.setObjectName("runSummary")
        self.summary.setWordWrap(True)
        self.summary.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        self.progress = QProgressBar()
        self.progress.setObjectName("prepareProgress")
        self.progress.hide()
        self.system = QLabel("")
        self.system.setObjectName("systemPanel")
        self.system.setWordWrap(True)
        self.warnings = QListWidget()
        self.warnings.setObjectName("warnings")
        side = QWidget()
        side.setMaximumWidth(300)
        sl = QVBoxLayout(side)
        sl.addWidget(QLabel("<b>Run</b>"))
        sl.addWidget(self.summary)
        sl.addWidget(self.progress)
        sl.addWidget(QLabel("<b>System</b>"))
        sl.addWidget(self.system)
        sl.addWidget(QLabel("<b>Warnings and errors</b>"))
        sl.addWidget(self.warnings, 1)

        layout = QHBoxLayout(self)
        layout.addWidget(self.tabs, 1)
        layout.addWidget(side)

        self.smoother: Smoothed | None = None
        self._timer = QTimer(self)
        self._timer.setInterval(REDRAW_MS)
        self._timer.timeout.connect(self._tick)
        self._step_turn = 0  # the step plot whose turn is next
        self._ticks = 0

    # ---- binding to a run ----------------------------------------------------------------------
    def set_model(self, model: RunModel) -> None:
        """Show `model` (the previous RunModel is discarded by its owner, and its connections with it)."""
        self.model = model
        self._versions.clear()
        self.smoother = Smoothed(model.step_loss, self.smoothing.value() / 100)
        self.log_view.clear()
        self.warnings.clear()
        for line in self._warning_lines:
            self.loss_plot.removeItem(line)
        self._warning_lines.clear()
        for c in self.lr_curves:
            self.lr_plot.removeItem(c)
        self.lr_curves.clear()
        self.heat_image.clear()
        self.hist_image.clear()
        self.hist_choice.clear()
        self.layer_table.setRowCount(0)
        self.system.setText("")
        self.summary.setText(f"{model.run.name}<br>preparing: starting the trainer…")
        self.progress.hide()
        model.preparing.connect(self._preparing)
        model.runStarted.connect(self._run_started)
        model.warningRaised.connect(self._warning)
        model.errorRaised.connect(self._error)
        model.systemSampled.connect(self._system)
        model.logAppended.connect(self._log)
        model.epochEnded.connect(lambda e: self._show_results())
        model.finished.connect(lambda state, message: self.redraw())  # every plot final, not only its round-robin turn
        self._timer.start()
        self.redraw()

    def stop_updates(self) -> None:
        self._timer.stop()

    def _preparing(self, e: dict) -> None:
        self.summary.setText(f"{self.model.run.name}<br>preparing: {e.get('message', '')}")
        if e.get("total"):
            self.progress.setRange(0, e["total"])
            self.progress.setValue(e.get("done", 0))
            self.progress.setFormat("decoding images %v/%m")
            self.progress.show()

    def _run_started(self, e: dict) -> None:
        self.progress.hide()
        cfg = e.get("config", {})
        self.summary.setText(
            f"<b>{self.model.run.name}</b><br>{cfg.get('model', {}).get('name')} on {len(e['classes'])} classes"
            f"<br>{e['train_size']} train / {e['val_size']} val images<br>{e['device']}, cache {e['cache']}"
            f"<br>{e.get('precision', 'fp32')}, {e.get('memory_format', 'contiguous_format')}"
            + (", compiled" if e.get("compiled") else "")
            + f"<br>{e['trainable']:,} trainable parameters"
            + (f"<br>resumed from {Path(e['resumed_from']).name}" if e.get("resumed_from") else ""))
        while len(self.lr_curves) < len(self.model.lr):
            i = len(self.lr_curves)
            name = self.model.group_names[i] if i < len(self.model.group_names) else f"group {i}"
            self.lr_curves.append(curve(self.lr_plot, COLORS[i % len(COLORS)], name))

    def _warning(self, e: dict) -> None:
        self.warnings.addItem(f"⚠ {e.get('message', '')}")
        step = e.get("step") or (self.model.last_step.get("step") if self.model else None)
        if step is not None:
            line = pg.InfiniteLine(pos=step, angle=90, pen=pg.mkPen("#e6a100", width=1, style=Qt.PenStyle.DashLine))
            self.loss_plot.addItem(line)
            self._warning_lines.append(line)

    def _error(self, e: dict) -> None:
        item = f"✖ {e.get('message', '')}"
        self.warnings.addItem(item)
        self.warnings.item(self.warnings.count() - 1).setForeground(Qt.GlobalColor.red)

    def _system(self, e: dict) -> None:
        text = f"CPU {e.get('cpu_percent', 0):.0f}%  ·  memory {e.get('rss_mb', 0):.0f} MB  ·  " \
               f"{e.get('processes', 1)} process(es)"
        for g in e.get("gpus", []):
            util = f"{g['utilization']}%" if g.get("utilization") is not None else "n/a"
            text += f"<br>GPU {g['index']}: {util} busy, {g['memory_used_mb']:.0f}/{g['memory_total_mb']:.0f} MB"
        self.system.setText(text)

    def _log(self, text: str) -> None:
        self.log_view.appendPlainText(text.rstrip("\n"))

    # ---- drawing -----------------------------------------------------------------------------
    def _changed(self, key: str, series) -> bool:
        if self._versions.get(key) == series.version:
            return False
        self._versions[key] = series.version
        return True

    def _set(self, key: str, item, series: Series) -> None:
        if self._changed(key, series):
            show(item, series)

    def _tick(self) -> None:
        self._ticks += 1
        if self.model is not None and self.model.catching_up and self._ticks % CATCHING_UP_EVERY:
            return
        self.redraw(STEP_PLOTS_PER_TICK)

    def _step_plots(self) -> list[tuple[list[tuple[str, Series]], Callable[[], None]]]:
        """Per step plot: the (key, series) it shows and how to redraw it."""
        m = self.model

        def loss():
            shown = m.step_loss.display_index()
            x = m.step_loss.x[shown]
            self.raw_loss.setData(x, m.step_loss.y[shown])
            self.smooth_loss.setData(x, self.smoother.values()[shown])

        def lrs():
            for item, series in zip(self.lr_curves, m.lr):
                show(item, series)

        return [([("loss", m.step_loss)], loss),
                ([(f"lr{i}", s) for i, s in enumerate(m.lr[: len(self.lr_curves)])], lrs),
                ([("speed", m.images_per_s)], lambda: show(self.speed_curve, m.images_per_s)),
                ([("norm", m.grad_norm)], lambda: show(self.norm_curve, m.grad_norm))]

    def redraw(self, step_plots: int | None = None) -> None:
        """Bring the visible views up to date; `step_plots` limits how many step plots are redrawn (timer ticks)."""
        m = self.model
        if m is None:
            return
        plots = self._step_plots()
        budget = len(plots) if step_plots is None else step_plots
        for k in range(len(plots)):
            if budget == 0:
                break
            index = (self._step_turn + k) % len(plots)
            shown, draw = plots[index]
            if any(self._versions.get(key) != series.version for key, series in shown):
                for key, series in shown:
                    self._versions[key] = series.version
                draw()
                budget -= 1
                self._step_turn = index + 1
        self._set("train_epoch", self.train_epoch, m.train_loss)
        self._set("val_epoch", self.val_epoch, m.val_loss)
        self._set("acc", self.acc_curve, m.val_acc)
        if self.tabs.currentIndex() != GRADIENTS_TAB:
            return  # hidden views are not redrawn; switching tabs redraws them from the buffers
        if m.layer_grad is not None and self._changed("heat", m.layer_grad) and len(m.layer_grad):
            with np.errstate(divide="ignore", invalid="ignore"):
                image = np.log10(np.maximum(m.layer_grad.data, 1e-12))
            finite = image[np.isfinite(image)]
            levels = (float(finite.min()), float(finite.max()) + 1e-6) if finite.size else (0, 1)
            self.heat_image.setImage(image.T, levels=levels, autoLevels=False)
            self._fill_layer_table()
        self._draw_histograms()

    def _draw_histograms(self) -> None:
        m = self.model
        keys = sorted(m.histograms)
        if self.hist_choice.count() != len(keys):
            current = self.hist_choice.currentText()
            self.hist_choice.blockSignals(True)
            self.hist_choice.clear()
            self.hist_choice.addItems([f"{layer} ({kind})" for layer, kind in keys])
            self.hist_choice.setCurrentIndex(max(0, self.hist_choice.findText(current)))
            self.hist_choice.blockSignals(False)
        index = self.hist_choice.currentIndex()
        if index < 0 or index >= len(keys):
            return
        series = m.histograms[keys[index]]
        if self._versions.get("hist") == (index, len(series)):
            return
        self._versions["hist"] = (index, len(series))
        counts = np.array([h["counts"] for h in series], dtype=float)
        counts /= np.maximum(counts.max(axis=1, keepdims=True), 1)
        self.hist_image.setImage(counts, levels=(0, 1), autoLevels=False)
        last = series[-1]
        self.hist_range.setText(f"step {last['step']}: {last['min']:.3g} … {last['max']:.3g}")

    def _fill_layer_table(self) -> None:
        m = self.model
        table = m.layer_table
        if not table or not m.layers:
            return
        self.layer_table.setSortingEnabled(False)
        self.layer_table.setRowCount(len(m.layers))
        for row, name in enumerate(m.layers):
            self.layer_table.setItem(row, 0, QTableWidgetItem(name))
            for col, key in enumerate(("grad_norm", "weight_norm", "update_ratio", "zero_frac"), start=1):
                value = table[key][row] if row < len(table.get(key, [])) else None
                item = NumericItem("—" if value is None else f"{value:.3g}")
                item.setData(Qt.ItemDataRole.UserRole, value if value is not None else -1.0)
                self.layer_table.setItem(row, col, item)
        self.layer_table.setSortingEnabled(True)

    def _heat_hover(self, pos) -> None:
        m = self.model
        if m is None or m.layer_grad is None or not len(m.layer_grad):
            return
        point = self.heat_image.mapFromScene(pos)
        col, row = int(point.x()), int(point.y())
        if 0 <= row < m.layer_grad.rows and 0 <= col < len(m.layer_grad):
            value = m.layer_grad.data[row, col]
            self.heat_hover.setText(f"{m.layers[row]} at step {int(m.layer_grad.steps[col])}: grad norm {value:.4g}")

    def _show_results(self) -> None:
        m = self.model
        best = m.best_epoch
        if not best or not best.get("confusion"):
            return
        conf = np.array(best["confusion"], dtype=float)
        n = len(conf)
        rows = conf.sum(1, keepdims=True)
        share = np.divide(conf, rows, out=np.zeros_like(conf), where=rows > 0)
        self.confusion_image.setImage(share.T, levels=(0, 1), autoLevels=False)
        self.confusion_plot.setRange(xRange=(0, n), yRange=(0, n), padding=0.02)
        for t in self._confusion_texts:
            self.confusion_plot.removeItem(t)
        self._confusion_texts.clear()
        classes = m.start_event.get("classes", [])
        if len(classes) <= 20:
            for i in range(n):
                for j in range(n):
                    text = pg.TextItem(str(int(conf[i, j])), color="w" if share[i, j] > 0.5 else "k", anchor=(0.5, 0.5))
                    text.setPos(j + 0.5, i + 0.5)
                    self.confusion_plot.addItem(text)
                    self._confusion_texts.append(text)
        ticks = [list(enumerate(classes))]
        shifted = [[(i + 0.5, c) for i, c in ticks[0]]]
        self.confusion_plot.getAxis("bottom").setTicks(shifted)
        self.confusion_plot.getAxis("left").setTicks(shifted)
        self.class_plot.clear()
        acc = best.get("per_class_acc", [])
        self.class_plot.addItem(pg.BarGraphItem(x=list(range(len(acc))), height=acc, width=0.7, brush=COLORS[2]))
        self.class_plot.getAxis("bottom").setTicks(ticks)
        self.class_plot.setYRange(0, 1)

    def _smoothing_changed(self, value: int) -> None:
        self.smoothing_label.setText(f"{value / 100:.2f}")
        if self.smoother is not None:
            self.smoother.set_weight(value / 100)
            self._versions.pop("loss", None)
            self.redraw()

    def _log_scale_changed(self, on: bool) -> None:
        for plot in (self.loss_plot, self.epoch_plot, self.lr_plot, self.norm_plot):
            plot.setLogMode(x=False, y=on)

    # ---- export ------------------------------------------------------------------------------
    def export_png(self, path: str | None = None) -> str | None:
        if not path:
            path, _ = QFileDialog.getSaveFileName(self, "Export plots as PNG", "curves.png", "PNG (*.png)")
        if path:
            self.curves.grab().save(path)
        return path or None

    def export_csv(self, path: str | None = None) -> str | None:
        """Two CSV files: per logged step (`path`) and per epoch (`path` with `-epochs`)."""
        m = self.model
        if m is None:
            return None
        if not path:
            path, _ = QFileDialog.getSaveFileName(self, "Export data as CSV", "steps.csv", "CSV (*.csv)")
        if not path:
            return None
        steps = {int(s): {"step": int(s)} for s in m.step_loss.x}
        columns = [("loss", m.step_loss), ("images_per_s", m.images_per_s), ("grad_norm", m.grad_norm)]
        columns += [(f"lr_{m.group_names[i] if i < len(m.group_names) else i}", s) for i, s in enumerate(m.lr)]
        for name, series in columns:
            for x, y in zip(series.x, series.y):
                steps.setdefault(int(x), {"step": int(x)})[name] = "" if math.isnan(y) else y
        with open(path, "w", newline="") as f:
            writer = csv.DictWriter(f, ["step"] + [c for c, _ in columns])
            writer.writeheader()
            writer.writerows(steps[k] for k in sorted(steps))
        epochs_path = str(Path(path).with_name(Path(path).stem + "-epochs.csv"))
        with open(epochs_path, "w", newline="") as f:
            writer = csv.writer(f)
            writer.writerow(["epoch", "train_loss", "val_loss", "val_acc"])
            for i in range(len(m.val_acc)):
                writer.writerow([int(m.val_acc.x[i]), m.train_loss.y[i], m.val_loss.y[i], m.val_acc.y[i]])
        return path
