"""Model page: the model store (torchvision classifiers with their published figures), the weights to start from,
your own model, initialisation, and the parameter listing.

Everything torch-related comes from `main.py describe-model` subprocesses (torch stays out of the GUI process):
`--store` fills the table, and the chosen model's listing gives its parameters, its classifier head, the weights
names it offers and the normalisation they mean. The optimizer page's recipes and group editor use the same listing.
"""

from __future__ import annotations

from PySide6.QtCore import QSortFilterProxyModel, Qt, QTimer, Signal
from PySide6.QtGui import QStandardItem, QStandardItemModel
from PySide6.QtWidgets import (
    QAbstractItemView,
    QFileDialog,
    QFormLayout,
    QGroupBox,
    QHBoxLayout,
    QHeaderView,
    QInputDialog,
    QLabel,
    QLineEdit,
    QPushButton,
    QSplitter,
    QStyledItemDelegate,
    QTableView,
    QTableWidget,
    QTableWidgetItem,
    QVBoxLayout,
    QWidget,
)

from app.jobs.background import CliJob
from app.state.form_model import USER
from app.widgets.forms import Binder
from trainer.core.catalog import BUILTIN_MODELS, SUGGESTED_TORCHVISION
from trainer.core.config import is_weights_name, key_choices
from trainer.core.errors import ModelError
from trainer.core.user_code import grant
from trainer.runs.commands import DescribeModel

BUILTIN = list(BUILTIN_MODELS)
COMMON = list(SUGGESTED_TORCHVISION)
NO_WEIGHTS = ""  # the weights choice meaning "from scratch" (model.weights: null)
NO_WEIGHTS_LABEL = "none: train from scratch"


class NoWeightsLabel(QStyledItemDelegate):
    """The weights list shows the empty choice (from scratch) by what it means, not as a blank row."""

    def displayText(self, value, locale) -> str:  # noqa: N802 - Qt's name
        return NO_WEIGHTS_LABEL if value == NO_WEIGHTS else super().displayText(value, locale)
STORE_COLUMNS = [("model", "name"), ("params (M)", "params"), ("GFLOPS", "gflops"), ("top-1 %", "acc1"),
                 ("MB", "size_mb"), ("cached", "cached")]


def human(n: int) -> str:
    return f"{n / 1e6:.2f} M" if n >= 1e6 else f"{n / 1e3:.1f} k" if n >= 1e3 else str(n)


def store_item(key: str, value) -> QStandardItem:
    """A table cell that shows `value` and sorts by it (numbers as numbers)."""
    if key == "params":
        text = f"{value / 1e6:.1f}" if value else "—"
    elif key == "cached":
        text = "✓ cached" if value else ""
    elif isinstance(value, float):
        text = f"{value:.2f}" if key != "acc1" else f"{value:.1f}"
    else:
        text = "—" if value is None else str(value)
    item = QStandardItem(text)
    item.setToolTip(text)
    item.setData(value if value is not None else -1, Qt.ItemDataRole.UserRole)
    item.setEditable(False)
    return item


