"""Dialogs about one past run: continue it for more epochs, its tags and notes."""

from __future__ import annotations

from PySide6.QtWidgets import QDialog, QDialogButtonBox, QFormLayout, QLabel, QLineEdit, QPlainTextEdit, QSpinBox, QWidget

from app.state.experiments import read_notes, write_notes
from trainer.core.config import key_meta
from trainer.core.rundir import RunDir
from trainer.core.schedule import describe_extension


class ExtendDialog(QDialog):
    """"Continue for N more epochs", with what the learning-rate schedule will do (the trainer's rule)."""

    def __init__(self, run: RunDir, facts: dict, parent: QWidget | None = None):
        super().__init__(parent)
        self.setWindowTitle(f"Continue {run.name}")
        self.facts = facts
        self.more = QSpinBox()
        self.more.setObjectName("moreEpochs")
        self.more.setRange(1, key_meta("train.epochs")["le"])  # more epochs than a run may have are refused
        self.more.setValue(max(1, facts["done"] // 2))
        self.rule = QLabel("")
        self.rule.setObjectName("scheduleRule")
        self.rule.setWordWrap(True)
        self.more.valueChanged.connect(self._show_rule)
        form = QFormLayout(self)
        form.addRow(QLabel(f"{run.name} has trained {facts['done']} epochs"
                           + (" (it stopped early: the extension gets its full patience again)"
                              if facts["early_stopped"] else "") + "."))
        form.addRow("More epochs", self.more)
        form.addRow(self.rule)
        buttons = QDialogButtonBox(QDialogButtonBox.StandardButton.Ok | QDialogButtonBox.StandardButton.Cancel)
        buttons.button(QDialogButtonBox.StandardButton.Ok).setText("Continue")
        buttons.accepted.connect(self.accept)
        buttons.rejected.connect(self.reject)
        form.addRow(buttons)
        self._show_rule()

    @property
    def total(self) -> int:
        return self.facts["done"] + self.more.value()

    def _show_rule(self) -> None:
        f = self.facts
        if f["steps_per_epoch"]:
            self.rule.setText(describe_extension(f["scheduler"], f["lr"], f["done"], self.total, f["steps_per_epoch"]))
        else:
            self.rule.setText("The schedule is recomputed for the new total and continued at the current step.")


class NotesDialog(QDialog):
    def __init__(self, run: RunDir, parent: QWidget | None = None):
        super().__init__(parent)
        self.run = run
        self.setWindowTitle(f"Tags and notes: {run.name}")
        notes = read_notes(run)
        self.tags = QLineEdit(", ".join(notes["tags"]))
        self.tags.setPlaceholderText("comma separated: baseline, augmented, …")
        self.notes = QPlainTextEdit(notes["notes"])
        form = QFormLayout(self)
        form.addRow("Tags", self.tags)
        form.addRow("Notes", self.notes)
        buttons = QDialogButtonBox(QDialogButtonBox.StandardButton.Save | QDialogButtonBox.StandardButton.Cancel)
        buttons.accepted.connect(self.accept)
        buttons.rejected.connect(self.reject)
        form.addRow(buttons)

    def accept(self) -> None:
        write_notes(self.run, [t.strip() for t in self.tags.text().split(",") if t.strip()],
                    self.notes.toPlainText())
        super().accept()
