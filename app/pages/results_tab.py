"""The dashboard's Results tab: what the model gets wrong, and why.

Left: the confusion matrix of an evaluation (the best epoch's validation set, the test set, or any evaluated
folder) as a table that scrolls and zooms, in counts or row percentages; clicking a cell shows its images. Right:
the gallery (top losses by default), the most confused pairs, per-class figures and the reliability diagram; below
them the selected image with its top classes, a Grad-CAM overlay computed on demand in a subprocess, and the
manifest actions (exclude, relabel). Everything is read from the files under RUN_DIR/eval/, off the GUI thread.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import pyqtgraph as pg
from PySide6.QtCore import QAbstractTableModel, QModelIndex, Qt, QTimer, Signal
from PySide6.QtGui import QColor, QFont, QImage, QKeySequence, QPixmap, QShortcut
from PySide6.QtWidgets import (
    QButtonGroup,
    QComboBox,
    QGridLayout,
    QHBoxLayout,
    QHeaderView,
    QLabel,
    QListWidgetItem,
    QPushButton,
    QRadioButton,
    QSizePolicy,
    QSlider,
    QSplitter,
    QStackedWidget,
    QTableView,
    QTableWidget,
    QTableWidgetItem,
    QTabWidget,
    QVBoxLayout,
    QWidget,
)

from app.audit_gallery import audit_gallery, audit_measure, score_text
from app.background import CliJob, run_in_thread
from app.data_map_view import DataMap
from app.eval_results import (
    Evaluation,
    MultiLabelEvaluation,
    Prediction,
    evaluation_label,
    evaluation_names,
    most_confused,
    mtime,
    read_evaluation,
)
from app.pages.multilabel_view import MultiLabelView
from app.pages.plots import NumericItem
from app.run_model import RunModel
from app.thumbnails import load_pair_thumbnails, scaled_pixmap, set_gallery_icons, thumbnail_gallery

EXCLUDE_TIP = ("leave this image out of training: an entry in the dataset manifest (data.exclude); the file itself "
               "is not touched")
NOT_IN_TRAINING = "this image is not in the training folder (data.train_dir): there is nothing to leave out or relabel"
THUMB = 96
PREVIEW = 180
GALLERY_LIMIT = 300  # thumbnails shown at once (the highest losses); the count says how many there are
NAMES_ON_TOP = 12  # up to this many classes the predicted-class header shows names, else indices (names on hover)
HEADER_MARGIN = 8  # px beside a column's label (the header draws no sort arrow)
LOW, HIGH = QColor(255, 255, 255), QColor(31, 94, 168)


def _blend(share: float) -> QColor:
    s = max(0.0, min(1.0, share))
    return QColor(*(round(a + (b - a) * s) for a, b in zip(LOW.getRgb()[:3], HIGH.getRgb()[:3])))


class ConfusionModel(QAbstractTableModel):
    """Rows: true class; columns: predicted class; cells coloured by the share of their row."""

    def __init__(self):
        super().__init__()
        self.matrix: list[list[int]] = []
        self.classes: list[str] = []
        self.normalised = False
        self.numbered = False  # columns headed by the class's number (the rows name it) when the names do not fit

    def set_matrix(self, matrix: list[list[int]], classes: list[str]) -> None:
        self.beginResetModel()
        if classes != self.classes:
            self.numbered = False  # names again, until they are found not to fit
        self.matrix, self.classes = matrix, classes
        self.endResetModel()

    def set_normalised(self, on: bool) -> None:
        self.normalised = on
        if self.matrix:
            self.dataChanged.emit(self.index(0, 0), self.index(len(self.matrix) - 1, len(self.matrix) - 1))

    def rowCount(self, parent=QModelIndex()) -> int:  # noqa: N802 - Qt's name
        return 0 if parent.isValid() else len(self.matrix)

    def columnCount(self, parent=QModelIndex()) -> int:  # noqa: N802
        return 0 if parent.isValid() else len(self.matrix)

    def share(self, row: int, col: int) -> float:
        total = sum(self.matrix[row])
        return self.matrix[row][col] / total if total else 0.0

    def data(self, index: QModelIndex, role=Qt.ItemDataRole.DisplayRole):
        if not index.isValid():
            return None
        r, c = index.row(), index.column()
        n, share = self.matrix[r][c], self.share(r, c)
        if role == Qt.ItemDataRole.DisplayRole:
            return (f"{100 * share:.0f}" if n else "") if self.normalised else (str(n) if n else "")
        if role == Qt.ItemDataRole.BackgroundRole:
            return _blend(share)
        if role == Qt.ItemDataRole.ForegroundRole:
            return QColor("white") if share > 0.5 else QColor("#222")
        if role == Qt.ItemDataRole.TextAlignmentRole:
            return Qt.AlignmentFlag.AlignCenter
        if role == Qt.ItemDataRole.ToolTipRole:
            return (f"true {self.classes[r]} → predicted {self.classes[c]}: {n} image(s), {100 * share:.1f}% of "
                    f"{self.classes[r]}\nclick to show them")
        return None

    def headerData(self, section: int, orientation, role=Qt.ItemDataRole.DisplayRole):  # noqa: N802
        if section >= len(self.classes):
            return None
        name = self.classes[section]
        if role == Qt.ItemDataRole.DisplayRole:
            numbered = self.numbered or len(self.classes) > NAMES_ON_TOP
            if orientation == Qt.Orientation.Vertical:
                return f"{name}  {section}" if numbered else name
            return str(section) if numbered else name
        if role == Qt.ItemDataRole.ToolTipRole:
            return f"{'predicted' if orientation == Qt.Orientation.Horizontal else 'true'}: {name}"
        return None


class ResultsTab(QWidget):
    markRequested = Signal(str, object)  # image path, new class (None: exclude from training)
    undoRequested = Signal(str)  # image path
    labelPoolRequested = Signal(str)  # the run's path: label a pool of images with its network's help
    marksRequested = Signal(list, object)  # image paths, new class (None: exclude): the map's selection

    def __init__(self, parent: QWidget | None = None):
        super().__init__(parent)
        self.model: RunModel | None = None
        self.evaluation: Evaluation | None = None
        self.shown: list[Prediction] = []
        self.selected: Prediction | None = None
        self.marked: dict[str, str | None] = {}  # real path -> class (None: excluded), from the Dataset page
        self._loaded: tuple = ()
        self._eval_serial = 0
        self._thumb_serial = 0
        self._cam_job: CliJob | None = None
        self._cam_dir: tempfile.TemporaryDirectory | None = None  # made at the first Grad-CAM

        left = self._build_matrix()
        self._build_side_tabs()
        detail_box = self._build_details()

        right = QSplitter(Qt.Orientation.Vertical)
        right.addWidget(self.side_tabs)
        right.addWidget(detail_box)
        right.setSizes([420, PREVIEW])
        splitter = QSplitter()
        splitter.addWidget(left)
        splitter.addWidget(right)
        splitter.setStretchFactor(0, 1)
        splitter.setStretchFactor(1, 1)
        splitter.setSizes([500, 500])  # the matrix gets half: four classes fit without scrolling at 1280 px
        self.multilabel = MultiLabelView()  # a multi-label run's results, in place of the matrix and its gallery
        self.multilabel.set_choice.setModel(self.eval_choice.model())
        self.multilabel.set_choice.currentIndexChanged.connect(self.eval_choice.setCurrentIndex)
        self.eval_choice.currentIndexChanged.connect(self._sync_set_choice)
        self.multilabel.marksRequested.connect(self.marksRequested)
        self.pages = QStackedWidget()
        self.pages.addWidget(splitter)
        self.pages.addWidget(self.multilabel)
        layout = QVBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 0)
        layout.addWidget(self.pages)

    def _sync_set_choice(self, index: int) -> None:
        self.multilabel.set_choice.blockSignals(True)
        self.multilabel.set_choice.setCurrentIndex(index)
        self.multilabel.set_choice.blockSignals(False)

    def _build_matrix(self) -> QWidget:
        """The left pane: which evaluation, counts or row shares, the zoom, the headline and the confusion matrix."""
        self.eval_choice = QComboBox()
        self.eval_choice.setObjectName("evaluationChoice")
        self.eval_choice.setToolTip("the best epoch's validation set (val), the test set, or an evaluated folder")
        self.eval_choice.currentTextChanged.connect(lambda _: self.redraw(force=True))
        self.counts = QRadioButton("Counts")
        self.counts.setChecked(True)
        self.row_share = QRadioButton("Row %")
        self.row_share.setObjectName("rowShare")
        group = QButtonGroup(self)
        group.addButton(self.counts)
        group.addButton(self.row_share)
        self.row_share.toggled.connect(lambda on: self.matrix_model.set_normalised(on))
        self.zoom = QSlider(Qt.Orientation.Horizontal)
        self.zoom.setObjectName("matrixZoom")
        self.zoom.setRange(18, 90)
        self.zoom.setValue(44)
        self.zoom.setToolTip("cell size")
        self.zoom.valueChanged.connect(self._zoom)
        self.zoom.setMinimumWidth(80)
        self._auto_zoom = True  # cells fit the pane (on show and resize) until the user zooms by hand
        self.zoom.sliderMoved.connect(lambda _: setattr(self, "_auto_zoom", False))
        self.headline = QLabel("")
        self.headline.setObjectName("evalHeadline")
        self.headline.setWordWrap(True)
        self.matrix_model = ConfusionModel()
        self.matrix = QTableView()
        self.matrix.setObjectName("confusionMatrix")
        self.matrix.setModel(self.matrix_model)
        self.matrix.setSelectionMode(QTableView.SelectionMode.SingleSelection)
        self.matrix.clicked.connect(self._cell_clicked)
        self.matrix.verticalHeader().setSectionResizeMode(QHeaderView.ResizeMode.Fixed)
        self.matrix.horizontalHeader().setSectionResizeMode(QHeaderView.ResizeMode.Fixed)
        self._zoom(self.zoom.value())

        self.eval_choice.setSizeAdjustPolicy(QComboBox.SizeAdjustPolicy.AdjustToMinimumContentsLengthWithIcon)
        self.eval_choice.setMinimumContentsLength(12)
        bar = QHBoxLayout()
        bar.addWidget(QLabel("Set"))
        bar.addWidget(self.eval_choice, 1)
        view = QHBoxLayout()
        view.addWidget(self.counts)
        view.addWidget(self.row_share)
        view.addWidget(QLabel("Zoom"))
        view.addWidget(self.zoom, 1)
        left = QWidget()
        ll = QVBoxLayout(left)
        ll.setContentsMargins(0, 0, 0, 0)
        ll.addLayout(bar)
        ll.addLayout(view)
        ll.addWidget(self.headline)
        caption = QLabel("Confusion matrix: rows are the true class, columns the predicted one")
        caption.setWordWrap(True)
        ll.addWidget(caption)
        ll.addWidget(self.matrix, 1)
        return left

    def _build_side_tabs(self) -> None:
        """The gallery of a cell's images, the most confused pairs, per-class figures and the reliability diagram."""
        self.gallery_title = QLabel("")
        self.gallery_title.setObjectName("galleryTitle")
        self.gallery_title.setWordWrap(True)  # a long title wraps: it must not widen the pane past the window
        self.gallery_title.setSizePolicy(QSizePolicy.Policy.Ignored, QSizePolicy.Policy.Preferred)
        self.all_errors = QPushButton("All errors")
        self.all_errors.setToolTip("the misclassified images, highest loss first")
        self.all_errors.clicked.connect(self.show_errors)
        self.issues_button = QPushButton("Label issues")
        self.issues_button.setObjectName("labelIssues")
        self.issues_button.setToolTip("the run's images that are probably labelled wrong, most likely first (main.py "
                                      "audit: confident learning on out-of-sample probabilities, in a separate "
                                      "process). Keys: E exclude, R relabel as suggested, K keep (next)")
        self.issues_button.clicked.connect(lambda: self.find_label_issues("suspects"))
        self.outliers_button = QPushButton("Outliers")
        self.outliers_button.setObjectName("outliers")
        self.outliers_button.setToolTip("the run's images farthest from every other (their embeddings' distance to "
                                        "their nearest ones), for a look: E exclude, K keep")
        self.outliers_button.clicked.connect(lambda: self.find_label_issues("outliers"))
        self.copies_button = QPushButton("Copies")
        self.copies_button.setObjectName("copies")
        self.copies_button.setToolTip("images that are copies of another (byte-identical, resized or recompressed), "
                                      "a leak when the other is a validation or test image: each beside the image it "
                                      "copies, E excludes the copy from training, K keeps it")
        self.copies_button.clicked.connect(lambda: self.find_label_issues("copies"))
        self.label_pool_button = QPushButton("Label a pool…")
        self.label_pool_button.setObjectName("labelPool")
        self.label_pool_button.setToolTip("label a folder of new images one at a time, the ones this run's network is "
                                          "least sure of first (main.py label); the labels go into the manifest")
        self.label_pool_button.clicked.connect(lambda: self.model and self.labelPoolRequested.emit(
            str(self.model.run.path)))
        self._issues_job: CliJob | None = None
        self._audit: tuple[str, dict] | None = None  # (run path, `main.py audit --json`'s report) last read
        self.gallery = thumbnail_gallery("gallery", THUMB)
        self.gallery.currentRowChanged.connect(self._select)
        gallery_box = QWidget()
        gl = QVBoxLayout(gallery_box)
        gl.setContentsMargins(0, 0, 0, 0)
        row = QHBoxLayout()  # the buttons above the title: a long title wraps over the gallery's whole width
        row.addWidget(self.all_errors)
        row.addWidget(self.issues_button)
        row.addWidget(self.outliers_button)
        row.addWidget(self.copies_button)
        row.addStretch(1)
        row.addWidget(self.label_pool_button)
        for key, action in (("E", lambda: self._decide(None)), ("R", lambda: self._decide("suggested")),
                            ("K", self._keep)):  # one key per decision while going down the list
            QShortcut(QKeySequence(key), self.gallery, action, context=Qt.ShortcutContext.WidgetShortcut)
        gl.addLayout(row)
        gl.addWidget(self.gallery_title)
        gl.addWidget(self.gallery, 1)

        self.pairs = QTableWidget(0, 3)
        self.pairs.setObjectName("confusedPairs")
        self.pairs.setHorizontalHeaderLabels(["true class", "predicted as", "images"])
        self.pairs.horizontalHeader().setSectionResizeMode(QHeaderView.ResizeMode.Stretch)
        self.pairs.verticalHeader().hide()
        self.pairs.setEditTriggers(QTableWidget.EditTrigger.NoEditTriggers)
        self.pairs.setSelectionBehavior(QTableWidget.SelectionBehavior.SelectRows)
        self.pairs.cellClicked.connect(lambda r, _: self.show_cell(self.pairs.item(r, 0).text(),
                                                                   self.pairs.item(r, 1).text()))
        self.per_class = QTableWidget(0, 5)
        self.per_class.setObjectName("perClass")
        self.per_class.setHorizontalHeaderLabels(["class", "precision", "recall", "F1", "images"])
        self.per_class.horizontalHeader().setSectionResizeMode(0, QHeaderView.ResizeMode.Stretch)
        self.per_class.verticalHeader().hide()
        self.per_class.setEditTriggers(QTableWidget.EditTrigger.NoEditTriggers)
        self.per_class.setSortingEnabled(True)
        self.reliability = pg.PlotWidget(title="Reliability: accuracy against confidence")
        self.reliability.setBackground("w")
        self.reliability.setLabel("bottom", "confidence")
        self.reliability.setLabel("left", "accuracy")
        self.reliability.setMouseEnabled(x=False, y=False)
        self.side_tabs = QTabWidget()
        self.side_tabs.addTab(gallery_box, "Gallery")
        self.side_tabs.addTab(self.pairs, "Most confused")
        self.side_tabs.addTab(self.per_class, "Per class")
        self.side_tabs.addTab(self.reliability, "Calibration")
        self.data_map = DataMap()
        self.data_map.setObjectName("dataMap")
        self.data_map.showRequested.connect(self._show_on_map)
        self.data_map.marksRequested.connect(self.marksRequested)
        self.side_tabs.addTab(self.data_map, "Map")

    def _build_details(self) -> QWidget:
        """The selected image: its preview, what the network said, Grad-CAM and the manifest's actions."""
        self.preview = QLabel("Select an image")
        self.preview.setObjectName("preview")
        self.preview.setFixedSize(PREVIEW, PREVIEW)
        self.preview.setAlignment(Qt.AlignmentFlag.AlignCenter)
        self.preview.setStyleSheet("background: #f4f4f4; border: 1px solid #ddd;")
        self.details = QLabel("")
        self.details.setObjectName("imageDetails")
        self.details.setWordWrap(True)
        self.details.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        self.cam_button = QPushButton("Grad-CAM")
        self.cam_button.setObjectName("gradCam")
        self.cam_button.setToolTip("where the network sees the evidence for its prediction (computed from the "
                                   "checkpoint in a separate process)")
        self.cam_button.clicked.connect(self.grad_cam)
        # wide enough for "Computing…" from the start: the row no longer jumps when it says so
        self.cam_button.setText("Computing…")
        self.cam_button.setMinimumWidth(self.cam_button.sizeHint().width())
        self.cam_button.setText("Grad-CAM")
        self.exclude_button = QPushButton("Exclude")
        self.exclude_button.setToolTip(EXCLUDE_TIP)
        self.exclude_button.setObjectName("excludeImage")
        self.exclude_button.clicked.connect(lambda: self._mark(None))
        self.relabel_choice = QComboBox()
        self.relabel_choice.setObjectName("relabelChoice")
        self.relabel_button = QPushButton("Relabel as")
        self.relabel_button.setObjectName("relabelImage")
        self.relabel_button.clicked.connect(lambda: self._mark(self.relabel_choice.currentText()))
        self.undo_button = QPushButton("Undo")
        self.undo_button.setObjectName("undoMark")
        self.undo_button.clicked.connect(lambda: self.selected and self.undoRequested.emit(self.selected.path))
        actions = QGridLayout()  # two rows: fits beside the preview on a laptop screen
        actions.addWidget(self.cam_button, 0, 0)
        actions.addWidget(self.exclude_button, 0, 1)
        actions.addWidget(self.undo_button, 0, 2)
        actions.addWidget(self.relabel_button, 1, 0)
        actions.addWidget(self.relabel_choice, 1, 1, 1, 2)
        info = QVBoxLayout()
        info.addWidget(self.details, 1)
        info.addLayout(actions)
        detail_box = QWidget()
        dl = QHBoxLayout(detail_box)
        dl.setContentsMargins(0, 0, 0, 0)
        dl.addWidget(self.preview)
        dl.addLayout(info, 1)
        self._enable_actions(False)
        return detail_box

    # ---- binding ---------------------------------------------------------------------------------
    def set_model(self, model: RunModel) -> None:
        self.model = model
        self.evaluation = None
        self.shown = []
        self._loaded = ()
        self.eval_choice.blockSignals(True)
        self.eval_choice.clear()
        self.eval_choice.blockSignals(False)
        self.matrix_model.set_matrix([], [])
        self.pages.setCurrentIndex(0)
        self.gallery.clear()
        self.gallery_title.setText("")
        self.headline.setText("")
        self._select(-1)
        self.data_map.set_run(str(model.run.path))
        self.multilabel.run_path = str(model.run.path)

    def set_marked(self, marked: dict[str, str | None]) -> None:
        """The manifest's entries (real path -> new class, None when excluded), to show beside each image."""
        self.marked = marked
        self.multilabel.set_marked(marked)
        if self.selected is not None:
            self._show_details(self.selected)  # the text only: a Grad-CAM being computed goes on
        self._enable_undo()

    def redraw(self, force: bool = False) -> None:
        """Re-read the chosen evaluation when its files changed (a new best epoch, a finished test set)."""
        m = self.model
        if m is None:
            return
        names = evaluation_names(m.run.path)
        if names != [self.eval_choice.itemData(i) for i in range(self.eval_choice.count())]:
            current = self.eval_choice.currentData()
            self.eval_choice.blockSignals(True)
            self.eval_choice.clear()
            for n in names:  # shown by the folder each evaluated; the name is the item's data
                self.eval_choice.addItem(evaluation_label(m.run.path, n), n)
            if current in names:
                self.eval_choice.setCurrentIndex(names.index(current))
            self.eval_choice.blockSignals(False)
        name = self.eval_choice.currentData() or ""
        if not name:
            self._show_epoch_matrix()
            return
        key = (name, mtime(m.run.path, name))
        if key == self._loaded and not force:
            return
        self._loaded = key
        self._eval_serial += 1
        serial, run_path = self._eval_serial, m.run.path
        run_in_thread(lambda: read_evaluation(run_path, name), lambda ev: self._show(serial, ev),
                      lambda error: self.headline.setText(f"cannot read eval/{name}: {error}"), owner=self)

    def _show_epoch_matrix(self) -> None:
        """A run without per-image predictions (an older run): the best epoch's matrix alone."""
        best = self.model.best_epoch
        if best.get("confusion") and self.matrix_model.matrix != best["confusion"]:
            self.matrix_model.set_matrix(best["confusion"], self.model.start_event.get("classes", []))
            self.headline.setText(f"best epoch {best.get('epoch')}: no per-image predictions were kept for this run")

    def _show(self, serial: int, ev: Evaluation | MultiLabelEvaluation) -> None:
        if serial != self._eval_serial:
            return
        self.evaluation = ev
        if isinstance(ev, MultiLabelEvaluation):
            self.pages.setCurrentWidget(self.multilabel)
            self.multilabel.show_evaluation(ev)
            return
        self.pages.setCurrentIndex(0)
        m = ev.metrics
        top5 = f" · top-5 {100 * m['top5_accuracy']:.1f}%" if m.get("top5_accuracy") is not None else ""
        epoch = f" · epoch {m['epoch']}" if m.get("epoch") is not None else ""
        self.headline.setText(f"<b>{ev.name}: {100 * m['accuracy']:.1f}%</b> of {m['images']} images{top5} · loss "
                              f"{m['loss']:.3f} · calibration error {m['ece']:.3f}{epoch}")
        self.matrix_model.set_matrix(m["confusion"], ev.classes)
        self._fit_zoom()
        self.relabel_choice.clear()
        self.relabel_choice.addItems(ev.classes)
        self.pairs.setRowCount(0)
        for true, predicted, n in most_confused(m["confusion"], ev.classes):
            r = self.pairs.rowCount()
            self.pairs.insertRow(r)
            self.pairs.setItem(r, 0, QTableWidgetItem(true))
            self.pairs.setItem(r, 1, QTableWidgetItem(predicted))
            self.pairs.setItem(r, 2, QTableWidgetItem(str(n)))
        self.per_class.setSortingEnabled(False)
        self.per_class.setRowCount(0)
        for name, f in m["per_class"].items():
            r = self.per_class.rowCount()
            self.per_class.insertRow(r)
            self.per_class.setItem(r, 0, QTableWidgetItem(name))
            for c, key in enumerate(("precision", "recall", "f1", "support"), start=1):
                value = f[key]
                item = NumericItem("—" if value is None else (str(value) if key == "support" else f"{value:.3f}"))
                item.setData(Qt.ItemDataRole.UserRole, value)
                self.per_class.setItem(r, c, item)
        self.per_class.setSortingEnabled(True)
        self._draw_reliability(m)
        self.show_errors()

    def _draw_reliability(self, m: dict) -> None:
        self.reliability.clear()
        bins = [b for b in m.get("reliability", []) if b["count"]]
        self.reliability.plot([0, 1], [0, 1], pen=pg.mkPen("#999", style=Qt.PenStyle.DashLine))
        if bins:
            self.reliability.addItem(pg.BarGraphItem(x=[(b["low"] + b["high"]) / 2 for b in bins],
                                                     height=[b["accuracy"] for b in bins],
                                                     width=bins[0]["high"] - bins[0]["low"], brush="#4a90d9"))
        self.reliability.setTitle(f"Reliability (expected calibration error {m.get('ece', 0):.3f})")
        self.reliability.setRange(xRange=(0, 1), yRange=(0, 1))

    # ---- the gallery -------------------------------------------------------------------------------
    def show_errors(self) -> None:
        if self.evaluation is not None:
            errors = self.evaluation.errors()
            self._fill(errors, f"{len(errors)} misclassified images, highest loss first")

    def find_label_issues(self, kind: str = "suspects") -> None:
        """`main.py audit RUN --json` in a subprocess (a second time it reuses what it kept); its `kind`, "suspects"
        (probably labelled wrong), "copies" (of another image) or "outliers" (far from every other image), fill the
        gallery, worst first."""
        if self.model is None or self._issues_job is not None:
            return
        run = str(self.model.run.path)
        if self._audit is not None and self._audit[0] == run:  # this run's audit, already read: its other lists
            self._issues_found(self._audit[1], kind)
            return
        for button in (self.issues_button, self.outliers_button, self.copies_button):
            button.setEnabled(False)
        self.gallery_title.setText("Auditing the run's images: through its network, then a cross-fitted probe…")
        job = self._issues_job = CliJob(["audit", str(self.model.run.path), "--json"], self)
        job.done.connect(lambda report: self._issues_found(report, kind, run))
        job.failed.connect(self._issues_failed)

    def _issues_found(self, report: dict, kind: str, run: str | None = None) -> None:
        """The audit's `kind` in the gallery; a new report (from `run`) is kept for the run's other lists, which
        then show at once (the decisions taken meanwhile are marked; the lists stay the ones being worked through)."""
        if run is not None:
            self._audit = (run, report)
        self._issues_job = None
        for button in (self.issues_button, self.outliers_button, self.copies_button):
            button.setEnabled(True)
        found, title = audit_gallery(report, kind)
        self._fill(found, title)
        self.side_tabs.setCurrentIndex(0)
        if found:
            self.gallery.setCurrentRow(0)
            self.gallery.setFocus()

    def _issues_failed(self, error: str) -> None:
        self._issues_job = None
        for button in (self.issues_button, self.outliers_button, self.copies_button):
            button.setEnabled(True)
        self.gallery_title.setText(f"Audit: {error}")

    def _decide(self, new_class: str | None) -> None:
        """A key's decision for the selected image (exclude, or relabel as suggested) into the manifest, then on to
        the next; nothing for an image the run does not train on."""
        if self.selected is not None and self.exclude_button.isEnabled():
            self.markRequested.emit(self.selected.path, self.selected.predicted if new_class else None)
            self._keep()

    def _keep(self) -> None:
        """On to the next image (the decision for this one is to leave it as it is, or was just made)."""
        self.gallery.setCurrentRow(min(self.gallery.currentRow() + 1, self.gallery.count() - 1))

    def _show_on_map(self, rows: list[dict]) -> None:
        """The map's selection in the gallery."""
        found = [Prediction(r["path"], r["label"], r["suggested"] or r["label"], 0.0, 0.0, audit="map") for r in rows]
        self._fill(found, f"{len(found)} images chosen on the map (E exclude · R relabel as the probe suggests · "
                          f"K keep)")
        self.side_tabs.setCurrentIndex(0)

    def show_cell(self, true: str, predicted: str) -> None:
        if self.evaluation is None:
            return
        images = self.evaluation.cell(true, predicted)
        what = "correctly classified" if true == predicted else f"predicted as {predicted}"
        self._fill(images, f"{len(images)} images of {true} {what}")
        self.side_tabs.setCurrentIndex(0)

    def _cell_clicked(self, index: QModelIndex) -> None:
        classes = self.matrix_model.classes
        self.show_cell(classes[index.row()], classes[index.column()])

    def _fill(self, predictions: list[Prediction], title: str) -> None:
        self.shown = predictions[:GALLERY_LIMIT]
        more = f" (the first {GALLERY_LIMIT} shown)" if len(predictions) > GALLERY_LIMIT else ""
        self.gallery_title.setText(title + more)
        self.gallery.clear()
        for p in self.shown:
            score = score_text(p) if p.audit else f"{100 * p.confidence:.0f}%"
            item = QListWidgetItem(f"{p.true} → {p.predicted}\n{score}" if p.wrong else f"{p.true}\n{score}")
            item.setToolTip(f"{p.path}\ngiven {p.true}, suggested {p.predicted} ({audit_measure(p)})" if p.audit
                            else f"{p.path}\ntrue {p.true}, predicted {p.predicted} ({100 * p.confidence:.1f}%), "
                                 f"loss {p.loss:.3f}")
            self.gallery.addItem(item)
        self._thumb_serial += 1
        serial, pairs = self._thumb_serial, [(p.path, p.copy_of and p.copy_of[1]) for p in self.shown]
        run_in_thread(lambda: load_pair_thumbnails(pairs, THUMB), lambda images: self._set_icons(serial, images),
                      owner=self)
        self._select(-1)

    def _set_icons(self, serial: int, images: list[QImage]) -> None:
        if serial == self._thumb_serial:  # not a list shown since
            set_gallery_icons(self.gallery, images)

    # ---- the selected image ------------------------------------------------------------------------
    def _select(self, row: int) -> None:
        if self._cam_job is not None:
            self._cam_job.cancel()
            self._cam_job = None
        if not 0 <= row < len(self.shown):
            self.selected = None
            self.preview.setPixmap(QPixmap())
            self.preview.setText("Select an image")
            self.details.setText("")
            self._enable_actions(False)
            return
        p = self.selected = self.shown[row]
        self._show_details(p)
        pair = [(p.path, p.copy_of and p.copy_of[1])]
        run_in_thread(lambda: load_pair_thumbnails(pair, PREVIEW)[0], lambda image: self._preview(p, image),
                      owner=self)
        self._enable_actions(True)
        in_training = self._in_training_folder(p.path)
        for button in (self.exclude_button, self.relabel_button, self.relabel_choice):
            button.setEnabled(in_training)
        self.exclude_button.setToolTip(EXCLUDE_TIP if in_training else NOT_IN_TRAINING)
        self.relabel_button.setToolTip("" if in_training else NOT_IN_TRAINING)
        if self.relabel_choice.findText(p.predicted) >= 0:
            self.relabel_choice.setCurrentText(p.predicted)

    def _in_training_folder(self, path: str) -> bool:
        """Whether the image is one the run trains on (under data.train_dir, its validation split included): only
        those can be left out of training or relabelled; a separate validation or test folder's cannot."""
        train_dir = (self.model.start_event.get("config", {}).get("data", {}).get("train_dir")
                     if self.model is not None else None)
        if not train_dir:
            return True  # an older run without its config in the events: offer it, as before
        root = os.path.realpath(train_dir)
        return os.path.realpath(path).startswith(root + os.sep)

    def _show_details(self, p: Prediction) -> None:
        top = "<br>".join(f"{c}: {100 * prob:.1f}%" for c, prob in p.top_k)
        state = self._mark_state(p.path)
        said = (f"given <b>{p.true}</b> · suggested <b>{p.predicted}</b> · {audit_measure(p)}" if p.audit else
                f"true <b>{p.true}</b> · predicted <b>{p.predicted}</b> ({100 * p.confidence:.1f}%) · loss {p.loss:.3f}")
        self.details.setText(f"<b>{Path(p.path).name}</b><br>{said}<br>{top}"
                             + (f"<br><span style='color:#b8860b'>{state}</span>" if state else "")
                             + f"<br><span style='color:#777'>{p.path}</span>")

    def _mark_state(self, path: str) -> str:
        real = os.path.realpath(path)
        if real not in self.marked:
            return ""
        new = self.marked[real]
        return "in the manifest: excluded from training" if new is None else f"in the manifest: relabelled as {new}"

    def _preview(self, p: Prediction, image: QImage) -> None:
        if p is self.selected and not image.isNull():
            self.preview.setPixmap(QPixmap.fromImage(image))

    def _enable_actions(self, on: bool) -> None:
        for w in (self.cam_button, self.exclude_button, self.relabel_button, self.relabel_choice):
            w.setEnabled(on)
        self._enable_undo()

    def _enable_undo(self) -> None:
        """Undo only for an image the manifest holds (there is nothing to undo otherwise)."""
        self.undo_button.setEnabled(self.selected is not None and bool(self._mark_state(self.selected.path)))

    def _mark(self, new_class: str | None) -> None:
        if self.selected is not None:
            self.markRequested.emit(self.selected.path, new_class)

    def grad_cam(self) -> None:
        """The overlay for the selected image, from the run's best checkpoint, computed by `main.py grad-cam`."""
        p = self.selected
        if p is None or self.model is None:
            return
        if self._cam_dir is None:
            self._cam_dir = tempfile.TemporaryDirectory(prefix="traindeck-gradcam-")
        out = Path(self._cam_dir.name) / f"cam-{abs(hash(p.path))}.png"
        self.cam_button.setEnabled(False)
        self.cam_button.setText("Computing…")
        job = self._cam_job = CliJob(["grad-cam", str(self.model.run.path), p.path, "--out", str(out)], self)
        job.done.connect(lambda result: self._cam_done(p, result))
        job.failed.connect(self._cam_failed)

    def _cam_done(self, p: Prediction, result: dict) -> None:
        self._cam_job = None
        self.cam_button.setText("Grad-CAM")
        self.cam_button.setEnabled(True)
        if p is not self.selected:
            return
        self.preview.setPixmap(scaled_pixmap(result["overlay"], PREVIEW))
        self.preview.setToolTip(f"Grad-CAM for {result['explained']}: bright where the network found the evidence")

    def _cam_failed(self, message: str) -> None:
        self._cam_job = None
        self.cam_button.setText("Grad-CAM")
        self.cam_button.setEnabled(True)
        self.details.setText(self.details.text() + f"<br><span style='color:#c9302c'>Grad-CAM failed: {message}"
                             "</span>")

    def _zoom(self, size: int) -> None:
        for header in (self.matrix.horizontalHeader(), self.matrix.verticalHeader()):
            header.setDefaultSectionSize(size)
            header.setMinimumSectionSize(min(size, 18))
        font = QFont(self.matrix.font())
        font.setPointSizeF(max(6.0, min(11.0, size / 4.5)))
        self.matrix.setFont(font)
        self._size_columns()

    def resizeEvent(self, event) -> None:  # noqa: N802 - Qt's name
        super().resizeEvent(event)
        self._refit_soon()

    def showEvent(self, event) -> None:  # noqa: N802
        super().showEvent(event)
        self._refit_soon()

    def _refit_soon(self) -> None:
        """Re-fit the cells once the layout has settled (a tab first shown, a window resized)."""
        if self._auto_zoom and self.evaluation is not None:
            QTimer.singleShot(0, self._fit_zoom)

    def _fit_zoom(self) -> None:
        """Cells as large as the room allows (within the zoom's range): a few classes fill the space, many scroll."""
        n = max(self.matrix_model.rowCount(), 1)
        width, height = self._room()
        size = self._largest_cell(width, height, n)
        if size is None and not self.matrix_model.numbered:  # the names do not fit above: number the columns
            self.matrix_model.numbered = True
            self.matrix_model.headerDataChanged.emit(Qt.Orientation.Horizontal, 0, n - 1)
            self.matrix_model.headerDataChanged.emit(Qt.Orientation.Vertical, 0, n - 1)
            width, height = self._room()
            size = self._largest_cell(width, height, n)
        self.zoom.setValue(size or self.zoom.minimum())
        self._size_columns()

    def _room(self) -> tuple[int, int]:
        """The width and height the cells have: the table less its frame, its headers and a scroll bar's width."""
        frame = 2 * self.matrix.frameWidth() + self.matrix.verticalScrollBar().sizeHint().width()
        return (self.matrix.width() - self.matrix.verticalHeader().sizeHint().width() - frame,
                self.matrix.height() - self.matrix.horizontalHeader().sizeHint().height() - frame)

    def _largest_cell(self, width: int, height: int, n: int) -> int | None:
        """The largest cell size at which every column is whole (a column is as wide as its label at least) and
        every row too; None when even the smallest is too big."""
        labels = self._label_widths()
        for candidate in range(self.zoom.maximum(), self.zoom.minimum() - 1, -1):
            if sum(max(candidate, w) for w in labels) <= width and candidate * n <= height:
                return candidate
        return None

    def _label_widths(self) -> list[int]:
        """Each column's class name, in pixels with its margin."""
        metrics = self.matrix.horizontalHeader().fontMetrics()
        return [metrics.horizontalAdvance(self.matrix_model.headerData(col, Qt.Orientation.Horizontal) or "") + HEADER_MARGIN
                for col in range(self.matrix_model.columnCount())]

    def _size_columns(self) -> None:
        """Square cells at the zoom's size, widened where a class name is shown above its column."""
        header = self.matrix.horizontalHeader()
        for col, width in enumerate(self._label_widths()):
            header.resizeSection(col, max(self.zoom.value(), width))

    def closeEvent(self, event) -> None:  # noqa: N802
        if self._cam_dir is not None:
            self._cam_dir.cleanup()
        super().closeEvent(event)
