"""The Export dialog: `main.py export` in a subprocess, then every export in the chosen folder side by side with what
its model card says it is worth (size, top-1, agreement with the checkpoint, latency, throughput)."""

from __future__ import annotations

from pathlib import Path

from PySide6.QtCore import Qt, QUrl
from PySide6.QtGui import QDesktopServices
from PySide6.QtWidgets import (
    QAbstractItemView,
    QComboBox,
    QDialog,
    QDialogButtonBox,
    QFileDialog,
    QFormLayout,
    QHBoxLayout,
    QHeaderView,
    QLabel,
    QLineEdit,
    QMessageBox,
    QPushButton,
    QTableWidget,
    QTableWidgetItem,
    QTextBrowser,
    QVBoxLayout,
    QWidget,
)

from app.jobs.background import CliJob
from trainer.core.catalog import (
    DEFAULT_EXPORT_FORMAT,
    DEPRECATED_EXPORT_FORMATS,
    EXPORT_DESCRIPTIONS,
    EXPORT_FORMATS,
    EXPORT_REGISTRY,
    RUN_CHECKPOINTS,
)
from trainer.core.rundir import RunDir
from trainer.deploy.model_card import card_path, format_percent, format_size, quality, read_card
from trainer.runs.commands import Export

ABOUT_LINES = 3  # the format's description: the longest wraps to this many lines at the dialog's width
COLUMNS = ["file", "format", "size", "top-1", "checkpoint", "agreement", "batch 1", "throughput", "measured on"]
HEADER_TIPS = {"top-1": "the exported file's top-1 accuracy on the run's test split (else its validation split)",
               "checkpoint": "the checkpoint's top-1 (the exported network in fp32) on the same images",
               "agreement": "the share of images the file gives the same class as the checkpoint",
               "batch 1": "median latency of one image in the file's own runtime, on this machine",
               "throughput": "images per second at the batch shown"}


def exports_in(folder: Path) -> list[tuple[Path, dict]]:
    """(export, its card) for every export in `folder` that has a model card, by name."""
    found = []
    for sidecar in sorted(folder.glob("*.json")) if folder.is_dir() else []:
        export = sidecar.with_suffix("")
        card = read_card(export) if export.exists() else None
        if card is not None:
            found.append((export, card))
    return found


def card_cells(export: Path, card: dict) -> list[str]:
    m, s = card.get("metrics") or {}, card.get("speed") or {}
    why_not = "; ".join(card.get("not_measured", {}).values())
    what, key = quality(m)  # a multi-label export is measured by mAP, said in the cell
    prefix = "mAP " if key == "map" else ""
    return [export.name, card["format"], format_size(card["file"]["bytes"]) if card.get("file") else "—",
            prefix + format_percent(m.get(key)), prefix + format_percent(m.get("checkpoint_" + key)),
            format_percent(m.get("agreement")),
            f"{s['batch1_ms']:.2f} ms" if s else "—",
            f"{s['images_per_s']:.0f}/s at {s['batch']}" if s else "—",
            f"{m['split']} split, {m['images']} images" if m else (why_not or "—")]


