"""Model page: built-in / torchvision / own model, pretrained weights file, initialisation, parameter listing.

The model's parameter tensors come from `main.py describe-model` in a subprocess (torch stays out of the
GUI process); the optimizer page's group editor matches its patterns against that listing.
"""

from __future__ import annotations

from PySide6.QtCore import QTimer, Signal
from PySide6.QtWidgets import (
    QFileDialog,
    QFormLayout,
    QGroupBox,
    QHBoxLayout,
    QHeaderView,
    QInputDialog,
    QLabel,
    QPushButton,
    QTableWidget,
    QTableWidgetItem,
    QVBoxLayout,
    QWidget,
)

from app.background import CliJob
from app.forms import Binder
from trainer.catalog import BUILTIN_MODELS, SUGGESTED_TORCHVISION
from trainer.config import key_choices

BUILTIN = list(BUILTIN_MODELS)
COMMON = list(SUGGESTED_TORCHVISION)


def human(n: int) -> str:
    return f"{n / 1e6:.2f} M" if n >= 1e6 else f"{n / 1e3:.1f} k" if n >= 1e3 else str(n)


class ModelPage(QWidget):
    parametersChanged = Signal(list)  # [(name, numel)]

    def __init__(self, binder: Binder, parent: QWidget | None = None):
        super().__init__(parent)
        self.binder = binder
        self.parameters: list[tuple[str, int]] = []
        self.describe_error = ""
        self._job: CliJob | None = None
        self._classes = 10

        self.name = binder.combo("model.name", BUILTIN + COMMON, editable=True)
        own = QPushButton("Own model file…")
        own.clicked.connect(self._choose_own)
        row = QWidget()
        rl = QHBoxLayout(row)
        rl.setContentsMargins(0, 0, 0, 0)
        rl.addWidget(self.name, 1)
        rl.addWidget(own)

        weights = binder.line("model.weights", "optional: local .safetensors or .pt state_dict")
        browse = QPushButton("Browse…")
        browse.clicked.connect(self._choose_weights)
        wrow = QWidget()
        wl = QHBoxLayout(wrow)
        wl.setContentsMargins(0, 0, 0, 0)
        wl.addWidget(weights, 1)
        wl.addWidget(browse)

        box = QGroupBox("Network")
        form = QFormLayout(box)
        form.addRow("Model", row)
        form.addRow("Pretrained weights", wrow)
        form.addRow("Initialisation", binder.combo("model.init", key_choices("model.init")))
        self.count = QLabel("")
        self.count.setObjectName("paramCount")
        form.addRow("Parameters", self.count)

        self.table = QTableWidget(0, 3)
        self.table.setHorizontalHeaderLabels(["parameter tensor", "shape", "values"])
        self.table.horizontalHeader().setSectionResizeMode(0, QHeaderView.ResizeMode.Stretch)
        self.table.setEditTriggers(QTableWidget.EditTrigger.NoEditTriggers)
        self.table.verticalHeader().hide()

        layout = QVBoxLayout(self)
        layout.addWidget(box)
        layout.addWidget(QLabel("<b>Parameter tensors</b> — use these names in parameter-group patterns"))
        layout.addWidget(self.table, 1)

        self._debounce = QTimer(self)
        self._debounce.setSingleShot(True)
        self._debounce.setInterval(300)
        self._debounce.timeout.connect(self.describe)
        self.name.currentTextChanged.connect(lambda _: self._debounce.start())

    def set_class_count(self, n: int) -> None:
        if n and n != self._classes:
            self._classes = n
            self._debounce.start()

    def set_model_list(self, names: list[str]) -> None:
        current = self.name.currentText()
        self.name.blockSignals(True)
        self.name.clear()
        self.name.addItems(BUILTIN + [n for n in COMMON if n in names] + [n for n in names if n not in COMMON])
        self.name.setCurrentText(current)
        self.name.blockSignals(False)

    def describe(self) -> None:
        name = self.name.currentText().strip()
        if self._job is not None:
            self._job.cancel()
        self.count.setText("computing…")
        job = CliJob(["describe-model", name, "--classes", str(self._classes)], self)
        job.done.connect(self._described)
        job.failed.connect(self._describe_failed)
        self._job = job

    def _described(self, info: dict) -> None:
        self._job = None
        self.describe_error = ""
        self.parameters = [(p["name"], p["numel"]) for p in info["parameters"]]
        self.count.setText(f"{human(info['total'])} in {len(self.parameters)} tensors")
        self.table.setRowCount(len(info["parameters"]))
        for i, p in enumerate(info["parameters"]):
            for j, value in enumerate((p["name"], "×".join(map(str, p["shape"])), f"{p['numel']:,}")):
                self.table.setItem(i, j, QTableWidgetItem(value))
        self.parametersChanged.emit(self.parameters)

    def _describe_failed(self, error: str) -> None:
        self._job = None
        self.describe_error = error
        self.parameters = []
        self.count.setText(f"<span style='color:#c9302c'>{error}</span>")
        self.table.setRowCount(0)
        self.parametersChanged.emit([])

    def cancel_jobs(self) -> None:
        self._debounce.stop()
        if self._job is not None:
            self._job.cancel()
            self._job = None

    def _choose_own(self) -> None:
        path, _ = QFileDialog.getOpenFileName(self, "Own model (a .py file with an nn.Module class)", "",
                                              "Python files (*.py)")
        if not path:
            return
        cls, ok = QInputDialog.getText(self, "Model class", "Name of the nn.Module class in that file:", text="Net")
        if ok and cls:
            self.name.setCurrentText(f"{path}:{cls}")

    def _choose_weights(self) -> None:
        path, _ = QFileDialog.getOpenFileName(self, "Pretrained weights", "",
                                              "Weights (*.safetensors *.pt *.pth);;All files (*)")
        if path:
            self.binder.widgets["model.weights"].setText(path)

    def problems(self) -> list[str]:
        return [f"model.name: {self.describe_error.removeprefix('model.name: ')}"] if self.describe_error else []
