"""The Results tab's left pane: which evaluation, counts or row shares, the zoom, the headline and the confusion
matrix as a table that scrolls and zooms; its cells fit the pane until the user zooms by hand."""

from __future__ import annotations

from PySide6.QtCore import QAbstractTableModel, QModelIndex, Qt, QTimer, Signal
from PySide6.QtGui import QColor, QFont
from PySide6.QtWidgets import (
    QButtonGroup,
    QComboBox,
    QHBoxLayout,
    QHeaderView,
    QLabel,
    QRadioButton,
    QSlider,
    QTableView,
    QVBoxLayout,
    QWidget,
)

NAMES_ON_TOP = 12  # up to this many classes the predicted-class header shows names, else indices (names on hover)
HEADER_MARGIN = 8  # px beside a column's label (the header draws no sort arrow)
LOW, HIGH = QColor(255, 255, 255), QColor(31, 94, 168)


def _blend(share: float) -> QColor:
    s = max(0.0, min(1.0, share))
    return QColor(*(round(a + (b - a) * s) for a, b in zip(LOW.getRgb()[:3], HIGH.getRgb()[:3])))


class ConfusionModel(QAbstractTableModel):
    """Rows: true class; columns: predicted class; cells coloured by the share of their row."""

    def __init__(self):
        super().__init__()
        self.matrix: list[list[int]] = []
        self.classes: list[str] = []
        self.normalised = False
        self.numbered = False  # columns headed by the class's number (the rows name it) when the names do not fit

    def set_matrix(self, matrix: list[list[int]], classes: list[str]) -> None:
        self.beginResetModel()
        if classes != self.classes:
            self.numbered = False  # names again, until they are found not to fit
        self.matrix, self.classes = matrix, classes
        self.endResetModel()

    def set_normalised(self, on: bool) -> None:
        self.normalised = on
        if self.matrix:
            self.dataChanged.emit(self.index(0, 0), self.index(len(self.matrix) - 1, len(self.matrix) - 1))

    def rowCount(self, parent=QModelIndex()) -> int:  # noqa: N802 - Qt's name
        return 0 if parent.isValid() else len(self.matrix)

    def columnCount(self, parent=QModelIndex()) -> int:  # noqa: N802
        return 0 if parent.isValid() else len(self.matrix)

    def share(self, row: int, col: int) -> float:
        total = sum(self.matrix[row])
        return self.matrix[row][col] / total if total else 0.0

    def data(self, index: QModelIndex, role=Qt.ItemDataRole.DisplayRole):
        if not index.isValid():
            return None
        r, c = index.row(), index.column()
        n, share = self.matrix[r][c], self.share(r, c)
        if role == Qt.ItemDataRole.DisplayRole:
            return (f"{100 * share:.0f}" if n else "") if self.normalised else (str(n) if n else "")
        if role == Qt.ItemDataRole.BackgroundRole:
            return _blend(share)
        if role == Qt.ItemDataRole.ForegroundRole:
            return QColor("white") if share > 0.5 else QColor("#222")
        if role == Qt.ItemDataRole.TextAlignmentRole:
            return Qt.AlignmentFlag.AlignCenter
        if role == Qt.ItemDataRole.ToolTipRole:
            return (f"true {self.classes[r]} → predicted {self.classes[c]}: {n} image(s), {100 * share:.1f}% of "
                    f"{self.classes[r]}\nclick to show them")
        return None

    def headerData(self, section: int, orientation, role=Qt.ItemDataRole.DisplayRole):  # noqa: N802
        if section >= len(self.classes):
            return None
        name = self.classes[section]
        if role == Qt.ItemDataRole.DisplayRole:
            numbered = self.numbered or len(self.classes) > NAMES_ON_TOP
            if orientation == Qt.Orientation.Vertical:
                return f"{name}  {section}" if numbered else name
            return str(section) if numbered else name
        if role == Qt.ItemDataRole.ToolTipRole:
            return f"{'predicted' if orientation == Qt.Orientation.Horizontal else 'true'}: {name}"
        return None


