"""Thumbnails decoded off the GUI thread (QImage is safe there; QPixmap is made from it on the GUI thread)."""

from __future__ import annotations

from PySide6.QtCore import Qt
from PySide6.QtGui import QImage, QImageReader


def load_thumbnails(paths: list[str], size: int) -> list[QImage]:
    """Each image scaled to fit `size` while it is decoded (EXIF orientation applied); a null QImage when a file
    cannot be read."""
    out = []
    for path in paths:
        reader = QImageReader(path)
        reader.setAutoTransform(True)
        full = reader.size()
        if full.isValid():
            reader.setScaledSize(full.scaled(size, size, Qt.AspectRatioMode.KeepAspectRatio))
        out.append(reader.read())
    return out
