"""The Dataset page's images-per-class bar chart. Its pyqtgraph plot is built at the first counts to draw, so the
window shows without importing pyqtgraph (a third of a second of the start-up; `bench/startup.py`)."""

from __future__ import annotations

from PySide6.QtWidgets import QVBoxLayout, QWidget

MIN_HEIGHT = 160  # px, reserved from the start: the page does not jump when the first counts arrive
BAR_COLOUR = "#4a90d9"


class ClassBars(QWidget):
    def __init__(self, parent: QWidget | None = None):
        super().__init__(parent)
        self.setMinimumHeight(MIN_HEIGHT)
        self.plot = None  # pg.PlotWidget, once there is something to draw
        self._layout = QVBoxLayout(self)
        self._layout.setContentsMargins(0, 0, 0, 0)

    def show_counts(self, counts: dict[str, int]) -> None:
        """One bar per class (or label), named under it; no counts clears the chart."""
        if self.plot is None:
            if not counts:
                return
            self._build()
        self.plot.clear()
        if counts:
            import pyqtgraph as pg

            xs = list(range(len(counts)))
            self.plot.addItem(pg.BarGraphItem(x=xs, height=list(counts.values()), width=0.7, brush=BAR_COLOUR))
            self.plot.getAxis("bottom").setTicks([list(zip(xs, counts.keys()))])

    def _build(self) -> None:
        import pyqtgraph as pg

        self.plot = pg.PlotWidget()
        self.plot.setMouseEnabled(x=False, y=False)
        self.plot.setLabel("left", "images")
        self.plot.setBackground("w")
        self._layout.addWidget(self.plot)
