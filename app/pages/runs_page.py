"""Runs page: the history in the runs directory; open, compare, resume, export, open folder, delete."""

from __future__ import annotations

import datetime as dt
import shutil
from pathlib import Path

import pyqtgraph as pg
import yaml
from PySide6.QtCore import Qt, QUrl, Signal
from PySide6.QtGui import QDesktopServices
from PySide6.QtWidgets import (
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
    QSplitter,
    QTableWidget,
    QTableWidgetItem,
    QVBoxLayout,
    QWidget,
)

from app.background import CliJob, run_in_thread
from app.pages.plots import COLORS, make_plot, with_log_toggle
from trainer.catalog import EXPORT_FORMATS, RUN_CHECKPOINTS
from trainer.events import read_events
from trainer.rundir import RunDir, list_runs

COLUMNS = ["run", "model", "dataset", "status", "best acc", "epochs", "started"]


def summarize(run: RunDir) -> dict:
    """One row of the runs table (runs on the thread pool: reads small files only)."""
    status = run.read_status()
    try:
        cfg = yaml.safe_load(run.config.read_text()) or {}
    except (OSError, yaml.YAMLError):
        cfg = {}
    started = status.get("started") or run.path.stat().st_mtime
    best = status.get("best_acc")
    return {
        "path": str(run.path), "run": run.name, "model": cfg.get("model", {}).get("name", "?").split("/")[-1],
        "dataset": dataset_label(cfg.get("data", {}).get("train_dir")), "status": run.effective_state(),
        "best acc": f"{100 * best:.1f}%" if isinstance(best, (int, float)) else "—",
        "epochs": f"{status.get('epoch', 0)}/{cfg.get('train', {}).get('epochs', '?')}",
        "started": dt.datetime.fromtimestamp(started).strftime("%Y-%m-%d %H:%M"),
        "pid": status.get("pid"),
    }


def load_curves(paths: list[str]) -> list[tuple[str, dict]]:
    out = []
    for path in paths:
        events = read_events(Path(path) / "events.jsonl")
        steps = [(e["step"], e["loss"]) for e in events if e["event"] == "step" and e.get("loss") is not None]
        epochs = [(e["epoch"], e["val_acc"]) for e in events if e["event"] == "epoch"]
        out.append((Path(path).name, {"steps": steps, "epochs": epochs}))
    return out


def dataset_label(train_dir: str | None) -> str:
    """A dataset name people recognise: the folder and its parent (`photos/train`, not `train`)."""
    if not train_dir:
        return "?"
    parts = Path(train_dir).parts
    return "/".join(parts[-2:]) if len(parts) >= 2 else parts[-1]


class ExportDialog(QDialog):
    """Export a run's checkpoint with `main.py export` (in a subprocess)."""

    def __init__(self, run_dir: str, parent: QWidget | None = None):
        super().__init__(parent)
        self.setWindowTitle(f"Export {Path(run_dir).name}")
        self.run_dir = run_dir
        self.format = QComboBox()
        self.format.addItems(list(EXPORT_FORMATS))
        self.checkpoint = QComboBox()
        self.checkpoint.addItems(list(RUN_CHECKPOINTS))
        self.out = QLineEdit(str(Path(run_dir) / "export" / "model.pt"))
        self.format.currentTextChanged.connect(self._suffix)
        browse = QPushButton("Browse…")
        browse.clicked.connect(self._browse)
        row = QHBoxLayout()
        row.addWidget(self.out, 1)
        row.addWidget(browse)
        self.result = QLabel("")
        self.result.setWordWrap(True)
        form = QFormLayout(self)
        form.addRow("Format", self.format)
        form.addRow("Checkpoint", self.checkpoint)
        form.addRow("Write to", row)
        form.addRow(self.result)
        self.buttons = QDialogButtonBox(QDialogButtonBox.StandardButton.Close)
        self.export_button = self.buttons.addButton("Export", QDialogButtonBox.ButtonRole.ActionRole)
        self.export_button.clicked.connect(self.export)
        self.buttons.rejected.connect(self.reject)
        form.addRow(self.buttons)
        self.job: CliJob | None = None

    def _suffix(self, fmt: str) -> None:
        suffix = EXPORT_FORMATS[fmt]
        path = Path(self.out.text())
        self.out.setText(str(path.parent / ("model" + suffix)))

    def _browse(self) -> None:
        path, _ = QFileDialog.getSaveFileName(self, "Export to", self.out.text())
        if path:
            self.out.setText(path)

    def export(self) -> None:
        self.export_button.setEnabled(False)
        self.result.setText("exporting…")
        self.job = CliJob(["export", self.run_dir, "--format", self.format.currentText(), "--out", self.out.text(),
                           "--checkpoint", self.checkpoint.currentText()], self, parse_json=False)
        self.job.done.connect(lambda text: self._finished(f"<span style='color:#2b7a2b'>{text.strip()}</span>"))
        self.job.failed.connect(lambda error: self._finished(f"<span style='color:#c9302c'>{error}</span>"))

    def _finished(self, html: str) -> None:
        self.job = None
        self.result.setText(html)
        self.export_button.setEnabled(True)

    def reject(self) -> None:
        if self.job is not None:
            self.job.cancel()
        super().reject()


