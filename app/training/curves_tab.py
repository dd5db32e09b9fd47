"""The dashboard's Curves tab: loss (raw and smoothed), loss and accuracy per epoch, learning rates,
throughput and the global gradient norm, with warnings marked on the loss plot."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pyqtgraph as pg
from PySide6.QtCore import Qt, QTimer, Signal
from PySide6.QtWidgets import QCheckBox, QFileDialog, QGridLayout, QHBoxLayout, QLabel, QPushButton, QSlider, QVBoxLayout, QWidget

from app.jobs.background import run_in_thread
from app.jobs.run_model import RunModel
from app.state.buffers import Series, Smoothed
from app.state.csv_export import export_run_csv
from app.state.loss_axis import robust_range
from app.widgets.plots import COLORS, curve, draw, empty, make_plot, points_for, retitle, show, with_log_toggle

PAINT_ONE_EVERY_MS = 12  # `hold_paint`: a plot's paint a turn (~10-17 ms each on 2 EPYC cores)


class CurvesTab(QWidget):
    csvWritten = Signal(str)  # the file written, or why it failed

    def __init__(self, parent: QWidget | None = None):
        super().__init__(parent)
        self.model: RunModel | None = None
        self._versions: dict[str, int] = {}
        self._score_key = "val_acc"  # what the third plot shows: val_acc, or a multi-label run's val_map
        self.loss_plot = make_plot("Training loss", "loss")
        self.raw_loss = curve(self.loss_plot, "#9ecae1", "raw", width=1)
        self.smooth_loss = curve(self.loss_plot, COLORS[0], "smoothed")
        self.epoch_plot = make_plot("Loss per epoch", "loss", "epoch")
        self.train_epoch = curve(self.epoch_plot, COLORS[0], "train", symbol="o")
        self.val_epoch = curve(self.epoch_plot, COLORS[1], "validation", symbol="o")
        self.acc_plot = make_plot("Val accuracy", "accuracy", "epoch")
        self.acc_curve = curve(self.acc_plot, COLORS[2], "val acc", symbol="o")
        self.acc_plot.setYRange(0, 1, padding=0.02)  # an accuracy is a fraction: the axis never runs past 1
        self.acc_plot.getViewBox().setLimits(yMin=-0.02, yMax=1.02)
        self.acc_plot.enableAutoRange(axis="y", enable=False)
        self.lr_plot = make_plot("Learning rates", "lr per group")
        self.lr_curves: list = []
        self.speed_plot = make_plot("Throughput", "images/s")
        self.speed_curve = curve(self.speed_plot, COLORS[4])
        self.norm_plot = make_plot("Gradient norm", "global L2, before clipping")
        self.norm_curve = curve(self.norm_plot, COLORS[3])
        self._warning_lines: list = []
        self._turn = 0  # the plot whose turn to be redrawn is next
        self._held: list = []  # the plots not painted again yet (`hold_paint`)
        self._release = QTimer(self)
        self._release.setInterval(PAINT_ONE_EVERY_MS)
        self._release.timeout.connect(self._release_one)
        self.smoother: Smoothed | None = None

        controls = self._build_controls()

        self.plots = QWidget()
        grid = QGridLayout(self.plots)
        grid.setContentsMargins(0, 0, 0, 0)
        self.all_plots = [self.loss_plot, self.epoch_plot, self.acc_plot, self.lr_plot, self.speed_plot, self.norm_plot]
        for i, plot in enumerate(self.all_plots):
            grid.addWidget(with_log_toggle(plot), i // 3, i % 3)
            # a plot resized is drawn again, thinned to its new width (`points_for`), on the ticks to come
            plot.getViewBox().sigResized.connect(lambda *_: self._versions.clear())
        self.epoch_plot.log_toggle.toggled.connect(lambda _: (self._versions.pop("train_epoch", None), self.redraw()))
        layout = QVBoxLayout(self)
        layout.addLayout(controls)
        layout.addWidget(self.plots, 1)

    def _build_controls(self) -> QHBoxLayout:
        """Smoothing, log scale and the exports, above the plots."""
        self.smoothing = QSlider(Qt.Orientation.Horizontal)
        self.smoothing.setObjectName("smoothing")
        self.smoothing.setRange(0, 99)
        self.smoothing.setValue(60)
        self.smoothing.setMaximumWidth(160)
        self.smoothing_label = QLabel("0.60")
        self.smoothing.valueChanged.connect(self._smoothing_changed)
        self.log_scale = QCheckBox("log scale (all)")
        self.log_scale.setObjectName("logScale")
        self.log_scale.setToolTip("every plot's value axis logarithmic; each plot also has its own toggle")
        self.log_scale.toggled.connect(self._log_scale_changed)
        export_png = QPushButton("Export PNG…")
        export_png.clicked.connect(lambda: self.export_png())
        export_csv = QPushButton("Export CSV…")
        export_csv.clicked.connect(lambda: self.export_csv())
        controls = QHBoxLayout()
        controls.addWidget(QLabel("Smoothing"))
        controls.addWidget(self.smoothing)
        controls.addWidget(self.smoothing_label)
        controls.addWidget(self.log_scale)
        controls.addStretch(1)
        controls.addWidget(export_png)
        controls.addWidget(export_csv)
        return controls

    def set_model(self, model: RunModel) -> None:
        self.model = model
        self._versions.clear()
        self._score_key = ""  # titled again from the run's own metric
        self.smoother = Smoothed(model.step_loss, self.smoothing.value() / 100)
        for line in self._warning_lines:
            self.loss_plot.removeItem(line)
        self._warning_lines.clear()
        for c in self.lr_curves:
            self.lr_plot.removeItem(c)
        self.lr_curves.clear()
        retitle(self.lr_plot)
        for plot in self.all_plots:
            empty(plot)
        self.hold_paint()

    def add_group_curves(self) -> None:
        """One learning-rate curve per parameter group of the run."""
        m = self.model
        while len(self.lr_curves) < len(m.lr):
            i = len(self.lr_curves)
            name = m.group_names[i] if i < len(m.group_names) else f"group {i}"
            self.lr_curves.append(curve(self.lr_plot, COLORS[i % len(COLORS)], name))

    def mark_warning(self, step: int) -> None:
        line = pg.InfiniteLine(pos=step, angle=90, pen=pg.mkPen("#e6a100", width=1, style=Qt.PenStyle.DashLine))
        self.loss_plot.addItem(line)
        self._warning_lines.append(line)

    def _plots(self) -> list[tuple[list[tuple[str, Series]], Callable[[], None]]]:
        """Per plot: the (key, series) it shows and how to redraw it (the step plots, then the epoch plots)."""
        m = self.model

        def loss():
            shown = m.step_loss.display_index(points_for(self.raw_loss))
            x = m.step_loss.x[shown]
            draw(self.raw_loss, x, m.step_loss.y[shown])
            draw(self.smooth_loss, x, self.smoother.values()[shown])

        def lrs():
            for item, series in zip(self.lr_curves, m.lr):
                show(item, series)

        def epochs():
            show(self.train_epoch, m.train_loss)
            show(self.val_epoch, m.val_loss)
            self._fit_epoch_axis()

        return [([("loss", m.step_loss)], loss),
                ([(f"lr{i}", s) for i, s in enumerate(m.lr[: len(self.lr_curves)])], lrs),
                ([("speed", m.images_per_s)], lambda: show(self.speed_curve, m.images_per_s)),
                ([("norm", m.grad_norm)], lambda: show(self.norm_curve, m.grad_norm)),
                ([("train_epoch", m.train_loss), ("val_epoch", m.val_loss)], epochs),
                ([("acc", m.val_score)], lambda: show(self.acc_curve, m.val_score))]

    def redraw(self, plots: int | None = None) -> None:
        """Bring the plots up to date; `plots` limits how many are redrawn (the timer's ticks: one plot's paint a
        turn, whichever changed, in turn)."""
        m = self.model
        if m is None:
            return
        if self._score_key != m.score_key:  # a multi-label run's curve is its mAP
            self._score_key = m.score_key
            multilabel = m.score_key == "val_map"
            self.acc_plot.base_title = "Val mAP" if multilabel else "Val accuracy"
            self.acc_plot.setLabel("left", "mAP" if multilabel else "accuracy")
            self.acc_curve.opts["name"] = "val mAP" if multilabel else "val acc"
            retitle(self.acc_plot)
        drawables = self._plots()
        budget = len(drawables) if plots is None else plots
        start = self._turn
        for k in range(len(drawables)):
            if budget == 0:
                break
            index = (start + k) % len(drawables)
            shown, draw_it = drawables[index]
            if any(self._versions.get(key) != series.version for key, series in shown):
                for key, series in shown:
                    self._versions[key] = series.version
                draw_it()
                budget -= 1
                self._turn = index + 1

    def hold_paint(self) -> None:
        """Every plot painted again on a turn of its own (PAINT_ONE_EVERY_MS apart), not all six in one: after a run is
        opened (each emptied) or the tab shown, one turn painting them all held the GUI thread ~0.1 s."""
        self._held = list(self.all_plots)
        for plot in self._held:
            plot.setUpdatesEnabled(False)
        self._release.start()

    def _release_one(self) -> None:
        if self._held:
            self._held.pop(0).setUpdatesEnabled(True)
        if not self._held:
            self._release.stop()

    def showEvent(self, event) -> None:
        super().showEvent(event)
        self.hold_paint()

    def _fit_epoch_axis(self) -> None:
        """Loss per epoch without its outliers on a linear axis (said in its title), else following the data."""
        m, view = self.model, self.epoch_plot.getViewBox()
        cut = None if self.epoch_plot.log_toggle.isChecked() else robust_range(np.concatenate([m.train_loss.x, m.val_loss.x]),
                                            np.concatenate([m.train_loss.y, m.val_loss.y]))
        if cut is None:
            retitle(self.epoch_plot, "")
            view.enableAutoRange(axis="y")
        else:
            retitle(self.epoch_plot, cut.said())
            view.setYRange(cut.low, cut.high, padding=0)
        self.epoch_plot.setToolTip("" if cut is None else f"off this linear scale, far above the others: {cut.which()}"
                                                          f" (\"log y\" shows every loss)")

    def _smoothing_changed(self, value: int) -> None:
        self.smoothing_label.setText(f"{value / 100:.2f}")
        if self.smoother is not None:
            self.smoother.set_weight(value / 100)
            self._versions.pop("loss", None)
            self.redraw()

    def _log_scale_changed(self, on: bool) -> None:
        for plot in self.all_plots:
            plot.log_toggle.setChecked(on)

    def export_png(self, path: str | None = None) -> str | None:
        if not path:
            path, _ = QFileDialog.getSaveFileName(self, "Export plots as PNG", "curves.png", "PNG (*.png)")
        if path:
            while self._held:  # every plot painted before the picture is taken (`hold_paint`)
                self._release_one()
            self.plots.grab().save(path)
        return path or None

    def export_csv(self, path: str | None = None) -> str | None:
        """Two CSV files from the run's events at full resolution: per logged step (`path`) and per epoch
        (`path` with `-epochs`), written off the GUI thread; `csvWritten` tells when."""
        if self.model is None:
            return None
        if not path:
            path, _ = QFileDialog.getSaveFileName(self, "Export data as CSV", "steps.csv", "CSV (*.csv)")
        if not path:
            return None
        events = self.model.run.events
        run_in_thread(lambda: export_run_csv(events, path), lambda paths: self.csvWritten.emit(str(paths[0])),
                      lambda error: self.csvWritten.emit(f"CSV export failed: {error}"), owner=self)
        return path
