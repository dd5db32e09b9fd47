"""Binding form widgets to config keys: one widget per key, loaded from and dumped to the config dict.

Validation is the config's own (`RunConfig.from_dict`): the window marks each widget whose key a
problem names, with the message as its tooltip.
"""

from __future__ import annotations

import html
import re
from typing import Any

from PySide6.QtCore import QObject, QSize, Qt
from PySide6.QtWidgets import (
    QCheckBox,
    QComboBox,
    QDoubleSpinBox,
    QLabel,
    QLineEdit,
    QScrollArea,
    QSpinBox,
    QVBoxLayout,
    QWidget,
)

from app.state.form_model import USER, FormModel
from trainer.core.config import key_meta, parse_float

ERROR_STYLE = "border: 1px solid #d9534f; background: #fff3f3;"


def parse_number(text: str) -> Any:
    """A number from the text as the config reads one (`parse_float`: 3e-4, 1_000), or the text itself so that
    validation names the bad value; empty: None."""
    text = text.strip()
    if not text:
        return None
    try:
        return parse_float(text)
    except ValueError:
        return text


def format_number(value: Any) -> str:
    """A number as a form shows it and reads it back unchanged: the shortest text that is exactly the value
    (0.00123456789, not :g's 0.00123457; 3e-4 as 0.0003); anything else as its text."""
    return repr(float(value)) if isinstance(value, float) else str(value)


def scrolling(page: QWidget, content: QWidget) -> None:
    """Show `content` in `page` inside a scroll area: on a small screen the page scrolls instead of pushing the
    window taller than the screen."""
    scroll = QScrollArea()
    scroll.setWidget(content)
    scroll.setWidgetResizable(True)
    scroll.setFrameShape(QScrollArea.Shape.NoFrame)
    outer = QVBoxLayout(page)
    outer.setContentsMargins(0, 0, 0, 0)
    outer.addWidget(scroll)


class FullHeight(QWidget):
    """A column never shorter than its contents need: the scroll area around it scrolls rather than squash its rows
    (a form of spin boxes and wrapped labels was squeezed below their own minimum at 1024x700)."""

    def minimumSizeHint(self) -> QSize:  # noqa: N802 - Qt's name
        hint = super().minimumSizeHint()
        layout = self.layout()
        return QSize(hint.width(), max(hint.height(), layout.sizeHint().height())) if layout else hint


ZERO_WIDTH_SPACE = "\u200b"
LONG_WORD = 24  # a word this long with nowhere to wrap gets break opportunities
_LONG = re.compile(rf"\S{{{LONG_WORD + 1},}}")
_RUN = re.compile(rf"[^/]{{{LONG_WORD}}}")


def breakable(text: str) -> str:
    """`text` (a path, a message naming one) as label HTML that can wrap inside its long words, after each `/` and
    every LONG_WORD characters: a word-wrapped label is as wide as its longest word, and a long folder path collapsed
    the form beside it. Short words ("train/val/test") are left as they are."""
    def spaced(match: re.Match) -> str:
        word = _RUN.sub(lambda m: m.group(0) + ZERO_WIDTH_SPACE, match.group(0))
        return word.replace("/", "/" + ZERO_WIDTH_SPACE)

    return html.escape(_LONG.sub(spaced, str(text)))


class WrappedLabel(QLabel):
    """A word-wrapped label that is never given fewer lines than its text needs at the width it has (a form row
    gave the normalisation line 3 of its 4 lines at 1024x700, cutting it short)."""

    def __init__(self, text: str = "", parent: QWidget | None = None):
        super().__init__(text, parent)
        self.setWordWrap(True)

    def _fit(self) -> None:
        self.setMinimumHeight(self.heightForWidth(self.width()) if self.text() else 0)

    def resizeEvent(self, event) -> None:  # noqa: N802 - Qt's name
        super().resizeEvent(event)
        if event.size().width() != event.oldSize().width():
            self._fit()  # narrower, it needs more lines

    def setText(self, text: str) -> None:  # noqa: N802 - Qt's name
        super().setText(text)
        self._fit()


