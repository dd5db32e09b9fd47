"""The Advanced page: every config key that has no widget on another page, with its value, default and meaning.

What runs is what is shown: a key that Auto's plan (or an opened config) set, such as `train.budget`, EMA, flip
test-time augmentation or early stopping, is listed here, marked when it differs from its default and editable. The
keys, their defaults and descriptions come from the config's own declarations (`trainer.core.config.describe_keys`);
validation is the config's, as on every other page.
"""

from __future__ import annotations

from typing import Any

import yaml
from PySide6.QtCore import Qt
from PySide6.QtGui import QBrush, QColor, QFont
from PySide6.QtWidgets import (
    QCheckBox,
    QHBoxLayout,
    QHeaderView,
    QLabel,
    QPushButton,
    QTableWidget,
    QTableWidgetItem,
    QVBoxLayout,
    QWidget,
)

from app.state.form_model import USER, FormModel
from trainer.core.config import describe_keys
from trainer.core.user_yaml import YamlError, parse_yaml

ERROR_BACKGROUND = "#ffd9d9"
COLUMNS = ["Setting", "Value", "Default", "Set by", "What it does"]


def value_text(value: Any) -> str:
    """A value as the user would type it in YAML: 1.89, true, [onnx], null."""
    text = yaml.safe_dump(value, default_flow_style=True, width=10**6).strip()
    return text.removesuffix("...").strip()


def parse_value(text: str) -> Any:
    """The typed text as YAML, or the text itself so that validation names the bad value."""
    try:
        return parse_yaml(text, "value") if text.strip() else None
    except YamlError:  # invalid, or aliases past the bound: the text itself, which validation names (cut short)
        return text


class AdvancedPage(QWidget):
    """A view of the form model's keys that no other page shows."""

    def __init__(self, model: FormModel, owned_elsewhere: set[str], parent: QWidget | None = None):
        super().__init__(parent)
        self.model = model
        self.keys = [(key, default, doc) for key, _, default, doc in describe_keys() if key not in owned_elsewhere]
        self._rows = {key: row for row, (key, _, _) in enumerate(self.keys)}
        self._loading = False  # the table is being filled: its itemChanged is not an edit
        self._editing: str | None = None  # the key being edited: not shown back
        intro = QLabel("Settings with no form of their own. Every one of them goes into the run; the ones that "
                       "differ from their defaults are in bold, and the Start button's tooltip lists them.")
        intro.setWordWrap(True)
        self.summary = QLabel("")
        self.summary.setObjectName("advancedSummary")
        self.summary.setWordWrap(True)
        self.only_changed = QCheckBox("Only the settings that differ from the defaults")
        self.only_changed.setObjectName("advancedOnlyChanged")
        self.only_changed.toggled.connect(lambda _: self._filter(self.differing()))
        self.reset = QPushButton("Reset the selected to their defaults")
        self.reset.setObjectName("advancedReset")
        self.reset.clicked.connect(self.reset_selected)
        self.table = QTableWidget(len(self.keys), len(COLUMNS))
        self.table.setObjectName("advancedTable")
        self.table.setHorizontalHeaderLabels(COLUMNS)
        self.table.verticalHeader().hide()
        self.table.setWordWrap(True)
        header = self.table.horizontalHeader()
        for column in range(4):
            header.setSectionResizeMode(column, QHeaderView.ResizeMode.ResizeToContents)
        header.setSectionResizeMode(4, QHeaderView.ResizeMode.Stretch)
        for row, (key, default, doc) in enumerate(self.keys):
            self._fixed(row, 0, key)
            self.table.setItem(row, 1, QTableWidgetItem(value_text(default)))
            self._fixed(row, 2, value_text(default))
            self._fixed(row, 3, "")
            self._fixed(row, 4, doc)
        self.table.itemChanged.connect(self._edited)
        model.listen(self._model_changed)
        buttons = QHBoxLayout()
        buttons.addWidget(self.only_changed)
        buttons.addStretch(1)
        buttons.addWidget(self.reset)
        layout = QVBoxLayout(self)
        layout.addWidget(intro)
        layout.addWidget(self.summary)
        layout.addLayout(buttons)
        layout.addWidget(self.table, 1)
        self._model_changed(None, "")

    def _fixed(self, row: int, column: int, text: str) -> None:
        item = QTableWidgetItem(text)
        item.setFlags(item.flags() & ~Qt.ItemFlag.ItemIsEditable)
        item.setToolTip(text)
        self.table.setItem(row, column, item)

    # ---- values ------------------------------------------------------------------------------
    @property
    def set_by(self) -> dict[str, str]:
        return self.model.set_by

    def _model_changed(self, key: str | None, _by: str) -> None:
        rows = range(len(self.keys)) if key is None else [self._rows[key]] if key in self._rows else []
        if not rows:
            return
        self._loading = True
        try:
            for row in rows:
                if self.keys[row][0] != self._editing:
                    self.table.item(row, 1).setText(value_text(self.model.get(self.keys[row][0])))
        finally:
            self._loading = False
        self._refresh()

    def differing(self) -> dict[str, Any]:
        """key -> value for every key here whose value is not its default."""
        return {key: self.model.get(key) for key, default, _ in self.keys if self.model.get(key) != default}

    def reset_selected(self) -> None:
        for row in sorted({index.row() for index in self.table.selectedIndexes()}):
            key, default, _ = self.keys[row]
            self.model.set(key, default, USER)

    def mark_errors(self, problems: list[str]) -> None:
        """Mark the values a problem names (light red, the message as their tooltip)."""
        self._loading = True  # a background or tooltip change is an itemChanged too
        try:
            for row, (key, _, _) in enumerate(self.keys):
                mine = [p for p in problems if p.startswith(key + ":") or p.startswith(key + "[")]
                item = self.table.item(row, 1)
                item.setBackground(QColor(ERROR_BACKGROUND) if mine else QBrush())
                item.setToolTip("\n".join(mine) or item.text())
        finally:
            self._loading = False

    # ---- view --------------------------------------------------------------------------------
    def _edited(self, item: QTableWidgetItem) -> None:
        if self._loading or item.column() != 1:
            return
        self._editing = key = self.keys[item.row()][0]
        try:
            self.model.set(key, parse_value(item.text()), USER)
        finally:
            self._editing = None

    def _refresh(self) -> None:
        differing = self.differing()
        self._loading = True
        try:
            for row, (key, _, _) in enumerate(self.keys):
                font = QFont(self.table.font())
                font.setBold(key in differing)
                for column in range(4):
                    self.table.item(row, column).setFont(font)
                self.table.item(row, 3).setText(self.set_by.get(key, "") if key in differing else "")
        finally:
            self._loading = False
        self.summary.setText(f"{len(differing)} differ{'s' if len(differing) == 1 else ''} from the defaults: " + ", ".join(
            f"{key} = {value_text(value)}" for key, value in differing.items()) if differing
            else "All of them are at their defaults.")
        self._filter(differing)

    def _filter(self, differing: dict) -> None:
        for row, (key, _, _) in enumerate(self.keys):
            self.table.setRowHidden(row, self.only_changed.isChecked() and key not in differing)
