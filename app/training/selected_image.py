"""The Results tab's selected image: its preview, what the network said of it, Grad-CAM on demand and the
manifest's actions (exclude from training, relabel, undo). The dataset's files are never touched: a decision is an
entry in the manifest, made by the Dataset page."""

from __future__ import annotations

import html
import os
from collections.abc import Callable
from pathlib import Path

from PySide6.QtCore import Qt, Signal
from PySide6.QtGui import QImage, QPixmap
from PySide6.QtWidgets import QComboBox, QGridLayout, QHBoxLayout, QLabel, QPushButton, QVBoxLayout, QWidget

from app.jobs.background import run_in_thread
from app.state.audit_gallery import audit_measure
from app.state.eval_results import Prediction
from app.widgets.grad_cam import GradCam
from app.widgets.thumbnails import load_pair_thumbnails, scaled_pixmap

EXCLUDE_TIP = ("leave this image out of training: an entry in the dataset manifest (data.exclude); the file itself "
               "is not touched")
NOT_IN_TRAINING = "this image is not in the training folder (data.train_dir): there is nothing to leave out or relabel"
PREVIEW = 180


class SelectedImage(QWidget):
    markRequested = Signal(str, object)  # image path, new class (None: exclude from training)
    undoRequested = Signal(str)  # image path

    def __init__(self, parent: QWidget | None = None):
        super().__init__(parent)
        self.selected: Prediction | None = None
        self.marked: dict[str, str | None] = {}  # real path -> class (None: excluded), from the Dataset page
        self.run_path = ""  # the run whose network Grad-CAM asks
        self.train_dir_of: Callable[[], str | None] = lambda: None  # the run's data.train_dir (its images are marked)
        self.gradcam = GradCam(self)
        self.gradcam.done.connect(self._cam_done)
        self.gradcam.failed.connect(self._cam_failed)
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
        dl = QHBoxLayout(self)
        dl.setContentsMargins(0, 0, 0, 0)
        dl.addWidget(self.preview)
        dl.addLayout(info, 1)
        self._enable_actions(False)


    def show_prediction(self, p: Prediction | None) -> None:
        """`p`'s preview, what the network said of it, and what can be done with it (None: nothing selected)."""
        self.gradcam.cancel()
        self.cam_button.setText("Grad-CAM")
        if p is None:
            self.selected = None
            self.preview.setPixmap(QPixmap())
            self.preview.setText("Select an image")
            self.details.setText("")
            self._enable_actions(False)
            return
        self.selected = p
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
        train_dir = self.train_dir_of()
        if not train_dir:
            return True  # an older run without its config in the events: offer it, as before
        root = os.path.realpath(train_dir)
        return os.path.realpath(path).startswith(root + os.sep)

    def set_marked(self, marked: dict[str, str | None]) -> None:
        """The manifest's entries (real path -> new class, None when excluded), to show beside the image."""
        self.marked = marked
        if self.selected is not None:
            self._show_details(self.selected)  # the text only: a Grad-CAM being computed goes on
        self._enable_undo()

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
        if self.selected is None or not self.run_path:
            return
        self.cam_button.setEnabled(False)
        self.cam_button.setText("Computing…")
        self.gradcam.ask(self.run_path, self.selected.path)

    def _cam_done(self, image: str, result: dict) -> None:
        self.cam_button.setText("Grad-CAM")
        self.cam_button.setEnabled(True)
        if self.selected is None or self.selected.path != image:
            return
        self.preview.setPixmap(scaled_pixmap(result["overlay"], PREVIEW))
        self.preview.setToolTip(f"Grad-CAM for {result['explained']}: bright where the network found the evidence")

    def _cam_failed(self, image: str, message: str) -> None:
        self.cam_button.setText("Grad-CAM")
        self.cam_button.setEnabled(True)
        self.details.setText(self.details.text() + f"<br><span style='color:#c9302c'>Grad-CAM failed: "
                             f"{html.escape(message)}</span>")

    def set_classes(self, classes: list[str]) -> None:
        self.relabel_choice.clear()
        self.relabel_choice.addItems(classes)