class RunsPage(QWidget):
    openRequested = Signal(str)
    resumeRequested = Signal(str)

    def __init__(self, parent: QWidget | None = None):
        super().__init__(parent)
        self.runs_dir: Path | None = None
        self.rows: list[dict] = []
        self.table = QTableWidget(0, len(COLUMNS))
        self.table.setObjectName("runsTable")
        self.table.setHorizontalHeaderLabels(COLUMNS)
        header = self.table.horizontalHeader()
        header.setSectionResizeMode(QHeaderView.ResizeMode.ResizeToContents)
        header.setSectionResizeMode(0, QHeaderView.ResizeMode.Stretch)
        self.table.setSelectionBehavior(QTableWidget.SelectionBehavior.SelectRows)
        self.table.setEditTriggers(QTableWidget.EditTrigger.NoEditTriggers)
        self.table.verticalHeader().hide()
        self.table.doubleClicked.connect(lambda _: self._open())

        buttons = QHBoxLayout()
        for text, slot in (("Refresh", self.refresh), ("Open", self._open), ("Compare selected", self._compare),
                           ("Resume", self._resume), ("Export…", self._export), ("Open folder", self._open_folder),
                           ("Delete", self._delete)):
            b = QPushButton(text)
            b.setObjectName(f"runs:{text}")
            b.clicked.connect(slot)
            buttons.addWidget(b)
        buttons.addStretch(1)

        self.compare_loss = make_plot("Training loss (selected runs)", "loss")
        self.compare_acc = make_plot("Validation accuracy (selected runs)", "accuracy", "epoch")
        plots = QSplitter()
        plots.addWidget(with_log_toggle(self.compare_loss))
        plots.addWidget(with_log_toggle(self.compare_acc))

        top = QWidget()
        tl = QVBoxLayout(top)
        tl.setContentsMargins(0, 0, 0, 0)
        tl.addLayout(buttons)
        tl.addWidget(self.table)
        split = QSplitter(Qt.Orientation.Vertical)
        split.addWidget(top)
        split.addWidget(plots)
        layout = QVBoxLayout(self)
        layout.addWidget(split)

    def set_runs_dir(self, runs_dir: Path) -> None:
        self.runs_dir = Path(runs_dir)
        self.refresh()

    def refresh(self) -> None:
        if self.runs_dir is None:
            return
        runs_dir = self.runs_dir
        run_in_thread(lambda: [summarize(r) for r in list_runs(runs_dir)], self._show)

    def _show(self, rows: list[dict]) -> None:
        self.rows = rows
        self.table.setRowCount(len(rows))
        colors = {"completed": "#2b7a2b", "failed": "#c9302c", "diverged": "#c9302c", "stopped": "#b8860b",
                  "running": "#1f77b4"}
        for i, row in enumerate(rows):
            for j, col in enumerate(COLUMNS):
                item = QTableWidgetItem(str(row[col]))
                if col == "status" and row[col] in colors:
                    item.setForeground(pg.mkColor(colors[row[col]]))
                item.setToolTip(row["path"])
                self.table.setItem(i, j, item)

    def selected(self) -> list[str]:
        rows = sorted({i.row() for i in self.table.selectedIndexes()})
        return [self.rows[r]["path"] for r in rows if r < len(self.rows)]

    def _open(self) -> None:
        for path in self.selected()[:1]:
            self.openRequested.emit(path)

    def _resume(self) -> None:
        for path in self.selected()[:1]:
            self.resumeRequested.emit(path)

    def _compare(self) -> None:
        paths = self.selected()
        if paths:
            run_in_thread(lambda: load_curves(paths), self._show_compare)

    def _show_compare(self, curves: list) -> None:
        for plot in (self.compare_loss, self.compare_acc):
            plot.clear()
            plot.addLegend(offset=(-10, 10))
        for i, (name, data) in enumerate(curves):
            pen = pg.mkPen(COLORS[i % len(COLORS)], width=2)
            if data["steps"]:
                xs, ys = zip(*data["steps"])
                self.compare_loss.plot(xs, ys, pen=pen, name=name)
            if data["epochs"]:
                xs, ys = zip(*data["epochs"])
                self.compare_acc.plot(xs, ys, pen=pen, name=name, symbol="o", symbolSize=5)

    def _export(self) -> None:
        for path in self.selected()[:1]:
            ExportDialog(path, self).open()

    def _open_folder(self) -> None:
        for path in self.selected()[:1]:
            QDesktopServices.openUrl(QUrl.fromLocalFile(path))

    def _delete(self) -> None:
        paths = self.selected()
        running = [r["run"] for r in self.rows if r["path"] in paths and r["status"] in ("running", "starting")]
        if running:
            QMessageBox.warning(self, "Delete runs", f"Stop {', '.join(running)} before deleting it.")
            return
        if not paths or QMessageBox.question(
                self, "Delete runs", f"Delete {len(paths)} run(s) and their checkpoints from disk?") \
                != QMessageBox.StandardButton.Yes:
            return
        run_in_thread(lambda: [shutil.rmtree(p, ignore_errors=True) for p in paths], lambda _: self.refresh())
