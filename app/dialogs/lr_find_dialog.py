"""The learning-rate finder's answer: its loss-vs-lr curve, its suggestion, and a button to use it."""

from __future__ import annotations

import numpy as np
import pyqtgraph as pg
from PySide6.QtCore import Qt
from PySide6.QtWidgets import QDialog, QDialogButtonBox, QVBoxLayout, QWidget


class LrFindDialog(QDialog):
    """The finder's loss-vs-lr curve, its suggestion, and a button to use it."""

    def __init__(self, result: dict, use, parent: QWidget | None = None):
        super().__init__(parent)
        self.setWindowTitle("Learning-rate finder")
        self.resize(640, 420)
        plot = pg.PlotWidget(title="Smoothed loss while the learning rate grows")
        plot.setBackground("w")
        plot.setLogMode(x=True, y=False)
        plot.setLabel("bottom", "learning rate")
        plot.setLabel("left", "loss")
        self.result = result
        self.curve = plot.plot(result["lrs"], result["losses"], pen=pg.mkPen("#1f77b4", width=2))
        lr = result["suggested_lr"]
        plot.addItem(pg.InfiniteLine(pos=np.log10(lr), angle=90, pen=pg.mkPen("#d62728", style=Qt.PenStyle.DashLine)))
        buttons = QDialogButtonBox(QDialogButtonBox.StandardButton.Close)
        apply = buttons.addButton(f"Use lr = {lr:.3g}", QDialogButtonBox.ButtonRole.AcceptRole)
        apply.setObjectName("useSuggestedLr")
        apply.clicked.connect(lambda: (use(lr), self.accept()))
        buttons.rejected.connect(self.reject)
        layout = QVBoxLayout(self)
        layout.addWidget(plot)
        layout.addWidget(buttons)