class ExportDialog(QDialog):
    """Export a run's checkpoint with `main.py export` (in a subprocess) and compare the exports in the folder."""

    def __init__(self, run_dir: str, parent: QWidget | None = None):
        super().__init__(parent)
        self.setWindowTitle(f"Export {Path(run_dir).name}")
        self.setMinimumWidth(760)  # the comparison's columns, and the result line (a path) wraps rather than is cut
        self.run_dir = run_dir
        self._build_format_choice()
        self.checkpoint = QComboBox()
        self.checkpoint.addItems(list(RUN_CHECKPOINTS))
        # RUN_DIR/exports: where export.formats writes too
        self.out = QLineEdit(str(RunDir(run_dir).exports / ("model" + EXPORT_FORMATS[DEFAULT_EXPORT_FORMAT])))
        self.format.currentIndexChanged.connect(lambda _: self._format_changed(self.format.currentData()))
        browse = QPushButton("Browse…")
        browse.clicked.connect(self._browse)
        row = QHBoxLayout()
        row.addWidget(self.out, 1)
        row.addWidget(browse)
        self.calibration = QLineEdit()
        self.calibration.setPlaceholderText("a sample of the run's training split")
        self.calibration.setToolTip("onnx_int8: the images its activation ranges are calibrated on")
        browse_calibration = QPushButton("Browse…")
        browse_calibration.clicked.connect(self._browse_calibration)
        self.calibration_row = QWidget()
        calibration_layout = QHBoxLayout(self.calibration_row)
        calibration_layout.setContentsMargins(0, 0, 0, 0)
        calibration_layout.addWidget(self.calibration, 1)
        calibration_layout.addWidget(browse_calibration)
        self.result = QLabel("")
        self.result.setWordWrap(True)
        self.result.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        self._build_comparison()
        form = QFormLayout()
        form.addRow("Format", self.format)
        form.addRow("", self.about)
        form.addRow("Checkpoint", self.checkpoint)
        form.addRow("Write to", row)
        form.addRow("Calibrate on", self.calibration_row)
        self.form = form
        self.compared = QLabel("")
        self.buttons = QDialogButtonBox(QDialogButtonBox.StandardButton.Close)
        self.card_button = self.buttons.addButton("Open model card", QDialogButtonBox.ButtonRole.ActionRole)
        self.card_button.clicked.connect(self.open_card)
        self.export_button = self.buttons.addButton("Export", QDialogButtonBox.ButtonRole.ActionRole)
        self.export_button.clicked.connect(self.export)
        self.buttons.rejected.connect(self.reject)
        layout = QVBoxLayout(self)
        layout.addLayout(form)
        layout.addWidget(self.result)
        layout.addWidget(self.compared)
        layout.addWidget(self.table, 1)
        layout.addWidget(self.buttons)
        self.out.editingFinished.connect(self.refresh)
        self.job: CliJob | None = None
        self._format_changed(DEFAULT_EXPORT_FORMAT)

    def _build_format_choice(self) -> None:
        """The formats the trainer offers (its default first; deprecated ones say so) and what the chosen one is."""
        self.format = QComboBox()
        for fmt in EXPORT_FORMATS:  # the trainer's list, its default first; deprecated ones say so
            self.format.addItem(fmt + (" (deprecated)" if fmt in DEPRECATED_EXPORT_FORMATS else ""), fmt)
            self.format.setItemData(self.format.count() - 1,
                                    DEPRECATED_EXPORT_FORMATS.get(fmt, EXPORT_DESCRIPTIONS[fmt]),
                                    Qt.ItemDataRole.ToolTipRole)
        self.format.setCurrentIndex(self.format.findData(DEFAULT_EXPORT_FORMAT))
        self.about = QLabel(EXPORT_DESCRIPTIONS[DEFAULT_EXPORT_FORMAT])
        self.about.setWordWrap(True)
        self.about.setAlignment(Qt.AlignmentFlag.AlignTop | Qt.AlignmentFlag.AlignLeft)
        # room for the longest description: the rows below (and the list under the mouse) stay where they are
        self.about.setMinimumHeight(self.about.fontMetrics().lineSpacing() * ABOUT_LINES)
        self.format.setSizeAdjustPolicy(QComboBox.SizeAdjustPolicy.AdjustToContents)

    def _build_comparison(self) -> None:
        """The folder's exports side by side, from their cards."""
        self.table = QTableWidget(0, len(COLUMNS))
        self.table.setHorizontalHeaderLabels(COLUMNS)
        for column, tip in HEADER_TIPS.items():
            self.table.horizontalHeaderItem(COLUMNS.index(column)).setToolTip(tip)
        self.table.verticalHeader().setVisible(False)
        self.table.setEditTriggers(QAbstractItemView.EditTrigger.NoEditTriggers)
        self.table.setSelectionBehavior(QAbstractItemView.SelectionBehavior.SelectRows)
        self.table.horizontalHeader().setSectionResizeMode(QHeaderView.ResizeMode.ResizeToContents)
        self.table.horizontalHeader().setStretchLastSection(True)
        self.table.doubleClicked.connect(lambda _: self.open_card())
        self.exports: list[Path] = []

    def _format_changed(self, fmt: str) -> None:
        path = Path(self.out.text())
        self.out.setText(str(path.parent / ("model" + EXPORT_FORMATS[fmt])))
        self.about.setText(DEPRECATED_EXPORT_FORMATS.get(fmt, EXPORT_DESCRIPTIONS[fmt]))
        # greyed, not hidden: the form keeps its shape
        self.calibration_row.setEnabled(EXPORT_REGISTRY[fmt].calibration_folder)
        self.refresh()

    def _browse(self) -> None:
        path, _ = QFileDialog.getSaveFileName(self, "Export to", self.out.text())
        if path:
            self.out.setText(path)
            self.refresh()

    def _browse_calibration(self) -> None:
        folder = QFileDialog.getExistingDirectory(self, "Images to calibrate on", self.calibration.text())
        if folder:
            self.calibration.setText(folder)

    def refresh(self) -> None:
        """The exports in the output folder, side by side (their cards are a few kB each)."""
        folder = Path(self.out.text()).parent
        found = exports_in(folder)
        self.exports = [export for export, _ in found]
        self.table.setRowCount(len(found))
        for r, (export, card) in enumerate(found):
            for c, text in enumerate(card_cells(export, card)):
                item = QTableWidgetItem(text)
                item.setToolTip(card.get("description") or "")
                if 2 <= c < len(COLUMNS) - 1:  # the numbers
                    item.setTextAlignment(Qt.AlignmentFlag.AlignRight | Qt.AlignmentFlag.AlignVCenter)
                self.table.setItem(r, c, item)
        self.compared.setText(f"Exports in {folder} (measured on this machine; double-click one for its model card):"
                              if found else f"No exports in {folder} yet.")
        self.card_button.setEnabled(bool(found))

    def open_card(self) -> CardDialog | None:
        """The selected export's model card, shown here (a system may have no viewer for Markdown)."""
        row = self.table.currentRow()
        if not 0 <= row < len(self.exports):
            return None
        self.card_dialog = CardDialog(card_path(self.exports[row]), self)
        self.card_dialog.open()
        return self.card_dialog

    def export(self) -> None:
        """Export, after asking before an existing file is replaced."""
        out = Path(self.out.text())
        if out.exists():
            box = QMessageBox(QMessageBox.Icon.Question, "Replace the export?",
                              f"{out} exists. Replace it (and its model card) with a new export?", parent=self)
            box.setObjectName("replaceExport")
            box.setStandardButtons(QMessageBox.StandardButton.Yes | QMessageBox.StandardButton.Cancel)
            box.button(QMessageBox.StandardButton.Yes).setText("Replace")
            box.finished.connect(lambda answer: answer == QMessageBox.StandardButton.Yes and self._start_export())
            self.replace_box = box
            box.open()
            return
        self._start_export()

    def _start_export(self) -> None:
        self.export_button.setEnabled(False)
        self.result.setText("exporting, then measuring the file on the run's images…")
        fmt = self.format.currentData()
        calibration = self.calibration.text().strip() if EXPORT_REGISTRY[fmt].calibration_folder else None
        args = Export(run_dir=str(self.run_dir), format=fmt, out=self.out.text(), checkpoint=self.checkpoint.currentText(),
                      calibration=calibration)
        self.job = CliJob(args, self, parse_json=False)
        self.job.progress.connect(lambda line: self.result.setText(line) if line.startswith("fetching") else None)
        self.job.done.connect(lambda text: self._finished(f"<span style='color:#2b7a2b'>{_html(text)}</span>"))
        self.job.failed.connect(lambda error: self._finished(f"<span style='color:#c9302c'>{_html(error)}</span>"))

    def _finished(self, html: str) -> None:
        self.job = None
        self.result.setText(html)
        self.export_button.setEnabled(True)
        self.refresh()
        name = Path(self.out.text()).name
        for row, export in enumerate(self.exports):
            if export.name == name:
                self.table.selectRow(row)

    def reject(self) -> None:
        if self.job is not None:
            self.job.cancel()
        super().reject()


class CardDialog(QDialog):
    """A model card (its Markdown, rendered), with a button to open the file in the system's viewer."""

    def __init__(self, path: Path, parent: QWidget | None = None):
        super().__init__(parent)
        self.setWindowTitle(f"Model card: {path.name}")
        self.resize(720, 560)
        self.path = path
        self.view = QTextBrowser()
        self.view.setObjectName("cardView")
        self.view.setOpenLinks(False)  # a card is read, not followed: nothing in it is opened by a click
        try:
            self.view.setMarkdown(path.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError) as e:
            self.view.setPlainText(f"{path}: cannot be read ({e})")
        buttons = QDialogButtonBox(QDialogButtonBox.StandardButton.Close)
        elsewhere = buttons.addButton("Open in another app", QDialogButtonBox.ButtonRole.ActionRole)
        elsewhere.clicked.connect(lambda: QDesktopServices.openUrl(QUrl.fromLocalFile(str(path))))
        buttons.rejected.connect(self.reject)
        layout = QVBoxLayout(self)
        layout.addWidget(self.view, 1)
        layout.addWidget(buttons)


def _html(text: str) -> str:
    from html import escape

    return "<br>".join(escape(line) for line in text.strip().splitlines())
