"""The dashboard's Gradients tab: per-layer gradient-norm heatmap (layer names on its axis, grouped by module), the
latest per-layer table, and histograms over time on one shared symlog value axis."""

from __future__ import annotations

import math

import numpy as np
from PySide6.QtCore import Qt
from PySide6.QtWidgets import (
    QComboBox,
    QHBoxLayout,
    QHeaderView,
    QLabel,
    QSplitter,
    QTableWidget,
    QTableWidgetItem,
    QVBoxLayout,
    QWidget,
)

from app.jobs.run_model import RunModel
from app.state.grad_views import layer_ticks, shared_histograms, step_ticks, value_ticks
from app.widgets.plots import NumericItem, image_plot

HEAT_AXIS_WIDTH = 210  # room for the layer names beside the heatmap
LABEL_PX = 14  # the height a layer label needs on the heatmap's axis


class GradientsTab(QSplitter):
    def __init__(self, parent: QWidget | None = None):
        super().__init__(Qt.Orientation.Vertical, parent)
        self.model: RunModel | None = None
        self._versions: dict = {}
        self.heat_plot, self.heat_image = image_plot("Per-layer gradient norm (log10), layers × logged steps",
                                                     "viridis", "step", "layer")
        self.heat_plot.getViewBox().invertY(True)
        self.heat_plot.getAxis("left").setWidth(HEAT_AXIS_WIDTH)
        # every layer's name where the rows leave room for it (pyqtgraph's default drops the second tick level early)
        self.heat_plot.getAxis("left").setStyle(textFillLimits=[(0, 0.95)])
        self.heat_plot.setLabel("left", "")
        self.heat_hover = QLabel("hover over the heatmap for layer and value")
        self.heat_hover.setObjectName("heatHover")
        self.heat_plot.scene().sigMouseMoved.connect(self._heat_hover)
        self._build_layer_table()
        self.hist_choice = QComboBox()
        self.hist_choice.setObjectName("histogramLayer")
        # as wide as the splitter gives it, not as its longest layer name: that pushed the table to its name column
        self.hist_choice.setSizeAdjustPolicy(QComboBox.SizeAdjustPolicy.AdjustToMinimumContentsLengthWithIcon)
        self.hist_choice.setMinimumContentsLength(12)
        self.hist_choice.setPlaceholderText("no histograms yet (monitor.histogram_every)")
        self.hist_choice.currentIndexChanged.connect(lambda _: self._versions.pop("hist", None))
        self.hist_plot, self.hist_image = image_plot("Histogram over time (value axis shared, symlog)", "magma",
                                                     "step", "value")
        self.hist_range = QLabel("")
        self.hist_range.setMinimumWidth(1)  # cut when the splitter leaves it less, not a minimum on the table's room
        hist_box = QWidget()
        hl = QVBoxLayout(hist_box)
        hl.setContentsMargins(0, 0, 0, 0)
        row = QHBoxLayout()
        row.addWidget(QLabel("Layer"))
        row.addWidget(self.hist_choice, 1)
        row.addWidget(self.hist_range)
        hl.addLayout(row)
        hl.addWidget(self.hist_plot, 1)
        top = QWidget()
        tl = QVBoxLayout(top)
        tl.setContentsMargins(0, 0, 0, 0)
        tl.addWidget(self.heat_plot, 1)
        tl.addWidget(self.heat_hover)
        bottom = QSplitter()
        bottom.addWidget(self.layer_table)
        bottom.addWidget(hist_box)
        bottom.setSizes([560, 420])
        bottom.setStretchFactor(0, 4)
        bottom.setStretchFactor(1, 3)
        self.addWidget(top)
        self.addWidget(bottom)

    def _build_layer_table(self) -> None:
        """The table of each layer's figures at the last logged step (sortable; the names cut in the middle)."""
        self.layer_table = QTableWidget(0, 5)
        self.layer_table.setObjectName("layerTable")
        # short headings, so that the figures fit beside the names on a laptop screen; what each is, on hover
        self.layer_table.setHorizontalHeaderLabels(["layer", "grad", "weight", "update", "zeros"])
        for column, tip in enumerate(("parameter tensor", "gradient norm (L2)", "weight norm (L2)",
                                      "update / weight: the step's size against the weights'",
                                      "share of the gradient's entries that are exactly zero")):
            self.layer_table.horizontalHeaderItem(column).setToolTip(tip)
        header = self.layer_table.horizontalHeader()
        # the figures as wide as their contents, always in view; the names take the rest, whole where it is enough,
        # else cut in the middle ("features.6.1.weight" as "featur…1.weight", whole in its tooltip): at 1024 px the
        # table showed the name column alone (issue #71)
        header.setSectionResizeMode(QHeaderView.ResizeMode.ResizeToContents)
        header.setSectionResizeMode(0, QHeaderView.ResizeMode.Stretch)
        header.setStretchLastSection(False)
        self.layer_table.setTextElideMode(Qt.TextElideMode.ElideMiddle)
        self.layer_table.setWordWrap(False)
        self.layer_table.setSortingEnabled(True)
        self.layer_table.verticalHeader().hide()
        self.layer_table.setEditTriggers(QTableWidget.EditTrigger.NoEditTriggers)

    def set_model(self, model: RunModel) -> None:
        self.model = model
        self._versions.clear()
        self.heat_image.clear()
        self.hist_image.clear()
        self.hist_choice.clear()
        self.layer_table.setRowCount(0)

    def redraw(self) -> None:
        m = self.model
        if m is None:
            return
        if m.layer_grad is not None and len(m.layer_grad) and self._versions.get("heat") != m.layer_grad.version:
            self._versions["heat"] = m.layer_grad.version
            with np.errstate(divide="ignore", invalid="ignore"):
                image = np.log10(np.maximum(m.layer_grad.data, 1e-12))
            finite = image[np.isfinite(image)]
            levels = (float(finite.min()), float(finite.max()) + 1e-6) if finite.size else (0, 1)
            self.heat_image.setImage(image.T, levels=levels, autoLevels=False)
            self.heat_plot.getAxis("bottom").setTicks(step_ticks(m.layer_grad.steps))
            rows_per_label = math.ceil(LABEL_PX * len(m.layers) / max(self.heat_plot.height() - 60, 1))
            if self._versions.get("names") != (len(m.layers), rows_per_label):
                self._versions["names"] = (len(m.layers), rows_per_label)
                self.heat_plot.getAxis("left").setTicks(layer_ticks(m.layers, min_gap=rows_per_label))
            self._fill_layer_table()
        self._draw_histograms()

    def _draw_histograms(self) -> None:
        m = self.model
        keys = sorted(m.histograms)
        every = (m.start_event.get("config", {}).get("monitor", {}) or {}).get("histogram_every")
        self.hist_choice.setPlaceholderText(
            "off for this run (histogram_every: 0)" if every == 0
            else "no histograms were logged" if m.ended else "no histograms yet (monitor.histogram_every)")
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
        image, low, high, linthresh = shared_histograms(series)
        self.hist_image.setImage(image, levels=(0, 1), autoLevels=False)
        self.hist_plot.getAxis("left").setTicks([value_ticks(low, high, linthresh)])
        self.hist_plot.getAxis("bottom").setTicks(step_ticks([h["step"] for h in series]))
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
            item = QTableWidgetItem(name)
            item.setToolTip(name)
            self.layer_table.setItem(row, 0, item)
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
