"""The Dataset page's preview of the augmentation (issue #47): a few training images as the network sees them,
decoded at the image size and then in random draws of data.augment. The trainer draws them (`main.py
augment-preview`, answered by the resident worker) from the split a run would use, deciding data.augment's auto
values as a run does; the page shows its answer, asked again whenever a setting it depends on changes."""

from __future__ import annotations

import html
import shutil
import tempfile
from pathlib import Path

from PySide6.QtCore import Qt
from PySide6.QtGui import QPixmap
from PySide6.QtWidgets import QGridLayout, QGroupBox, QHBoxLayout, QLabel, QPushButton, QVBoxLayout, QWidget

from app.jobs.background import CliJob
from app.widgets.forms import WrappedLabel
from trainer.core.config import RunConfig, save_config
from trainer.data.preview import PREVIEW_KEYS
from trainer.runs import commands

TILE = 52  # px, each image on the page (five in a row fit the page at 1024 px)


def preview_signature(cfg: RunConfig) -> tuple:
    """The values of PREVIEW_KEYS in `cfg`, comparable."""
    raw = cfg.to_dict()
    values = []
    for key in PREVIEW_KEYS:
        node = raw
        for part in key.split("."):
            node = node.get(part) if isinstance(node, dict) else None
        values.append(repr(node))
    return tuple(values)


class AugmentPreview(QGroupBox):
    def __init__(self, parent: QWidget | None = None):
        super().__init__("Augmentation preview", parent)
        self.setObjectName("augmentPreview")
        self._folder = tempfile.TemporaryDirectory(prefix="traindeck-preview-")  # removed with the widget
        self._asks = 0
        self.seed = 0
        self.job: CliJob | None = None
        self._waiting: RunConfig | None = None  # asked for while a draw was under way: drawn after it
        self._shown: tuple | None = None  # the signature of the settings drawn (or being drawn)
        self._last: RunConfig | None = None
        self.result: dict | None = None  # the trainer's answer shown
        self.caption = WrappedLabel("")
        self.caption.setObjectName("augmentCaption")
        self.caption.setStyleSheet("color: #555;")
        self.again = QPushButton("Draw again")
        self.again.setObjectName("augmentDrawAgain")
        self.again.setToolTip("other images and other random draws of the same settings")
        self.again.clicked.connect(self.draw_again)
        self.again.setEnabled(False)
        self.tiles = QGridLayout()
        self.tiles.setSpacing(4)
        bottom = QHBoxLayout()
        bottom.addWidget(self.caption, 1)
        bottom.addWidget(self.again, 0, Qt.AlignmentFlag.AlignTop)
        layout = QVBoxLayout(self)
        layout.addLayout(self.tiles)
        layout.addLayout(bottom)

    def show_config(self, cfg: RunConfig | None) -> None:
        """Draw the preview for this config when a value it depends on changed; None (a form that cannot run, or
        data on another host) leaves the last drawing as it is."""
        if cfg is None or cfg.device.host:
            if cfg is not None:
                self.caption.setText(f"The images are on {html.escape(cfg.device.host)}: no preview here.")
            return
        self._last = cfg
        signature = preview_signature(cfg)
        if signature == self._shown:
            return
        self._shown = signature
        self._ask(cfg)

    def draw_again(self) -> None:
        if self._last is not None:
            self.seed += 1
            self._ask(self._last)

    def _ask(self, cfg: RunConfig) -> None:
        if self.job is not None:
            self._waiting = cfg
            return
        self._asks += 1
        folder = Path(self._folder.name)
        config = folder / "preview.yaml"
        save_config(cfg, config)
        self.caption.setText("Drawing a few training images as the network will see them…")
        self.job = CliJob(commands.AugmentPreview(config=str(config), out=str(folder / f"draw-{self._asks}"), seed=self.seed,
                                           json=True), self)
        self.job.done.connect(self._done)
        self.job.failed.connect(self._failed)

    def _next(self) -> None:
        self.job = None
        if self._waiting is not None:
            cfg, self._waiting = self._waiting, None
            self._ask(cfg)

    def _done(self, result: dict) -> None:
        old = self.result
        self.result = result
        self._show(result)
        if old and old["images"]:  # the previous drawing's files, now shown no more
            shutil.rmtree(Path(old["images"][0]["original"]).parent, ignore_errors=True)
        self._next()

    def _failed(self, error: str) -> None:
        self.caption.setText(f"<span style='color:#c9302c'>No preview: {html.escape(error)}</span>")
        self._clear()
        self._next()

    def _clear(self) -> None:
        while self.tiles.count():
            self.tiles.takeAt(0).widget().deleteLater()
        self.again.setEnabled(False)

    def _show(self, result: dict) -> None:
        self._clear()
        augment = result["augment"]
        crop = f"crops from {augment['crop_scale_min']:.0%} of the image" if augment["random_resized_crop"] else \
            "no crops"
        parts = [f"flips {'on' if augment['hflip'] else 'off'}", crop,
                 f"colour jitter {augment['color_jitter']:g}" if augment["color_jitter"] else "no colour jitter"]
        parts += [augment["policy"].replace("_", " ")] if augment.get("policy", "none") != "none" else []
        parts += [f"{name} {augment[key]:g}" for key, name in (("random_erasing", "erasing"), ("mixup", "MixUp"),
                                                              ("cutmix", "CutMix")) if augment.get(key)]
        draws = len(result["images"][0]["draws"]) if result["images"] else 0
        self.caption.setText(f"Each row: a training image at {result['frame']} as decoded, then {draws} random "
                             f"draws of the run's augmentation ({', '.join(parts)}).")
        self.caption.setToolTip("\n".join(f"{c['key']}: auto, {c['value']}: {c['why']}" for c in result["decided"]))
        for row, image in enumerate(result["images"]):
            for column, path in enumerate([image["original"], *image["draws"]]):
                tile = QLabel()
                tile.setPixmap(QPixmap(path).scaled(TILE, TILE, Qt.AspectRatioMode.KeepAspectRatio,
                                                    Qt.TransformationMode.SmoothTransformation))
                tile.setToolTip(f"{image['label']}: {image['path']}" + ("" if column else " (as decoded)"))
                self.tiles.addWidget(tile, row, column)
        self.again.setEnabled(True)
