"""Plot helpers shared by the dashboard's tabs and the runs page: styled plots, curves, thinned drawing."""

from __future__ import annotations

import html

import pyqtgraph as pg
from PySide6.QtCore import Qt
from PySide6.QtWidgets import QCheckBox, QTableWidgetItem, QVBoxLayout, QWidget

from app.state.buffers import Series

COLORS = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f"]

POINTS_PER_PX = 4  # of a thinned curve (`points_for`)
MIN_POINTS = 1000
SMALL_PT = 8  # what a plot says of its own axis, in its title
NOTE_COLOUR = "#b35900"  # what a plot says of its own axis (a value left off its scale)


def make_plot(title: str, y_label: str, x_label: str = "step") -> pg.PlotWidget:
    """A plot whose named curves are listed under it, beside the x axis's name, in their colours (issue #71: a
    legend inside the plot covered the curves); a plot that needs a legend of many entries (Compare) adds its own."""
    plot = pg.PlotWidget()
    plot.base_title, plot.x_label, plot.note = title, x_label, ""
    retitle(plot)
    plot.setBackground("w")
    plot.showGrid(x=True, y=True, alpha=0.25)
    plot.setLabel("left", y_label)
    # Fixed axis geometry: with auto SI prefixes and text-fitted axis widths, a growing step count made the axis
    # re-layout the plot, which changed the ticks, which changed the layout again: an endless repaint loop.
    for side in ("bottom", "left"):
        plot.getAxis(side).enableAutoSIPrefix(False)
    plot.getAxis("left").setWidth(64)
    return plot


def retitle(plot: pg.PlotWidget, note: str | None = None) -> None:
    """The title: the plot's name and its `note` (kept until another is given; "" for none), in a smaller type; and
    under the plot, beside the x axis's name, each named curve as a coloured line and its name (a title holding them
    all was cut at 1024 px)."""
    if note is not None:
        plot.note = note
    if plot.getPlotItem().legend is not None:  # its own legend lists the curves
        names = []
    else:
        names = [f"<span style='color:{item.opts['pen'].color().name()}'>━ {html.escape(item.name())}</span>"
                 for item in plot.getPlotItem().listDataItems() if item.name()]
    set_title(plot, html.escape(plot.base_title) + (f" <span style='color:{NOTE_COLOUR}; font-size:{SMALL_PT}pt'>· "
                                                    f"{html.escape(plot.note)}</span>" if plot.note else ""))
    plot.setLabel("bottom", "&nbsp;&nbsp;".join([html.escape(plot.x_label), *names]))


def set_title(plot: pg.PlotWidget, text: str) -> None:
    """`plot`'s title; one wider than the plot is cut, never the plot: pyqtgraph makes the text's width the plot's
    minimum, and at 1024 px the dashboard's grid drew its plots cut off at the right (their last epochs out of view),
    and the histogram's title pushed the layer table beside it down to its name column."""
    label = plot.getPlotItem().titleLabel
    if not hasattr(label, "fit_text"):  # pyqtgraph sets the minimum again whenever it measures the text (on show)
        label.fit_text = label.updateMin
        label.updateMin = lambda: (label.fit_text(), label.setMinimumWidth(0))
    plot.setTitle(text)


def with_log_toggle(plot: pg.PlotWidget) -> QWidget:
    """The plot with its own "log y" check box above its top-right corner (kept as `plot.log_toggle`): one huge
    early value (a first-epoch loss of several hundred) no longer flattens the rest of a curve."""
    box = QCheckBox("log y")
    box.setObjectName(f"logY:{getattr(plot, 'base_title', '') or plot.plotItem.titleLabel.text}")
    box.setToolTip("logarithmic value axis for this plot")
    box.toggled.connect(lambda on: plot.setLogMode(x=False, y=on))
    plot.log_toggle = box
    panel = QWidget()
    layout = QVBoxLayout(panel)
    layout.setContentsMargins(0, 0, 0, 0)
    layout.setSpacing(0)
    layout.addWidget(box, 0, Qt.AlignmentFlag.AlignRight)
    layout.addWidget(plot, 1)
    return panel


def image_plot(title: str, colormap: str, x_label: str = "", y_label: str = "") -> tuple[pg.PlotWidget, pg.ImageItem]:
    """A plot holding one colour-mapped image (heatmaps, histograms over time, confusion matrix); row 0 on top."""
    plot = pg.PlotWidget()
    set_title(plot, title)
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
    item = plot.plot([], [], pen=pg.mkPen(color, width=width), name=name, symbol=symbol, symbolSize=6,
                     symbolBrush=color)
    item.own_symbol = symbol  # a line's own marker (None: none); a lone point gets one until the second comes
    if name and hasattr(plot, "base_title"):
        retitle(plot)
    return item


def points_for(item) -> int:
    """How many points of a thinned series `item`'s plot is given: POINTS_PER_PX a pixel of its width (each bucket's
    lowest and highest, two buckets a pixel: a window made twice as wide still shows every peak), at least
    MIN_POINTS. More are not seen, and each costs its paint (4,000 on a 256 px plot: a third of the dashboard's)."""
    view = item.getViewBox()
    return max(MIN_POINTS, int(POINTS_PER_PX * (view.width() if view is not None else 0)))


def show(item, series: Series) -> None:
    """Draw `series` in `item`, thinned to what its plot can show (`Series.display_index`, `points_for`). A line
    through one point draws nothing, so a lone point is drawn as a dot, with the view around it."""
    shown = series.display_index(points_for(item))
    draw(item, series.x[shown], series.y[shown])


def draw(item, x, y) -> None:
    """`item.setData(x, y)`, with a lone point drawn as a dot."""
    item.setData(x, y)
    lone = len(x) == 1
    view = item.getViewBox()
    if lone and view is not None:  # pyqtgraph has no range for one point (it drew axes from -200 to 200)
        fixed = item.fixed_axes = getattr(item, "fixed_axes", None) or [
            axis for axis, auto in zip(("x", "y"), view.autoRangeEnabled()) if auto]
        half = {"x": 1.0, "y": max(abs(float(y[0])) * 0.1, 1e-3)}
        value = {"x": float(x[0]), "y": float(y[0])}
        for axis in fixed:
            (view.setXRange if axis == "x" else view.setYRange)(value[axis] - half[axis], value[axis] + half[axis])
    elif getattr(item, "fixed_axes", None) and view is not None:
        for axis in item.fixed_axes:
            view.enableAutoRange(axis=axis)
        item.fixed_axes = None
    if lone != getattr(item, "lone", False):
        item.lone = lone
        item.setSymbol("o" if lone else getattr(item, "own_symbol", None))


def empty(plot: pg.PlotWidget) -> None:
    """Every curve of `plot` emptied and its axes back to 0-1, following the data again (the axes that follow):
    another run's plot does not start with the last run's ranges."""
    view = plot.getViewBox()
    for item in plot.getPlotItem().listDataItems():
        draw(item, [], [])
    for axis, following in zip(("x", "y"), view.autoRangeEnabled()):
        if following is not False:  # (an accuracy's fixed 0-1 stays as it is)
            (view.setXRange if axis == "x" else view.setYRange)(0, 1, padding=0)  # this turns following off
            view.enableAutoRange(axis=axis)


class NumericItem(QTableWidgetItem):
    """Sorts by value, not text."""

    def __lt__(self, other):
        a, b = self.data(Qt.ItemDataRole.UserRole), other.data(Qt.ItemDataRole.UserRole)
        if isinstance(a, (int, float)) and isinstance(b, (int, float)):
            return a < b
        return super().__lt__(other)
