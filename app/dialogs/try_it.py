"""Try it: drop or pick images (or folders) and see the model's top-5 classes, as DIGITS' "Classify One" does.

The model is a run's checkpoint (its best.pt) or an exported model (ONNX, torch.export, ...). Prediction runs in a
`main.py predict --json` subprocess, so the answer is the command line's, preprocessing and all; a file that is not
an image is named in its row and the rest of the batch is still shown.
"""

from __future__ import annotations

from pathlib import Path

from PySide6.QtCore import QSize, Signal
from PySide6.QtGui import QColor, QDragEnterEvent, QDropEvent, QImage, QPixmap
from PySide6.QtWidgets import (
    QComboBox,
    QDialog,
    QFileDialog,
    QHBoxLayout,
    QHeaderView,
    QLabel,
    QPushButton,
    QTableWidget,
    QTableWidgetItem,
    QVBoxLayout,
)

from app.jobs.background import CliJob, run_in_thread
from app.widgets.thumbnails import load_thumbnails
from trainer.core.catalog import EXPORT_FORMATS
from trainer.data.scan import IMAGE_EXTENSIONS
from trainer.runs.commands import Predict

THUMB = 64
TOP = 5
EXPORTED = "Exported model file…"


def labels_text(labels: list) -> str:
    """A multi-label prediction: every label at its threshold with its probability, most probable first."""
    return " · ".join(f"{c} {100 * q:.0f}%" for c, q in labels) or "no label at its threshold"


