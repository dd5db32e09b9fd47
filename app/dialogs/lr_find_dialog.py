"""The learning-rate finder's curve: the smoothed loss against the learning rate, drawn as the sweep measures it
(the trainer streams each point); at its end the suggestion, marked, and a button to use it, or, where the curve has
no minimum inside its range, the trainer's reason and a button to sweep the wider range it proposes. Closing it gives
the sweep up."""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np
import pyqtgraph as pg
from PySide6.QtCore import Qt
from PySide6.QtWidgets import QDialog, QDialogButtonBox, QLabel, QVBoxLayout, QWidget


class LrFindDialog(QDialog):
    def __init__(self, use: Callable[[float], None], parent: QWidget | None = None,
                 extend: Callable[[tuple[float, float]], None] | None = None):
        super().__init__(parent)
        self.setWindowTitle("Learning-rate finder")
        self.resize(640, 420)
        self.use, self.extend = use, extend
        self.result: dict | None = None  # the whole sweep, once it has ended
        self.lrs: list[float] = []
        self.losses: list[float] = []
        self.plot = pg.PlotWidget(title="Smoothed loss while the learning rate grows")
        self.plot.setBackground("w")
        self.plot.setLogMode(x=True, y=False)
        self.plot.setLabel("bottom", "learning rate")
        self.plot.setLabel("left", "loss")
        # ticks that stay put and read as learning rates: one label a decade (1e-05, 0.0001, ...), the view a whole
        # number of decades that grows with the sweep, no "(x0.001)" prefix on either axis
        for side in ("bottom", "left"):
            self.plot.getAxis(side).enableAutoSIPrefix(False)
        self.plot.getAxis("bottom").setTickSpacing(1, 1)
        self.plot.getViewBox().enableAutoRange(axis="x", enable=False)
        self.decades: tuple[int, int] | None = None
        self.curve = self.plot.plot([], [], pen=pg.mkPen("#1f77b4", width=2), symbol="o", symbolSize=4)
        self.state = QLabel("Sweeping: building the data and the model, then one point per step…")
        self.state.setObjectName("lrFindState")
        self.state.setWordWrap(True)
        buttons = QDialogButtonBox(QDialogButtonBox.StandardButton.Close)
        self.apply = buttons.addButton("Use the suggestion", QDialogButtonBox.ButtonRole.AcceptRole)
        self.apply.setObjectName("useSuggestedLr")
        self.apply.setEnabled(False)
        self.apply.clicked.connect(self._use)
        self.wider = buttons.addButton("Sweep a wider range", QDialogButtonBox.ButtonRole.ActionRole)
        self.wider.setObjectName("extendLrRange")
        self.wider.hide()
        self.wider.clicked.connect(self._extend)
        buttons.rejected.connect(self.reject)
        layout = QVBoxLayout(self)
        layout.addWidget(self.plot)
        layout.addWidget(self.state)
        layout.addWidget(buttons)

    def add_point(self, lr: float, loss: float) -> None:
        self.lrs.append(lr)
        self.losses.append(loss)
        self.curve.setData(self.lrs, self.losses)
        self._fit_decades(self.lrs)
        self.state.setText(f"Sweeping: {len(self.lrs)} steps, lr {lr:.3g}, smoothed loss {loss:.4g}")

    def finish(self, result: dict) -> None:
        """The whole sweep (the trainer's answer): its curve, the suggestion marked, the button to use it."""
        self.result = result
        self.curve.setData(result["lrs"], result["losses"])
        self._fit_decades(result["lrs"])
        lr = result["suggested_lr"]
        if lr is None:  # no minimum inside the range: the trainer's reason, and the range it proposes instead
            low, high = result["extend"]
            self.apply.hide()
            self.wider.setText(f"Sweep {low:.3g} to {high:.3g}")
            self.wider.setVisible(self.extend is not None)
            self.state.setText(f"{result['why'][0].upper()}{result['why'][1:]}, from {len(result['lrs'])} steps.")
            return
        self.plot.addItem(pg.InfiniteLine(pos=np.log10(lr), angle=90,
                                          pen=pg.mkPen("#d62728", style=Qt.PenStyle.DashLine)))
        self.apply.setText(f"Use lr = {lr:.3g}")
        self.apply.setEnabled(True)
        self.state.setText(f"Suggested: {lr:.3g} ({result['why']}), from {len(result['lrs'])} steps")

    def _fit_decades(self, lrs: list[float]) -> None:
        """The x view: the whole decades the learning rates lie in (changed only when the sweep enters another)."""
        positive = [lr for lr in lrs if lr > 0]
        if not positive:
            return
        decades = math.floor(math.log10(min(positive))), max(math.ceil(math.log10(max(positive))),
                                                             math.floor(math.log10(min(positive))) + 1)
        if decades != self.decades:
            self.decades = decades
            self.plot.setXRange(*decades, padding=0)

    def fail(self, error: str) -> None:
        self.state.setText(f"The sweep failed: {error}")
        self.state.setStyleSheet("color: #c9302c;")

    def _use(self) -> None:
        self.use(self.result["suggested_lr"])
        self.accept()

    def _extend(self) -> None:
        self.extend(tuple(self.result["extend"]))
