"""Thumbnails decoded off the GUI thread (QImage is safe there; QPixmap is made from it on the GUI thread), and a
small overlay file scaled for a preview on the GUI thread."""

from __future__ import annotations

from PySide6.QtCore import QSize, Qt
from PySide6.QtGui import QImage, QImageReader, QPainter, QPixmap
from PySide6.QtWidgets import QListWidget

PAIR_GAP = 4  # px between a copy and its original


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


def load_pair_thumbnails(pairs: list[tuple[str, str | None]], size: int) -> list[QImage]:
    """Each (image, the image it copies or None) as one thumbnail that fits `size`: the image alone, or the two side
    by side (each half as wide, a gap between them)."""
    out = []
    for left, right in pairs:
        if right is None:
            out += load_thumbnails([left], size)
            continue
        half = (size - PAIR_GAP) // 2
        images = load_thumbnails([left, right], half)
        pair = QImage(size, size, QImage.Format.Format_ARGB32)
        pair.fill(Qt.GlobalColor.transparent)
        painter = QPainter(pair)
        for i, image in enumerate(images):
            if not image.isNull():
                painter.drawImage(i * (half + PAIR_GAP) + (half - image.width()) // 2, (size - image.height()) // 2,
                                  image)
        painter.end()
        out.append(pair)
    return out


def scaled_pixmap(path: str, size: int) -> QPixmap:
    """A small image file (a Grad-CAM overlay the trainer wrote) as a pixmap that fits `size`, smoothly scaled."""
    return QPixmap(path).scaled(size, size, Qt.AspectRatioMode.KeepAspectRatio,
                                Qt.TransformationMode.SmoothTransformation)


def thumbnail_gallery(name: str, size: int, caption_lines: int = 2, margin: int = 44) -> QListWidget:
    """A gallery of `size` px thumbnails with captions under them, laid out on a fixed grid: without one, items laid
    out before their thumbnails arrived overlapped each other and their captions once they did."""
    gallery = QListWidget()
    gallery.setObjectName(name)
    gallery.setViewMode(QListWidget.ViewMode.IconMode)
    gallery.setIconSize(QSize(size, size))
    line = gallery.fontMetrics().lineSpacing()
    gallery.setGridSize(QSize(size + margin, size + 12 + caption_lines * line))  # margin: room for the captions' width
    gallery.setResizeMode(QListWidget.ResizeMode.Adjust)
    gallery.setMovement(QListWidget.Movement.Static)
    gallery.setUniformItemSizes(True)
    gallery.setWordWrap(True)
    return gallery


def set_gallery_icons(gallery: QListWidget, images: list[QImage]) -> None:
    """Each decoded thumbnail as the icon of the gallery's item at its index (an image that could not be read: none)."""
    for i, image in enumerate(images):
        if not image.isNull() and i < gallery.count():
            gallery.item(i).setIcon(QPixmap.fromImage(image))
    gallery.doItemsLayout()  # the items' size again, with their icons: laid out before they came, the icons were cut