class TryItDialog(QDialog):
    predicted = Signal(list)  # the results shown (for tests and anyone watching)

    def __init__(self, runs: list[Path], parent=None, start_dir: str | None = None):
        super().__init__(parent)
        self.start_dir = start_dir or str(Path.home())  # file dialogs open near the dataset
        self.setWindowTitle("Try it: classify images")
        self.resize(900, 600)
        self.setAcceptDrops(True)
        self.job: CliJob | None = None
        self.images: list[str] = []
        self.results: list[dict] = []

        self.source = QComboBox()
        self.source.setObjectName("modelSource")
        for run in runs:
            self.source.addItem(f"run {run.name} (best checkpoint)", str(run))
        self.source.addItem(EXPORTED, "")
        self.source.activated.connect(self._source_chosen)
        add_files = QPushButton("Add images…")
        add_files.setObjectName("addImages")
        add_files.clicked.connect(self._pick_files)
        add_folder = QPushButton("Add folder…")
        add_folder.clicked.connect(self._pick_folder)
        clear = QPushButton("Clear")
        clear.clicked.connect(self.clear)
        self.status = QLabel("Drop images or folders here, or add them.")
        self.status.setObjectName("tryItStatus")
        self.status.setWordWrap(True)
        self.table = QTableWidget(0, 4)
        self.table.setObjectName("tryItResults")
        self.table.setHorizontalHeaderLabels(["image", "file", "prediction", f"top {TOP}"])
        self.table.horizontalHeader().setSectionResizeMode(1, QHeaderView.ResizeMode.ResizeToContents)
        self.table.horizontalHeader().setSectionResizeMode(2, QHeaderView.ResizeMode.ResizeToContents)  # every label
        self.table.horizontalHeader().setSectionResizeMode(3, QHeaderView.ResizeMode.Stretch)
        self.table.verticalHeader().setDefaultSectionSize(THUMB + 8)
        self.table.verticalHeader().hide()
        self.table.setIconSize(QSize(THUMB, THUMB))
        self.table.setColumnWidth(0, THUMB + 12)
        self.table.setEditTriggers(QTableWidget.EditTrigger.NoEditTriggers)

        top = QHBoxLayout()
        top.addWidget(QLabel("Model"))
        top.addWidget(self.source, 1)
        top.addWidget(add_files)
        top.addWidget(add_folder)
        top.addWidget(clear)
        layout = QVBoxLayout(self)
        layout.addLayout(top)
        layout.addWidget(self.status)
        layout.addWidget(self.table, 1)

    # ---- choosing the model and the images ------------------------------------------------------
    @property
    def model_source(self) -> str:
        return self.source.currentData() or ""

    def set_model_source(self, path: str) -> None:
        """Use a run directory or an exported model file (added to the list when new)."""
        index = self.source.findData(path)
        if index < 0:
            self.source.insertItem(self.source.count() - 1, f"{Path(path).name} (exported model)", path)
            index = self.source.findData(path)
        self.source.setCurrentIndex(index)
        if self.images:
            self.classify(self.images)

    def _source_chosen(self, index: int) -> None:
        if self.source.itemData(index):
            if self.images:
                self.classify(self.images)
            return
        patterns = " ".join(f"*{suffix}" for suffix in EXPORT_FORMATS.values())
        path, _ = QFileDialog.getOpenFileName(self, "Exported model", self.start_dir, f"Models ({patterns})")
        if path:
            self.set_model_source(path)
        else:
            self.source.setCurrentIndex(0)

    def _pick_files(self) -> None:
        images = " ".join(f"*{suffix}" for suffix in IMAGE_EXTENSIONS)
        paths, _ = QFileDialog.getOpenFileNames(self, "Images", self.start_dir, f"Images ({images});;All files (*)")
        if paths:
            self.classify(paths)

    def _pick_folder(self) -> None:
        folder = QFileDialog.getExistingDirectory(self, "Folder of images", self.start_dir)
        if folder:
            self.classify([folder])

    def dragEnterEvent(self, event: QDragEnterEvent) -> None:  # noqa: N802 - Qt's name
        if event.mimeData().hasUrls():
            event.acceptProposedAction()

    def dropEvent(self, event: QDropEvent) -> None:  # noqa: N802
        paths = [u.toLocalFile() for u in event.mimeData().urls() if u.isLocalFile()]
        if paths:
            self.classify(paths)

    def clear(self) -> None:
        self.images = []
        self.results = []
        self.table.setRowCount(0)
        self.status.setText("Drop images or folders here, or add them.")

    # ---- classifying -----------------------------------------------------------------------------
    def classify(self, paths: list[str]) -> None:
        """Run `main.py predict` on `paths` (files or folders) with the chosen model; rows replace the table."""
        if not self.model_source:
            self.status.setText("Choose a model first: a run, or an exported model file.")
            return
        if self.job is not None:
            self.job.cancel()
        self.images = list(paths)
        self.status.setText(f"Classifying {len(paths)} item(s) with {Path(self.model_source).name}…")
        self.job = CliJob(Predict(model=str(self.model_source), images=paths, top=TOP, json=True), self,
                          ok_codes=(0, 2))
        self.job.done.connect(self._show)
        self.job.failed.connect(self._failed)

    def _failed(self, message: str) -> None:
        self.job = None
        self.status.setText(f"<span style='color:#c9302c'>{message}</span>")

    def _show(self, results: list[dict]) -> None:
        self.job = None
        self.results = results
        self.table.setRowCount(0)
        for r in results:
            row = self.table.rowCount()
            self.table.insertRow(row)
            self.table.setItem(row, 0, QTableWidgetItem())
            self.table.setItem(row, 1, QTableWidgetItem(Path(r["path"]).name))
            self.table.item(row, 1).setToolTip(r["path"])
            if r["error"]:
                item = QTableWidgetItem(r["error"])
                item.setForeground(QColor("#c9302c"))
                self.table.setItem(row, 2, item)
                self.table.setSpan(row, 2, 1, 2)
                continue
            if r.get("labels") is not None:  # multi-label: every label at its threshold, each with its probability
                on = labels_text(r["labels"])
                self.table.setItem(row, 2, QTableWidgetItem(on))
            else:
                best, p = r["top"][0]
                self.table.setItem(row, 2, QTableWidgetItem(f"{best}  {100 * p:.1f}%"))
            self.table.setItem(row, 3, QTableWidgetItem("   ".join(f"{c} {100 * q:.1f}%" for c, q in r["top"])))
        bad = sum(1 for r in results if r["error"])
        self.status.setText(f"{len(results) - bad} image(s) classified" + (f"; {bad} could not be read" if bad else ""))
        readable = [r["path"] for r in results]
        run_in_thread(lambda: load_thumbnails(readable, THUMB), lambda images: self._icons(results, images), owner=self)
        self.predicted.emit(results)

    def _icons(self, results: list[dict], images: list[QImage]) -> None:
        if results is not self.results:
            return
        for row, image in enumerate(images):
            if not image.isNull():
                self.table.item(row, 0).setIcon(QPixmap.fromImage(image))

    def done(self, code: int) -> None:  # noqa: D401 - QDialog's close path
        if self.job is not None:
            self.job.cancel()
            self.job = None
        super().done(code)
