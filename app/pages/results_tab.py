"""The dashboard's Results tab: the best epoch's confusion matrix and per-class accuracy."""

from __future__ import annotations

import numpy as np
import pyqtgraph as pg
from PySide6.QtWidgets import QSplitter, QWidget

from app.pages.plots import COLORS, image_plot, make_plot
from app.run_model import RunModel

MAX_ANNOTATED_CLASSES = 20  # counts are written in the cells up to this many classes


class ResultsTab(QSplitter):
    def __init__(self, parent: QWidget | None = None):
        super().__init__(parent)
        self.model: RunModel | None = None
        self.confusion_plot, self.confusion_image = image_plot("Confusion matrix, best epoch (rows: true class)",
                                                               "CET-L12")
        self.confusion_plot.getViewBox().invertY(True)
        self.confusion_plot.setMouseEnabled(x=False, y=False)
        self._confusion_texts: list = []
        self.class_plot = make_plot("Per-class accuracy (best epoch)", "accuracy", "class")
        self.class_plot.setMouseEnabled(x=False, y=False)
        self.addWidget(self.confusion_plot)
        self.addWidget(self.class_plot)

    def set_model(self, model: RunModel) -> None:
        self.model = model

    def redraw(self) -> None:
        m = self.model
        best = m.best_epoch if m is not None else None
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
        if len(classes) <= MAX_ANNOTATED_CLASSES:
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
        # a class with no validation images has no accuracy (null): drawn as an empty slot, not as 0%
        acc = [np.nan if a is None else a for a in best.get("per_class_acc", [])]
        self.class_plot.addItem(pg.BarGraphItem(x=list(range(len(acc))), height=np.nan_to_num(acc), width=0.7,
                                                brush=COLORS[2]))
        self.class_plot.getAxis("bottom").setTicks(ticks)
        self.class_plot.setYRange(0, 1)
