"""The map of a run's images (issue #35): RUN/audit/map.csv (`main.py audit RUN --map`) as a pyqtgraph scatter,
coloured by class, by whether the cross-fitted probe agrees with the label, or by what the audit found. Hovering
names the image and shows it; Shift+drag draws a lasso; the selection can be shown in the gallery, left out of
training or relabelled (through the manifest, like the gallery's actions).
"""

from __future__ import annotations

import csv
import html

import numpy as np
import pyqtgraph as pg
from PySide6.QtCore import QPointF, Qt, Signal
from PySide6.QtGui import QColor, QPainterPath, QPen, QPixmap
from PySide6.QtWidgets import QComboBox, QGraphicsPathItem, QHBoxLayout, QLabel, QPushButton, QVBoxLayout, QWidget

from app.jobs.background import CliJob, run_in_thread
from app.widgets.thumbnails import load_thumbnails
from trainer.core.csvfile import true_text
from trainer.runs.commands import Audit

HOVER_THUMB = 96
FINDING_COLOURS = {"label issue": "#d62728", "outlier": "#ff7f0e", "unsure": "#17becf", "copy": "#9467bd",
                   "leak": "#e377c2", "": "#c8c8c8"}
LEGEND_CLASSES = 30  # classes named in the legend; beyond them, hovering says
COLOUR_BY = ("class", "probe agrees with the label", "what the audit found")


def read_map(path: str) -> list[dict]:
    """map.csv's rows, x and y as numbers (the CSV writer guards cells that start with a minus sign)."""
    with open(path, newline="", encoding="utf-8") as f:
        rows = list(csv.DictReader(f))
    for row in rows:
        row["path"] = true_text(row["path"])
        row["x"], row["y"] = float(true_text(row["x"])), float(true_text(row["y"]))
    return rows


def inside(points: np.ndarray, polygon: np.ndarray) -> np.ndarray:
    """Which of the (n, 2) `points` lie inside `polygon` (m, 2): even-odd ray casting, vectorised over the points."""
    x, y = points[:, 0], points[:, 1]
    hit = np.zeros(len(points), bool)
    for (x1, y1), (x2, y2) in zip(polygon, np.roll(polygon, -1, axis=0)):
        crosses = (y1 > y) != (y2 > y)
        with np.errstate(divide="ignore", invalid="ignore"):
            at = x1 + (y - y1) * (x2 - x1) / (y2 - y1)
        hit ^= crosses & (x < at)
    return hit


class LassoViewBox(pg.ViewBox):
    """A ViewBox that pans as usual, and draws a lasso with Shift+drag (`lassoed` carries its polygon)."""

    lassoed = Signal(object)  # an (m, 2) array in data coordinates

    def __init__(self):
        super().__init__()
        self._path: list[QPointF] = []
        self._drawn = QGraphicsPathItem()
        self._drawn.setPen(QPen(QColor("#333333"), 0, Qt.PenStyle.DashLine))
        self.addItem(self._drawn, ignoreBounds=True)

    def mouseDragEvent(self, ev, axis=None):  # noqa: N802 - pyqtgraph's name
        if not ev.modifiers() & Qt.KeyboardModifier.ShiftModifier:
            return super().mouseDragEvent(ev, axis)
        ev.accept()
        self._path.append(self.mapSceneToView(ev.scenePos()))
        drawn = QPainterPath(self._path[0])
        for p in self._path[1:]:
            drawn.lineTo(p)
        self._drawn.setPath(drawn)
        if ev.isFinish():
            polygon = np.array([[p.x(), p.y()] for p in self._path])
            self._path = []
            self._drawn.setPath(QPainterPath())
            if len(polygon) >= 3:
                self.lassoed.emit(polygon)