INT_MIN, INT_MAX = -(2**31), 2**31 - 1
FLOAT_MAX = 1e9
EXACT_DECIMALS = 15  # a decimal key's resolution in a form: what a double holds of a value typed in decimals
DEFAULT_STEP = 0.05  # a decimal key's step where the config gives none
BOUND_STEP = 1e-6  # an open bound (0 < val_split) as the closest value a spin box offers inside it


class _WheelOnlyWhenFocused:
    """A value the mouse wheel changes only once the user has clicked or tabbed into it: scrolling a page across it
    scrolls the page (the wheel over Batch size changed it from 32 to 24 on its way down the Dataset page)."""

    def wheelEvent(self, event) -> None:  # noqa: N802 - Qt's name
        if self.hasFocus():
            super().wheelEvent(event)
        else:
            event.ignore()  # to the scroll area around it


def _strong_focus(widget: QWidget) -> QWidget:
    widget.setFocusPolicy(Qt.FocusPolicy.StrongFocus)  # the wheel does not focus it (Qt's default for spin boxes)
    return widget


class SpinBox(_WheelOnlyWhenFocused, QSpinBox):
    pass


class ComboBox(_WheelOnlyWhenFocused, QComboBox):
    pass


class ExactDoubleSpinBox(_WheelOnlyWhenFocused, QDoubleSpinBox):
    """A QDoubleSpinBox that keeps EXACT_DECIMALS digits and shows a value as written (0.125, not 0.125000;
    0.00123456789, not 0.001235)."""

    def __init__(self, parent: QWidget | None = None):
        super().__init__(parent)
        self.setDecimals(EXACT_DECIMALS)

    def textFromValue(self, value: float) -> str:  # noqa: N802 - Qt's name
        return f"{value:.{EXACT_DECIMALS}f}".rstrip("0").rstrip(".") or "0"


def show_value(w: QWidget, value: Any) -> None:
    """`value` in the widget of its key, as the key's formatter writes it."""
    if isinstance(w, QCheckBox):
        w.setChecked(bool(value))
    elif w.property("kind") == "choice":
        w.setCurrentIndex(max(0, w.findData(value)))
    elif isinstance(w, (QSpinBox, QDoubleSpinBox)):  # null, or the special text (auto): the lowest value
        w.setValue(w.minimum() if value is None or isinstance(value, str) else value)
    elif isinstance(w, QComboBox):
        text = "" if value is None else str(value)
        if w.findText(text) < 0 and w.isEditable():
            w.addItem(text)
        w.setCurrentText(text)
    elif isinstance(w, QLineEdit):
        if isinstance(value, list):
            w.setText(", ".join(format_number(v) for v in value))
        else:
            w.setText("" if value is None else format_number(value))


def read_value(w: QWidget) -> Any:
    """What the widget of a key holds, as the key's parser reads it."""
    kind = w.property("kind")
    if isinstance(w, QCheckBox):
        return w.isChecked()
    if kind == "choice":
        return w.currentData()
    if w.property("special") and w.value() == w.minimum():
        return w.property("special")
    if isinstance(w, (QSpinBox, QDoubleSpinBox)):
        return w.value()
    if isinstance(w, QComboBox):
        return w.currentText()
    text = w.text().strip()
    if kind == "number":
        return parse_number(text)
    if kind == "int":
        return int(text) if text.lstrip("-").isdigit() else (text or None)
    if kind == "int_list":
        return [int(v) if v.strip().lstrip("-").isdigit() else v.strip() for v in text.split(",") if v.strip()]
    return text or None


