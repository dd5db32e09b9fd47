"""The dashboard's Results tab: what the model gets wrong, and why.

Left: the confusion matrix of an evaluation (the best epoch's validation set, the test set, or any evaluated
folder) as a table that scrolls and zooms, in counts or row percentages; clicking a cell shows its images. Right:
the gallery (top losses by default), the most confused pairs, per-class figures and the reliability diagram; below
them the selected image with its top classes, a Grad-CAM overlay computed on demand in a subprocess, and the
manifest actions (exclude, relabel). Everything is read from the files under RUN_DIR/eval/, off the GUI thread.
"""

from __future__ import annotations

import pyqtgraph as pg
from PySide6.QtCore import Qt, Signal
from PySide6.QtGui import QImage, QKeySequence, QShortcut
from PySide6.QtWidgets import (
    QHBoxLayout,
    QHeaderView,
    QLabel,
    QListWidgetItem,
    QPushButton,
    QSizePolicy,
    QSplitter,
    QStackedWidget,
    QTableWidget,
    QTableWidgetItem,
    QTabWidget,
    QVBoxLayout,
    QWidget,
)

from app.jobs.background import CliJob, run_in_thread
from app.jobs.run_model import RunModel
from app.state.audit_gallery import audit_gallery, audit_measure, score_text
from app.state.eval_results import (
    Evaluation,
    MultiLabelEvaluation,
    Prediction,
    evaluation_label,
    evaluation_names,
    most_confused,
    mtime,
    read_evaluation,
)
from app.training.confusion_pane import ConfusionPane
from app.training.multilabel_view import MultiLabelView
from app.training.selected_image import PREVIEW, SelectedImage
from app.widgets.data_map_view import DataMap
from app.widgets.plots import NumericItem, set_title
from app.widgets.thumbnails import load_pair_thumbnails, set_gallery_icons, thumbnail_gallery
from trainer.runs.commands import Audit

THUMB = 96
GALLERY_LIMIT = 300  # thumbnails shown at once (the highest losses); the count says how many there are


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
        self._loaded: tuple = ()
        self._eval_serial = 0
        self._thumb_serial = 0

        self.confusion = left = ConfusionPane()
        self.confusion.choiceChanged.connect(lambda: self.redraw(force=True))
        self.confusion.cellClicked.connect(self.show_cell)
        self.eval_choice, self.headline = self.confusion.eval_choice, self.confusion.headline
        self.matrix, self.matrix_model = self.confusion.matrix, self.confusion.matrix_model
        self._build_side_tabs()
        self.image = detail_box = SelectedImage()
        self.image.markRequested.connect(self.markRequested)
        self.image.undoRequested.connect(self.undoRequested)

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
        self.multilabel.poolRequested.connect(lambda: self.model and self.labelPoolRequested.emit(
            str(self.model.run.path)))
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

    def _build_side_tabs(self) -> None:
        """The gallery of a cell's images, the most confused pairs, per-class figures and the reliability diagram."""
        self._build_gallery()

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
        self.side_tabs.addTab(self.gallery_box, "Gallery")
        self.side_tabs.addTab(self.pairs, "Most confused")
        self.side_tabs.addTab(self.per_class, "Per class")
        self.side_tabs.addTab(self.reliability, "Calibration")
        self.data_map = DataMap()
        self.data_map.setObjectName("dataMap")
        self.data_map.showRequested.connect(self._show_on_map)
        self.data_map.marksRequested.connect(self.marksRequested)
        self.side_tabs.addTab(self.data_map, "Map")

    def _build_gallery(self) -> None:
        """The gallery and the buttons that fill it: all errors, the audit's label issues, outliers and copies."""
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
        self.gallery_box = gallery_box = QWidget()
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
        self.image.set_classes([])  # "Relabel as" offers this run's classes once its evaluation is read
        self.image.run_path = str(model.run.path)
        self.multilabel.set_run(str(model.run.path))
        self.image.train_dir_of = lambda: model.start_event.get("config", {}).get("data", {}).get("train_dir")
        self._select(-1)
        self.data_map.set_run(str(model.run.path))

    def set_marked(self, marked: dict[str, str | None]) -> None:
        """The manifest's entries (real path -> new class, None when excluded), to show beside each image."""
        self.image.set_marked(marked)
        self.multilabel.set_marked(marked)

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
        self.confusion.show_matrix(m["confusion"], ev.classes)
        self.image.set_classes(ev.classes)
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
        set_title(self.reliability, f"Reliability (expected calibration error {m.get('ece', 0):.3f})")
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
        job = self._issues_job = CliJob(Audit(run_dir=str(self.model.run.path), json=True), self)
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
        p = self.image.selected
        if p is not None and self.image.exclude_button.isEnabled():
            self.markRequested.emit(p.path, p.predicted if new_class else None)
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

    def _select(self, row: int) -> None:
        self.image.show_prediction(self.shown[row] if 0 <= row < len(self.shown) else None)

    def closeEvent(self, event) -> None:  # noqa: N802
        self.image.gradcam.close()
        self.multilabel.gradcam.close()
        super().closeEvent(event)