class ModelPage(QWidget):
    parametersChanged = Signal(list)  # [(name, numel)]
    described = Signal(dict)  # the chosen model's describe-model answer (head, weights names, normalisation)
    describing = Signal()  # another model or weights chosen: what the last answer said no longer holds

    def __init__(self, binder: Binder, parent: QWidget | None = None):
        super().__init__(parent)
        self.binder = binder
        self.model = binder.model  # the form's values (the page shows some of them)
        self.parameters: list[tuple[str, int]] = []
        self.head: str | None = None
        self.normalisation: dict | None = None
        self.describe_error = ""
        self.store: dict | None = None
        self._job: CliJob | None = None
        self._store_job: CliJob | None = None
        self._classes = 10

        store_box = self._build_store()
        chosen = self._build_chosen(binder)
        split = QSplitter()
        split.addWidget(store_box)
        split.addWidget(chosen)
        split.setSizes([620, 500])
        layout = QVBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 0)
        layout.addWidget(split)

        self._debounce = QTimer(self)
        self._debounce.setSingleShot(True)
        self._debounce.setInterval(300)
        self._debounce.timeout.connect(self.describe)
        self.name.currentTextChanged.connect(lambda _: (self._forget_parameters(), self._debounce.start()))
        self.weights.currentTextChanged.connect(lambda _: self._debounce.start())

    # ---- the store -----------------------------------------------------------------------------
    def _build_store(self) -> QWidget:
        """The model store: every torchvision classifier with its ImageNet top-1, size and speed; a click picks one."""
        self.filter = QLineEdit()
        self.filter.setObjectName("storeFilter")
        self.filter.setPlaceholderText("filter: resnet, vit, mobile…")
        self.store_model = QStandardItemModel(0, len(STORE_COLUMNS))
        self.store_model.setHorizontalHeaderLabels([label for label, _ in STORE_COLUMNS])
        self.proxy = QSortFilterProxyModel()
        self.proxy.setSourceModel(self.store_model)
        self.proxy.setSortRole(Qt.ItemDataRole.UserRole)
        self.proxy.setFilterCaseSensitivity(Qt.CaseSensitivity.CaseInsensitive)
        self.proxy.setFilterKeyColumn(0)
        self.filter.textChanged.connect(self.proxy.setFilterFixedString)
        self.table_view = QTableView()
        self.table_view.setObjectName("modelStore")
        self.table_view.setModel(self.proxy)
        self.table_view.setSortingEnabled(True)
        self.table_view.sortByColumn(0, Qt.SortOrder.AscendingOrder)
        self.table_view.setSelectionBehavior(QAbstractItemView.SelectionBehavior.SelectRows)
        self.table_view.setSelectionMode(QAbstractItemView.SelectionMode.SingleSelection)
        self.table_view.verticalHeader().hide()
        # a name too long for its column keeps its start and its end (convnext_base and convnext_large, efficientnet_b0
        # and _b5 were all "conv…", "effici…" at 1024 px), whole in its tooltip
        self.table_view.setTextElideMode(Qt.TextElideMode.ElideMiddle)
        header = self.table_view.horizontalHeader()
        header.setSectionResizeMode(QHeaderView.ResizeMode.ResizeToContents)
        header.setSectionResizeMode(0, QHeaderView.ResizeMode.Stretch)
        for column, tip in enumerate(("torchvision model name", "parameters, millions", "GFLOPS per image at its "
                                      "ImageNet size", "ImageNet-1K top-1 accuracy of its DEFAULT weights, %",
                                      "download size of its DEFAULT weights, MB",
                                      "its DEFAULT weights are already in the local cache")):
            self.store_model.horizontalHeaderItem(column).setToolTip(tip)
        self.table_view.clicked.connect(lambda index: self.choose_from_store(self.proxy.index(index.row(), 0).data()))
        self.store_status = QLabel("reading torchvision's model list…")
        self.store_status.setObjectName("storeStatus")
        self.store_status.setWordWrap(True)
        store_box = QGroupBox("Model store: click a model to start from its ImageNet weights")
        sl = QVBoxLayout(store_box)
        sl.addWidget(self.filter)
        sl.addWidget(self.table_view, 1)
        sl.addWidget(self.store_status)
        return store_box

    def _build_chosen(self, binder: Binder) -> QWidget:
        """The chosen network: name, weights, init, freezing, and its layers with their parameter counts."""
        self.name = binder.combo("model.name", BUILTIN + COMMON, editable=True)
        own = QPushButton("Own model file…")
        own.clicked.connect(self._choose_own)
        row = QWidget()
        rl = QHBoxLayout(row)
        rl.setContentsMargins(0, 0, 0, 0)
        rl.addWidget(self.name, 1)
        rl.addWidget(own)

        self.weights = binder.combo("model.weights", [NO_WEIGHTS], editable=True)
        self.weights.lineEdit().setPlaceholderText(NO_WEIGHTS_LABEL)
        self.weights.setItemDelegate(NoWeightsLabel(self.weights))
        browse = QPushButton("Local file…")
        browse.clicked.connect(self._choose_weights)
        wrow = QWidget()
        wl = QHBoxLayout(wrow)
        wl.setContentsMargins(0, 0, 0, 0)
        wl.addWidget(self.weights, 1)
        wl.addWidget(browse)

        box = QGroupBox("Network")
        form = QFormLayout(box)
        form.addRow("Model", row)
        form.addRow("Pretrained weights", wrow)
        form.addRow("Initialisation", binder.combo("model.init", key_choices("model.init")))
        self.count = QLabel("")
        self.count.setObjectName("paramCount")
        self.count.setWordWrap(True)  # a refusal (a file that names code, weights that do not fit) is read whole
        form.addRow("Parameters", self.count)

        self.table = QTableWidget(0, 3)
        self.table.setObjectName("parameterTable")
        self.table.setHorizontalHeaderLabels(["parameter tensor", "shape", "values"])
        self.table.horizontalHeader().setSectionResizeMode(0, QHeaderView.ResizeMode.Stretch)
        self.table.setEditTriggers(QTableWidget.EditTrigger.NoEditTriggers)
        self.table.verticalHeader().hide()
        chosen = QWidget()
        cl = QVBoxLayout(chosen)
        cl.setContentsMargins(0, 0, 0, 0)
        cl.addWidget(box)
        cl.addWidget(QLabel("<b>Parameter tensors</b> — use these names in parameter-group patterns"))
        cl.addWidget(self.table, 1)
        return chosen

    def showEvent(self, event) -> None:  # noqa: N802 - Qt's name
        """The store is read when the page is first shown, not at start-up (it imports torchvision)."""
        super().showEvent(event)
        if self.store is None and self._store_job is None:
            self.load_store()

    def load_store(self) -> None:
        job = CliJob(DescribeModel(store=True), self)
        job.done.connect(self._store_loaded)
        job.failed.connect(lambda error: self.store_status.setText(f"cannot list the models: {error}"))
        self._store_job = job

    def _store_loaded(self, store: dict) -> None:
        self._store_job = None
        self.store = store
        self.store_model.setRowCount(0)
        for row in store["models"]:
            self.store_model.appendRow([store_item(key, row[key]) for _, key in STORE_COLUMNS])
        cached = sum(1 for row in store["models"] if row["cached"])
        self.store_status.setText(f"{len(store['models'])} models; {cached} with weights already in "
                                  f"{store['cache']}; the others are downloaded when a run starts (or with "
                                  f"`main.py fetch-weights MODEL`)")

    def choose_from_store(self, name: str) -> None:
        """A store row: that model with its DEFAULT weights, since pretrained is what most users want."""
        self.model.set("model.name", name, USER)
        self.model.set("model.weights", "DEFAULT", USER)

    # ---- the chosen model ----------------------------------------------------------------------
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

    def _forget_parameters(self) -> None:
        """Another model was chosen: the previous one's tensors go at once (not once the new one is described)."""
        if self.parameters:
            self.parameters = []
            self.table.setRowCount(0)
            self.count.setText(f"describing {self.name.currentText().strip()}…")
            self.parametersChanged.emit([])

    def describe(self) -> None:
        name = self.name.currentText().strip()
        if self._job is not None:
            self._job.cancel()
        self.count.setText(f"describing {name}…")
        self.describing.emit()
        weights = self.weights.currentText().strip()
        job = CliJob(DescribeModel(name=name, classes=self._classes,
                                   weights=weights if is_weights_name(weights) else None), self)
        job.done.connect(self._described)
        job.failed.connect(self._describe_failed)
        self._job = job

    def _described(self, info: dict) -> None:
        self._job = None
        self.describe_error = ""
        self.head = info.get("head")
        self.normalisation = info.get("normalisation")
        self.parameters = [(p["name"], p["numel"]) for p in info["parameters"]]
        self._offer_weights(info.get("weights", []))
        self.count.setText(f"{human(info['total'])} in {len(self.parameters)} tensors; head: {self.head or 'none'}")
        self.table.setRowCount(len(info["parameters"]))
        for i, p in enumerate(info["parameters"]):
            name = p["name"] + ("   ← head" if p.get("head") else "")
            for j, value in enumerate((name, "×".join(map(str, p["shape"])), f"{p['numel']:,}")):
                self.table.setItem(i, j, QTableWidgetItem(value))
        self.show_frozen()
        self.parametersChanged.emit(self.parameters)
        self.described.emit(info)

    def _offer_weights(self, names: list[str]) -> None:
        """The weights choices: none, the names this model offers, and whatever is typed or chosen as a file."""
        current = self.weights.currentText()
        self.weights.blockSignals(True)
        self.weights.clear()
        self.weights.addItems([NO_WEIGHTS, *names])
        if current and self.weights.findText(current) < 0:
            self.weights.addItem(current)
        self.weights.setCurrentText(current)
        self.weights.blockSignals(False)

    def show_frozen(self) -> None:
        """Grey out the parameters a linear probe leaves frozen (all but the head)."""
        frozen = bool(self.model.get("model.freeze_backbone"))
        for row in range(self.table.rowCount()):
            item = self.table.item(row, 0)
            if item is None:
                continue
            is_head = item.text().endswith("← head")
            color = Qt.GlobalColor.gray if frozen and not is_head else Qt.GlobalColor.black
            for col in range(3):
                cell = self.table.item(row, col)
                if cell is not None:
                    cell.setForeground(color)
            item.setToolTip("frozen: a linear probe trains the head only" if frozen and not is_head else "")
        trainable = sum(n for (name, n), row in zip(self.parameters, range(self.table.rowCount()))
                        if not frozen or self.table.item(row, 0).text().endswith("← head"))
        if self.parameters:
            total = sum(n for _, n in self.parameters)
            self.count.setText(f"{human(total)} in {len(self.parameters)} tensors; head: {self.head or 'none'}"
                               + (f"; {human(trainable)} trainable (backbone frozen)" if frozen else ""))

    def _describe_failed(self, error: str) -> None:
        self._job = None
        self.describe_error = error
        self.parameters = []
        self.count.setText(f"<span style='color:#c9302c'>{error}</span>")
        self.table.setRowCount(0)
        self.parametersChanged.emit([])

    def cancel_jobs(self) -> None:
        self._debounce.stop()
        for job in (self._job, self._store_job):
            if job is not None:
                job.cancel()
        self._job = self._store_job = None

    def _choose_own(self) -> None:
        path, _ = QFileDialog.getOpenFileName(self, "Own model (a .py file with an nn.Module class)", "",
                                              "Python files (*.py)")
        if not path:
            return
        cls, ok = QInputDialog.getText(self, "Model class", "Name of the nn.Module class in that file:", text="Net")
        if not (ok and cls):
            return
        try:  # chosen here, for this use: the one place the window trusts code (a config or run that names it does not)
            spec = grant(f"{path}:{cls}", "Own model file")
        except ModelError as e:
            self._describe_failed(str(e))
            return
        if self.name.currentText() == spec:
            self.describe()  # the same file, trusted again (it had changed): described anew
        else:
            self.model.set("model.name", spec, USER)

    def _choose_weights(self) -> None:
        path, _ = QFileDialog.getOpenFileName(self, "Pretrained weights", "",
                                              "Weights (*.safetensors *.pt *.pth);;All files (*)")
        if path:
            self.model.set("model.weights", path, USER)

    def problems(self) -> list[str]:
        prefix = "model.weights" if self.describe_error.startswith("model.weights") else "model.name"
        return [f"{prefix}: {self.describe_error.split(': ', 1)[-1]}"] if self.describe_error else []