class ConfusionPane(QWidget):
    choiceChanged = Signal()  # another evaluation was chosen
    cellClicked = Signal(str, str)  # true class, predicted class

    def __init__(self, parent: QWidget | None = None):
        super().__init__(parent)
        self.eval_choice = QComboBox()
        self.eval_choice.setObjectName("evaluationChoice")
        self.eval_choice.setToolTip("the best epoch's validation set (val), the test set, or an evaluated folder")
        self.eval_choice.currentTextChanged.connect(lambda _: self.choiceChanged.emit())
        self.counts = QRadioButton("Counts")
        self.counts.setChecked(True)
        self.row_share = QRadioButton("Row %")
        self.row_share.setObjectName("rowShare")
        group = QButtonGroup(self)
        group.addButton(self.counts)
        group.addButton(self.row_share)
        self.row_share.toggled.connect(lambda on: self.matrix_model.set_normalised(on))
        self.zoom = QSlider(Qt.Orientation.Horizontal)
        self.zoom.setObjectName("matrixZoom")
        self.zoom.setRange(18, 90)
        self.zoom.setValue(44)
        self.zoom.setToolTip("cell size")
        self.zoom.valueChanged.connect(self._zoom)
        self.zoom.setMinimumWidth(80)
        self._auto_zoom = True  # cells fit the pane (on show and resize) until the user zooms by hand
        self.zoom.sliderMoved.connect(lambda _: setattr(self, "_auto_zoom", False))
        self.headline = QLabel("")
        self.headline.setObjectName("evalHeadline")
        self.headline.setWordWrap(True)
        self.matrix_model = ConfusionModel()
        self.matrix = QTableView()
        self.matrix.setObjectName("confusionMatrix")
        self.matrix.setModel(self.matrix_model)
        self.matrix.setSelectionMode(QTableView.SelectionMode.SingleSelection)
        self.matrix.clicked.connect(lambda index: self.cellClicked.emit(self.matrix_model.classes[index.row()],
                                                                          self.matrix_model.classes[index.column()]))
        self.matrix.verticalHeader().setSectionResizeMode(QHeaderView.ResizeMode.Fixed)
        self.matrix.horizontalHeader().setSectionResizeMode(QHeaderView.ResizeMode.Fixed)
        self._zoom(self.zoom.value())

        self.eval_choice.setSizeAdjustPolicy(QComboBox.SizeAdjustPolicy.AdjustToMinimumContentsLengthWithIcon)
        self.eval_choice.setMinimumContentsLength(12)
        bar = QHBoxLayout()
        bar.addWidget(QLabel("Set"))
        bar.addWidget(self.eval_choice, 1)
        view = QHBoxLayout()
        view.addWidget(self.counts)
        view.addWidget(self.row_share)
        view.addWidget(QLabel("Zoom"))
        view.addWidget(self.zoom, 1)
        ll = QVBoxLayout(self)
        ll.setContentsMargins(0, 0, 0, 0)
        ll.addLayout(bar)
        ll.addLayout(view)
        ll.addWidget(self.headline)
        caption = QLabel("Confusion matrix: rows are the true class, columns the predicted one")
        caption.setWordWrap(True)
        ll.addWidget(caption)
        ll.addWidget(self.matrix, 1)

    def show_matrix(self, matrix: list[list[int]], classes: list[str]) -> None:
        self.matrix_model.set_matrix(matrix, classes)
        self._fit_zoom()


    def _zoom(self, size: int) -> None:
        for header in (self.matrix.horizontalHeader(), self.matrix.verticalHeader()):
            header.setDefaultSectionSize(size)
            header.setMinimumSectionSize(min(size, 18))
        font = QFont(self.matrix.font())
        font.setPointSizeF(max(6.0, min(11.0, size / 4.5)))
        self.matrix.setFont(font)
        self._size_columns()

    def resizeEvent(self, event) -> None:  # noqa: N802 - Qt's name
        super().resizeEvent(event)
        self._refit_soon()

    def showEvent(self, event) -> None:  # noqa: N802
        super().showEvent(event)
        self._refit_soon()

    def _refit_soon(self) -> None:
        """Re-fit the cells once the layout has settled (a tab first shown, a window resized)."""
        if self._auto_zoom and self.matrix_model.matrix:
            QTimer.singleShot(0, self._fit_zoom)

    def _fit_zoom(self) -> None:
        """Cells as large as the room allows (within the zoom's range): a few classes fill the space, many scroll."""
        n = max(self.matrix_model.rowCount(), 1)
        width, height = self._room()
        size = self._largest_cell(width, height, n)
        if size is None and not self.matrix_model.numbered:  # the names do not fit above: number the columns
            self.matrix_model.numbered = True
            self.matrix_model.headerDataChanged.emit(Qt.Orientation.Horizontal, 0, n - 1)
            self.matrix_model.headerDataChanged.emit(Qt.Orientation.Vertical, 0, n - 1)
            width, height = self._room()
            size = self._largest_cell(width, height, n)
        self.zoom.setValue(size or self.zoom.minimum())
        self._size_columns()

    def _room(self) -> tuple[int, int]:
        """The width and height the cells have: the table less its frame, its headers and a scroll bar's width."""
        frame = 2 * self.matrix.frameWidth() + self.matrix.verticalScrollBar().sizeHint().width()
        return (self.matrix.width() - self.matrix.verticalHeader().sizeHint().width() - frame,
                self.matrix.height() - self.matrix.horizontalHeader().sizeHint().height() - frame)

    def _largest_cell(self, width: int, height: int, n: int) -> int | None:
        """The largest cell size at which every column is whole (a column is as wide as its label at least) and
        every row too; None when even the smallest is too big."""
        labels = self._label_widths()
        for candidate in range(self.zoom.maximum(), self.zoom.minimum() - 1, -1):
            if sum(max(candidate, w) for w in labels) <= width and candidate * n <= height:
                return candidate
        return None

    def _label_widths(self) -> list[int]:
        """Each column's class name, in pixels with its margin."""
        metrics = self.matrix.horizontalHeader().fontMetrics()
        return [metrics.horizontalAdvance(self.matrix_model.headerData(col, Qt.Orientation.Horizontal) or "") + HEADER_MARGIN
                for col in range(self.matrix_model.columnCount())]

    def _size_columns(self) -> None:
        """Square cells at the zoom's size, widened where a class name is shown above its column."""
        header = self.matrix.horizontalHeader()
        for col, width in enumerate(self._label_widths()):
            header.resizeSection(col, max(self.zoom.value(), width))
