"""The sweep dialog: a grid and/or random ranges over the current form's config, written as a sweep file and queued
with `main.py sweep` (the trainer checks it; its message is shown as it is)."""

from __future__ import annotations

import time
from pathlib import Path

import yaml
from PySide6.QtCore import Signal
from PySide6.QtWidgets import (
    QCheckBox,
    QComboBox,
    QDialog,
    QFormLayout,
    QHBoxLayout,
    QHeaderView,
    QLabel,
    QLineEdit,
    QPushButton,
    QSpinBox,
    QTableWidget,
    QTableWidgetItem,
    QVBoxLayout,
)

from app.jobs.background import CliJob, start_detached
from app.widgets.forms import INT_MAX
from trainer.core.config import MAX_SEED, describe_keys
from trainer.core.rundir import configs_folder
from trainer.runs.commands import Sweep
from trainer.runs.sweep import MAX_TRIALS, METHODS


def sweepable_keys() -> list[str]:
    """Config keys with a single number, word or switch (what a grid or a range can vary)."""
    return [key for key, kind, *_ in describe_keys() if not kind.startswith("a list")]


class SweepDialog(QDialog):
    queued = Signal(list)  # the run directories queued

    def __init__(self, base_config: Path, runs_dir: Path, parent=None):
        super().__init__(parent)
        self.setWindowTitle("Sweep")
        self.resize(720, 520)
        self.base_config, self.runs_dir = Path(base_config), Path(runs_dir)
        self.job: CliJob | None = None
        self.keys = sweepable_keys()
        self.name = QLineEdit(f"sweep-{time.strftime('%m%d-%H%M')}")
        self.name.setObjectName("sweepName")
        self.method = QComboBox()
        self.method.setObjectName("sweepMethod")
        self.method.addItems(list(METHODS))
        self.method.setToolTip("grid: every combination; random: draws from the ranges; optuna: TPE with median "
                               "pruning of weak trials (needs optuna)")
        self.trials = QSpinBox()
        self.trials.setRange(1, MAX_TRIALS)  # the sweep's own limit
        self.trials.setValue(8)
        self.seed = QSpinBox()
        self.seed.setRange(0, min(MAX_SEED, INT_MAX))  # the sweep's limit, as far as a spin box holds
        self.grid = self._table(["config key", "values (comma separated)"], "sweepGrid")
        self.ranges = self._table(["config key", "low", "high", "log"], "sweepRanges")
        add_grid = QPushButton("Add grid key")
        add_grid.clicked.connect(lambda: self.add_grid_row("optimizer.lr", "1e-3, 3e-3, 1e-2"))
        add_range = QPushButton("Add range")
        add_range.clicked.connect(lambda: self.add_range_row("optimizer.weight_decay", "1e-6", "1e-3", True))
        remove_grid = QPushButton("Remove")
        remove_grid.clicked.connect(lambda: self._remove_current(self.grid))
        remove_range = QPushButton("Remove")
        remove_range.clicked.connect(lambda: self._remove_current(self.ranges))
        self.result = QLabel("")
        self.result.setObjectName("sweepResult")
        self.result.setWordWrap(True)
        self.queue_button = QPushButton("Queue sweep")
        self.queue_button.setObjectName("queueSweep")
        self.queue_button.clicked.connect(self.submit)

        self._lay_out(add_grid, add_range, remove_grid, remove_range)

    def _lay_out(self, add_grid, add_range, remove_grid, remove_range) -> None:
        """The form, the grid's and the ranges' tables with their buttons, the result and Queue."""
        form = QFormLayout()
        form.addRow("Name", self.name)
        form.addRow("Method", self.method)
        form.addRow("Trials (random, optuna)", self.trials)
        form.addRow("Seed", self.seed)
        form.addRow("Base config", QLabel(str(self.base_config)))
        layout = QVBoxLayout(self)
        layout.addLayout(form)
        for title, table, add, remove in (("Grid", self.grid, add_grid, remove_grid),
                                          ("Random ranges", self.ranges, add_range, remove_range)):
            row = QHBoxLayout()
            row.addWidget(QLabel(f"<b>{title}</b>"))
            row.addStretch(1)
            row.addWidget(add)
            row.addWidget(remove)
            layout.addLayout(row)
            layout.addWidget(table, 1)
        layout.addWidget(self.result)
        buttons = QHBoxLayout()
        buttons.addStretch(1)
        close = QPushButton("Close")
        close.clicked.connect(self.reject)
        buttons.addWidget(self.queue_button)
        buttons.addWidget(close)
        layout.addLayout(buttons)

    def _table(self, headers: list[str], name: str) -> QTableWidget:
        table = QTableWidget(0, len(headers))
        table.setObjectName(name)
        table.setHorizontalHeaderLabels(headers)
        table.horizontalHeader().setSectionResizeMode(QHeaderView.ResizeMode.Stretch)
        table.verticalHeader().hide()
        return table

    @staticmethod
    def _remove_current(table: QTableWidget) -> None:
        row = table.currentRow()
        if row >= 0:
            table.removeRow(row)

    def _key_combo(self, key: str) -> QComboBox:
        combo = QComboBox()
        combo.setEditable(True)
        combo.addItems(self.keys)
        combo.setCurrentText(key)
        return combo

    def add_grid_row(self, key: str, values: str) -> None:
        r = self.grid.rowCount()
        self.grid.insertRow(r)
        self.grid.setCellWidget(r, 0, self._key_combo(key))
        self.grid.setItem(r, 1, QTableWidgetItem(values))

    def add_range_row(self, key: str, low: str, high: str, log: bool) -> None:
        r = self.ranges.rowCount()
        self.ranges.insertRow(r)
        self.ranges.setCellWidget(r, 0, self._key_combo(key))
        self.ranges.setItem(r, 1, QTableWidgetItem(low))
        self.ranges.setItem(r, 2, QTableWidgetItem(high))
        box = QCheckBox()
        box.setChecked(log)
        self.ranges.setCellWidget(r, 3, box)

    def sweep_body(self) -> dict:
        """The sweep file's content; the trainer checks it (unknown keys, empty lists, bad ranges)."""
        body: dict = {"base": str(self.base_config), "name": self.name.text().strip() or "sweep",
                      "method": self.method.currentText(), "seed": self.seed.value()}
        grid = {}
        for r in range(self.grid.rowCount()):
            key = self.grid.cellWidget(r, 0).currentText().strip()
            text = (self.grid.item(r, 1).text() if self.grid.item(r, 1) else "").strip()
            try:
                grid[key] = yaml.safe_load(f"[{text}]") if text else []
            except yaml.YAMLError:
                grid[key] = [text]  # the trainer names the value it cannot use
        ranges = {}
        for r in range(self.ranges.rowCount()):
            key = self.ranges.cellWidget(r, 0).currentText().strip()
            ranges[key] = {"low": self.ranges.item(r, 1).text().strip(), "high": self.ranges.item(r, 2).text().strip(),
                           "log": self.ranges.cellWidget(r, 3).isChecked()}
        if grid:
            body["grid"] = grid
        if ranges:
            body["random"] = ranges
            body["trials"] = self.trials.value()
        return body

    def submit(self) -> Path:
        """Write the sweep file beside the runs' configs and queue it (an Optuna study runs in its own process)."""
        folder = configs_folder(self.runs_dir)
        folder.mkdir(parents=True, exist_ok=True)
        body = self.sweep_body()
        path = folder / f"{body['name']}.sweep.yaml"
        path.write_text(yaml.safe_dump(body, sort_keys=False), encoding="utf-8")
        if body["method"] == "optuna":
            log = folder / f"{body['name']}.sweep.log"
            ok = start_detached(Sweep(sweep=str(path), runs_dir=str(self.runs_dir)), log)
            self.result.setText(f"the Optuna study runs in its own process; its trials appear in the queue (log: "
                                f"{log})" if ok else "could not start the study")
            return path
        self.queue_button.setEnabled(False)
        self.result.setText("checking and queueing…")
        self.job = CliJob(Sweep(sweep=str(path), runs_dir=str(self.runs_dir)), self, parse_json=False)
        self.job.done.connect(self._done)
        self.job.failed.connect(self._failed)
        return path

    def _done(self, out: str) -> None:
        self.job = None
        self.queue_button.setEnabled(True)
        runs = [line for line in out.splitlines() if line.strip()]
        self.result.setText(f"<span style='color:#2b7a2b'>queued {len(runs)} runs</span>")
        self.queued.emit(runs)

    def _failed(self, message: str) -> None:
        self.job = None
        self.queue_button.setEnabled(True)
        self.result.setText(f"<span style='color:#c9302c'>{message}</span>")

    def reject(self) -> None:
        if self.job is not None:
            self.job.cancel()
        super().reject()