class DataMap(QWidget):
    """The map's tab: a button to draw it, the scatter, what is hovered, the selection's actions."""

    showRequested = Signal(list)  # the selected rows (dicts of map.csv), for the gallery
    marksRequested = Signal(list, object)  # image paths, new class (None: exclude)

    def __init__(self, parent: QWidget | None = None, relabel: bool = True):
        """`relabel`: offer Relabel as (one class for the whole selection; a multi-label run's images each take
        the probe's set in the gallery instead)."""
        super().__init__(parent)
        self.run_path = ""
        self.rows: list[dict] = []
        self.xy = np.zeros((0, 2))
        self.selected = np.zeros(0, bool)
        self._job: CliJob | None = None
        self._hovered = ""
        self.draw_button = QPushButton("Draw the map")
        self.draw_button.setObjectName("drawMap")
        self.draw_button.setToolTip("main.py audit --map: the run's embeddings in two dimensions (UMAP, else t-SNE), "
                                    "in a separate process")
        self.draw_button.clicked.connect(self.draw)
        self.colour_by = QComboBox()
        self.colour_by.addItems(COLOUR_BY)
        self.colour_by.currentIndexChanged.connect(self._colour)
        self.legend = QLabel("")
        self.legend.setObjectName("mapLegend")
        self.legend.setWordWrap(True)
        self.status = QLabel("Shift+drag: lasso")
        self.status.setWordWrap(True)
        self.hover_image = QLabel()
        self.hover_image.setFixedSize(HOVER_THUMB, HOVER_THUMB)
        self.hover_image.setAlignment(Qt.AlignmentFlag.AlignCenter)
        self.box = LassoViewBox()
        self.box.lassoed.connect(self.select_inside)
        self.plot = pg.PlotWidget(viewBox=self.box)
        self.plot.setBackground("w")
        self.plot.hideAxis("left")
        self.plot.hideAxis("bottom")
        self.scatter = pg.ScatterPlotItem(size=6, pen=None, hoverable=True, tip=None)
        self.scatter.sigHovered.connect(self._hover)
        self.chosen = pg.ScatterPlotItem(size=9, pen=pg.mkPen("#000000", width=1.5), brush=None)
        self.plot.addItem(self.scatter)
        self.plot.addItem(self.chosen)
        self.show_button = QPushButton("Show in gallery")
        self.exclude_button = QPushButton("Exclude")
        self.relabel_button = QPushButton("Relabel as")
        self.relabel_choice = QComboBox()
        self.show_button.clicked.connect(lambda: self.showRequested.emit(self.selection()))
        self.exclude_button.clicked.connect(lambda: self._mark(None))
        self.relabel_button.clicked.connect(lambda: self._mark(self.relabel_choice.currentText()))
        self._layout()
        self.relabel_button.setVisible(relabel)  # in the layout by now: shown is not a window of its own
        self.relabel_choice.setVisible(relabel)
        self._enable_actions()

    def _layout(self) -> None:
        top = QHBoxLayout()
        top.addWidget(self.draw_button)
        top.addWidget(QLabel("Colour by"))
        top.addWidget(self.colour_by, 1)
        hover = QHBoxLayout()
        hover.addWidget(self.hover_image)
        hover.addWidget(self.status, 1)
        actions = QHBoxLayout()
        for w in (self.show_button, self.exclude_button, self.relabel_button, self.relabel_choice):
            actions.addWidget(w)
        layout = QVBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 0)
        layout.addLayout(top)
        layout.addWidget(self.legend)
        layout.addWidget(self.plot, 1)
        layout.addLayout(hover)
        layout.addLayout(actions)

    def set_run(self, run_path: str) -> None:
        if run_path != self.run_path:
            self.run_path = run_path
            self.show_rows([])

    def draw(self) -> None:
        """`main.py audit RUN --map --json` in a subprocess, then the map it kept."""
        if not self.run_path or self._job is not None:
            return
        self.draw_button.setEnabled(False)
        self.status.setText("Auditing the run's images and projecting their embeddings…")
        self._job = CliJob(Audit(run_dir=str(self.run_path), map=True, json=True), self)
        self._job.done.connect(self._drawn)
        self._job.failed.connect(self._failed)

    def _failed(self, error: str) -> None:
        self._job = None
        self.draw_button.setEnabled(True)
        self.status.setText(f"<span style='color:#c9302c'>Map: {html.escape(error)}</span>")

    def _drawn(self, report: dict) -> None:
        self._job = None
        self.draw_button.setEnabled(True)
        path = report["map"]
        run_in_thread(lambda: read_map(path), lambda rows: self.show_rows(rows, report.get("map_how", "")),
                      self._failed, owner=self)

    def show_rows(self, rows: list[dict], how: str = "") -> None:
        self.rows = rows
        self.xy = np.array([[r["x"], r["y"]] for r in rows]) if rows else np.zeros((0, 2))
        self.selected = np.zeros(len(rows), bool)
        classes = sorted({r["label"] for r in rows})
        self.relabel_choice.clear()
        self.relabel_choice.addItems(classes)
        self._colour()
        self._show_selection()
        self.box.autoRange()
        if rows:
            self.status.setText(f"{len(rows)} images ({html.escape(how)}). Hover for an image; Shift+drag: lasso")

    def _colour(self) -> None:
        if not self.rows:
            self.scatter.setData([])
            self.legend.setText("")
            return
        by = self.colour_by.currentIndex()
        classes = sorted({r["label"] for r in self.rows})
        palette = {c: pg.intColor(i, hues=max(len(classes), 1)) for i, c in enumerate(classes)}
        self.legend.setText(self._legend(by, palette))
        if by == 0:
            brushes = [palette[r["label"]] for r in self.rows]
        elif by == 1:
            brushes = [QColor("#c8c8c8") if not r["suggested"] else QColor("#2ca02c") if r["suggested"] == r["label"]
                       else QColor("#d62728") for r in self.rows]
        else:
            brushes = [QColor(FINDING_COLOURS.get(r["finding"], "#c8c8c8")) for r in self.rows]
        self.scatter.setData(pos=self.xy, brush=brushes, data=list(range(len(self.rows))))

    @staticmethod
    def _legend(by: int, palette: dict[str, QColor]) -> str:
        """What each colour means (by class: each class's own colour, the first LEGEND_CLASSES of them)."""
        def dot(colour: str, what: str) -> str:
            return f"<span style='color:{colour}'>●</span> {what}"

        if by == 0:
            shown = [dot(colour.name(), html.escape(name)) for name, colour in list(palette.items())[:LEGEND_CLASSES]]
            more = len(palette) - LEGEND_CLASSES
            return " · ".join(shown) + (f" · and {more} more classes (hover for an image's class)" if more > 0 else "")
        if by == 1:
            return " · ".join([dot("#2ca02c", "the probe agrees"), dot("#d62728", "it does not"),
                               dot("#c8c8c8", "a test image")])
        return " · ".join(dot(c, w or "nothing found") for w, c in FINDING_COLOURS.items())

    def _hover(self, item, points, ev) -> None:
        if not len(points):
            return
        row = self.rows[points[0].data()]
        if row["path"] == self._hovered:
            return
        self._hovered = path = row["path"]
        finding = f" · {row['finding']}" if row["finding"] else ""
        suggested = f", the probe says {html.escape(row['suggested'])}" if row["suggested"] else ""
        self.status.setText(f"<b>{html.escape(row['label'])}</b> ({row['split']}{suggested}){finding}<br>"
                            f"<span style='color:#777'>{html.escape(path)}</span>")
        run_in_thread(lambda: load_thumbnails([path], HOVER_THUMB)[0], lambda image: self._hover_image(path, image),
                      owner=self)

    def _hover_image(self, path: str, image) -> None:
        if path == self._hovered and not image.isNull():
            self.hover_image.setPixmap(QPixmap.fromImage(image))

    def select_inside(self, polygon: np.ndarray) -> None:
        self.selected = inside(self.xy, polygon) if len(self.xy) else np.zeros(0, bool)
        self._show_selection()

    def selection(self) -> list[dict]:
        return [r for r, on in zip(self.rows, self.selected) if on]

    def _show_selection(self) -> None:
        self.chosen.setData(pos=self.xy[self.selected] if len(self.xy) else [])
        n = int(self.selected.sum())
        self.show_button.setText(f"Show {n} in gallery" if n else "Show in gallery")
        self._enable_actions()

    def _enable_actions(self) -> None:
        on = bool(self.selected.any()) if len(self.selected) else False
        for w in (self.show_button, self.exclude_button, self.relabel_button, self.relabel_choice):
            w.setEnabled(on)

    def _mark(self, new_class: str | None) -> None:
        """The selection's training and validation images left out or relabelled (a test image cannot be: the
        manifest is for what the run learns from)."""
        paths = [row["path"] for row in self.selection() if row["split"] != "test"]
        if paths:
            self.marksRequested.emit(paths, new_class)