class Binder(QObject):
    """Widgets bound to config keys, as views of the form model: each shows its key's value (through the key's
    formatter), and what the user types or chooses goes to the model (through the key's parser), set by the user."""

    def __init__(self, model: FormModel, parent: QObject | None = None):
        super().__init__(parent)
        self.model = model
        self.widgets: dict[str, QWidget] = {}
        self._showing = False  # a value from the model is being shown: the widget's own signal is not an edit
        self._editing: str | None = None  # the key being typed into: not shown back (the caret stays where it is)
        model.listen(self._model_changed)

    def _register(self, key: str, widget: QWidget, signal) -> QWidget:
        widget.setObjectName(key)
        self.widgets[key] = widget
        signal.connect(lambda *_: self._edited(key))
        self._show(key)
        return widget

    def _edited(self, key: str) -> None:
        if self._showing:
            return
        self._editing = key
        try:
            self.model.set(key, read_value(self.widgets[key]), USER)
        finally:
            self._editing = None

    def _model_changed(self, key: str | None, _by: str) -> None:
        for shown in (self.widgets if key is None else [key] if key in self.widgets else []):
            if shown != self._editing:
                self._show(shown)

    def _show(self, key: str) -> None:
        self._showing = True
        try:
            show_value(self.widgets[key], self.model.get(key))
        finally:
            self._showing = False

    def spin(self, key: str, suffix: str = "") -> QSpinBox | QLineEdit:
        """A whole-number key, its range and the word for its lowest value (off, auto) the config's (`key_meta`)."""
        meta = key_meta(key)
        low = meta["ge"] if meta["ge"] is not None else meta["gt"] + 1 if meta["gt"] is not None else INT_MIN
        high = meta["le"] if meta["le"] is not None else meta["lt"] - 1 if meta["lt"] is not None else INT_MAX
        if low < INT_MIN or high > INT_MAX:  # past what a Qt spin box holds (32 bits): typed, checked by the config
            w = QLineEdit()
            w.setProperty("kind", "int")
            return self._register(key, w, w.textChanged)
        w = _strong_focus(SpinBox())
        w.setRange(int(low), int(high))
        w.setSuffix(suffix)
        if meta["lowest"]:
            w.setSpecialValueText(meta["lowest"])
        return self._register(key, w, w.valueChanged)

    def dspin(self, key: str) -> QDoubleSpinBox:
        """A decimal key, its range, step and the word for its lowest value (auto: that value) the config's
        (`key_meta`), holding any valid value as typed (0.125 stays 0.125, not 0.13; 0.02 is not raised to a step)."""
        meta = key_meta(key)
        w = _strong_focus(ExactDoubleSpinBox())
        low = meta["ge"] if meta["ge"] is not None else meta["gt"] + BOUND_STEP if meta["gt"] is not None \
            else -FLOAT_MAX
        high = meta["le"] if meta["le"] is not None else meta["lt"] - BOUND_STEP if meta["lt"] is not None \
            else FLOAT_MAX
        w.setRange(low, high)
        w.setSingleStep(meta["step"] or DEFAULT_STEP)
        if meta["lowest"]:
            w.setSpecialValueText(meta["lowest"])
            w.setProperty("special", meta["lowest"])
        return self._register(key, w, w.valueChanged)

    def choice(self, key: str, options: list[tuple[str, Any]]) -> QComboBox:
        """A key whose values are not all text (true, false, auto): each option shown by its label."""
        w = _strong_focus(ComboBox())
        for label, value in options:
            w.addItem(label, value)
        w.setProperty("kind", "choice")
        return self._register(key, w, w.currentIndexChanged)

    def number(self, key: str, placeholder: str = "") -> QLineEdit:
        """Free-form number entry (1e-3 works); empty means null."""
        w = QLineEdit()
        w.setPlaceholderText(placeholder)
        w.setProperty("kind", "number")
        return self._register(key, w, w.textChanged)

    def line(self, key: str, placeholder: str = "") -> QLineEdit:
        w = QLineEdit()
        w.setPlaceholderText(placeholder)
        return self._register(key, w, w.textChanged)

    def combo(self, key: str, choices: list[str] | tuple[str, ...], editable: bool = False) -> QComboBox:
        w = _strong_focus(ComboBox())
        w.addItems(list(choices))
        w.setEditable(editable)
        return self._register(key, w, w.currentTextChanged)

    def check(self, key: str, text: str) -> QCheckBox:
        w = QCheckBox(text)
        return self._register(key, w, w.toggled)

    def mark_errors(self, problems: list[str]) -> None:
        for key, w in self.widgets.items():
            mine = [p for p in problems if p.startswith(key + ":") or p.startswith(key + "[")]
            w.setStyleSheet(ERROR_STYLE if mine else "")
            w.setToolTip("\n".join(mine))
