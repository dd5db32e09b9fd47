"""Labelling the next images (issue #35): a pool folder of unlabelled images, ordered by `main.py label` (the run's
network least sure first, no two near-copies at the top), shown one at a time with the network's guess. The number
keys label it (`class_keys`: a class named by a digit has that digit, the others the free digits in class order, so up
to ten classes have a key), a class name from the box (Enter) as any, S skips; each label is an addition in the
dataset manifest (the file stays where it is), and the label written is shown. "Train again" starts a run with them.
A multi-label run's pool (issue #49): the number keys and buttons toggle labels, starting from the set the network
gives at the thresholds, and L writes the checked set as the image's labels.
"""

from __future__ import annotations

import html
from collections.abc import Callable

from PySide6.QtCore import Qt, Signal
from PySide6.QtGui import QImage, QKeySequence, QPixmap, QShortcut
from PySide6.QtWidgets import (
    QComboBox,
    QDialog,
    QFileDialog,
    QGridLayout,
    QHBoxLayout,
    QLabel,
    QLineEdit,
    QPushButton,
    QSpinBox,
    QVBoxLayout,
    QWidget,
)

from app.jobs.background import CliJob, run_in_thread
from app.widgets.thumbnails import load_thumbnails
from trainer.core.catalog import LABEL_NEXT_MAX
from trainer.runs.commands import Label

PREVIEW = 300
KEY_ORDER = "1234567890"  # the number keys, in the order classes without a digit name get them
PREVIEW_PRIORITY = 10  # the images to label go ahead of any thumbnails the window behind is loading


class LabelDialog(QDialog):
    """One image at a time from the pool, labelled by a key."""

    trainRequested = Signal()

    def __init__(self, run_path: str, manifest_path: Callable[[], str], add_label: Callable[[str, str], str],
                 parent: QWidget | None = None):
        super().__init__(parent)
        self.setWindowTitle("Label the next images")
        self.run_path = run_path
        self.manifest_path = manifest_path
        self.add_label = add_label  # (image, class) -> "" or why the manifest could not take it
        self.picks: list[dict] = []
        self.images: dict[str, QImage] = {}  # the picks' previews, read in one go when the pool is ordered
        self.classes: list[str] = []
        self.multilabel = False  # the run's: each image takes a set of labels (the toggles), written by L
        self.checked: list[str] = []  # a multi-label image's labels as toggled, in class order
        self.at = 0
        self.labelled: dict[str, str] = {}
        self.last_written = ""  # what the last label wrote, shown above the next image
        self.pool_notes, self.pool_size = "", 0
        self._job: CliJob | None = None
        browse = self._build_pool_row()
        self.status = QLabel("Choose a pool folder, then order it.")
        self.status.setObjectName("labelStatus")
        self.status.setWordWrap(True)
        self.preview = QLabel()
        self.preview.setFixedSize(PREVIEW, PREVIEW)
        self.preview.setAlignment(Qt.AlignmentFlag.AlignCenter)
        self.preview.setFocusPolicy(Qt.FocusPolicy.StrongFocus)
        self.preview.setStyleSheet("background: #f4f4f4; border: 1px solid #ddd;")
        self.guess = QLabel("")
        self.guess.setObjectName("labelGuess")
        self.guess.setWordWrap(True)
        self.class_buttons = QGridLayout()
        self.name = QComboBox()
        self.name.setObjectName("labelClassName")
        self.name.setEditable(True)
        self.name.setInsertPolicy(QComboBox.InsertPolicy.NoInsert)
        self.name.lineEdit().returnPressed.connect(self._label_typed)
        skip = QPushButton("Skip (S)")
        skip.clicked.connect(self.skip)
        self.set_button = QPushButton("Label with the checked (L)")
        self.set_button.setObjectName("labelWithChecked")
        self.set_button.clicked.connect(self.label_checked)
        self.set_button.setVisible(False)
        self.train_button = QPushButton("Train again with the new labels")
        self.train_button.setObjectName("trainAgain")
        self.train_button.setEnabled(False)
        self.train_button.clicked.connect(self._train)
        self._layout(browse, skip)
        for button in (browse, self.find_button, skip, self.set_button, self.train_button):
            button.setAutoDefault(False)  # Enter in the class box labels; it must not press a button (Browse…)
        self.keys: dict[str, str] = {}  # number key -> class (class_keys of the run's classes)
        for key in KEY_ORDER:
            QShortcut(QKeySequence(key), self, lambda k=key: self._key(k))
        QShortcut(QKeySequence("S"), self, self.skip)
        QShortcut(QKeySequence("L"), self, self.label_checked)

    def _build_pool_row(self) -> QPushButton:
        """The pool folder, how many to order and Order the pool; the folder's Browse… button."""
        self.pool = QLineEdit()
        self.pool.setObjectName("poolFolder")
        self.pool.setPlaceholderText("a folder of unlabelled images")
        browse = QPushButton("Browse…")
        browse.clicked.connect(self._browse)
        self.count = QSpinBox()
        self.count.setRange(1, LABEL_NEXT_MAX)  # the trainer's limit
        self.count.setValue(20)
        self.count.setPrefix("next ")
        self.find_button = QPushButton("Order the pool")
        self.find_button.setObjectName("orderPool")
        self.find_button.setToolTip("main.py label: the run's network least sure first, no two near-copies at the top")
        self.find_button.clicked.connect(self.order_pool)
        return browse

    def _layout(self, browse: QPushButton, skip: QPushButton) -> None:
        top = QHBoxLayout()
        top.addWidget(self.pool, 1)
        top.addWidget(browse)
        top.addWidget(self.count)
        top.addWidget(self.find_button)
        side = QVBoxLayout()
        side.addWidget(self.guess)
        side.addLayout(self.class_buttons)
        by_name = QHBoxLayout()
        by_name.addWidget(QLabel("Class:"))
        by_name.addWidget(self.name, 1)
        by_name.addWidget(skip)
        side.addLayout(by_name)
        side.addWidget(self.set_button)
        side.addStretch(1)
        side.addWidget(self.train_button)
        middle = QHBoxLayout()
        middle.addWidget(self.preview)
        middle.addLayout(side, 1)
        layout = QVBoxLayout(self)
        layout.addLayout(top)
        layout.addWidget(self.status)
        layout.addLayout(middle, 1)

    def _browse(self) -> None:
        folder = QFileDialog.getExistingDirectory(self, "Pool of unlabelled images", self.pool.text())
        if folder:
            self.pool.setText(folder)

    def order_pool(self) -> None:
        """`main.py label RUN --pool F --next N --json` in a process of its own (CliJob)."""
        if self._job is not None or not self.pool.text().strip():
            return
        self.find_button.setEnabled(False)
        self.status.setText("Running the pool through the run's network…")
        args = Label(run_dir=str(self.run_path), pool=self.pool.text().strip(), next=self.count.value(),
                     manifest=self.manifest_path(), json=True)
        self._job = CliJob(args, self)
        self._job.done.connect(self._ordered)
        self._job.failed.connect(self._failed)

    def _failed(self, error: str) -> None:
        self._job = None
        self.find_button.setEnabled(True)
        self.status.setText(f"<span style='color:#c9302c'>{html.escape(error)}</span>")

    def _ordered(self, report: dict) -> None:
        self._job = None
        self.find_button.setEnabled(True)
        self.picks, self.classes, self.at = report["picks"], report["classes"], 0
        self.multilabel = bool(report.get("multilabel"))
        self.set_button.setVisible(self.multilabel)
        self._class_buttons()
        notes = [f"{len(report['in_dataset'])} already in the run's data (left out)" if report["in_dataset"] else "",
                 f"{len(report['labelled'])} already labelled" if report["labelled"] else "",
                 f"{len(report['skipped'])} unreadable" if report["skipped"] else ""]
        self.pool_notes = "; ".join(n for n in notes if n)
        self.pool_size = report["pool"]
        self.images = {}
        paths = [p["path"] for p in self.picks]
        run_in_thread(lambda: load_thumbnails(paths, PREVIEW), lambda images: self._read(paths, images), owner=self,
                      priority=PREVIEW_PRIORITY)
        self._show()

    def _read(self, paths: list[str], images: list) -> None:
        """Every pick's preview, read: each next image shows at once."""
        self.images = dict(zip(paths, images))
        if self.at < len(self.picks):
            self._preview(self.picks[self.at]["path"], self.images[self.picks[self.at]["path"]])

    def _class_buttons(self) -> None:
        while self.class_buttons.count():
            self.class_buttons.takeAt(0).widget().deleteLater()
        self.keys = class_keys(self.classes)
        for i, (key, name) in enumerate(sorted(self.keys.items(), key=lambda kv: self.classes.index(kv[1]))):
            button = QPushButton(name if key == name else f"{key}  {name}")  # "9  9" said nothing more
            button.setToolTip(f"key {key}")
            button.setAutoDefault(False)
            button.setObjectName(f"labelAs:{name}")
            button.setCheckable(self.multilabel)
            button.setProperty("labelToggle", self.multilabel)  # a checked label stands out (resources/style.qss)
            button.clicked.connect(lambda _=False, n=name: self.toggle(n) if self.multilabel else self.label(n))
            self.class_buttons.addWidget(button, i // 3, i % 3)
        self.name.clear()
        self.name.addItems(self.classes)
        self.name.setCurrentText("")

    def _show(self) -> None:
        done = f"{len(self.labelled)} labelled"
        if self.last_written:
            done = f"{done} · {self.last_written}"
        notes = f" · {self.pool_notes}" if self.pool_notes else ""
        if self.at >= len(self.picks):
            self.status.setText(f"{done}; nothing more in this list{notes}. Train again, or order the pool again.")
            self.preview.setPixmap(QPixmap())
            self.guess.setText("")
            return
        pick = self.picks[self.at]
        self.status.setText(f"Image {self.at + 1} of {len(self.picks)} (of {self.pool_size} in the pool) · {done}"
                            f"{notes}<br><span style='color:#777'>{html.escape(pick['path'])}</span>")
        top = " · ".join(f"{html.escape(c)} {100 * p:.0f}%" for c, p in pick["top"])
        if self.multilabel:
            self.checked = [n for n in pick["guess"].split(";") if n]
            self._show_checked()
            self.guess.setText(f"The network at its thresholds: <b>{html.escape(pick['guess'] or 'no label')}</b> "
                               f"(least decided: {top}; {html.escape(pick['about'])} is {pick['margin']:.2f} from its "
                               f"threshold). Toggle the labels it carries, then L.")
        else:
            self.guess.setText(f"The network's guess: <b>{html.escape(pick['guess'])}</b> ({top}; margin "
                               f"{pick['margin']:.2f})")
        path = pick["path"]
        self.preview.setPixmap(QPixmap())  # never the last image under this one's guess while it loads
        if path in self.images:
            self._preview(path, self.images[path])

    def _preview(self, path: str, image) -> None:
        if self.at < len(self.picks) and self.picks[self.at]["path"] == path and not image.isNull():
            self.preview.setPixmap(QPixmap.fromImage(image))

    def _key(self, key: str) -> None:
        if key in self.keys and not self.name.lineEdit().hasFocus():
            (self.toggle if self.multilabel else self.label)(self.keys[key])

    def toggle(self, name: str) -> None:
        """A multi-label image: `name` on or off its labels (not written until L)."""
        if self.at >= len(self.picks) or name not in self.classes:
            return
        on = set(self.checked) ^ {name}
        self.checked = [n for n in self.classes if n in on]
        self._show_checked()

    def _show_checked(self) -> None:
        for i in range(self.class_buttons.count()):
            button = self.class_buttons.itemAt(i).widget()
            button.setChecked(button.objectName().split(":", 1)[1] in self.checked)
        self.set_button.setText(f"Label with {';'.join(self.checked) or 'no label'} (L)")

    def label_checked(self) -> None:
        """A multi-label image: the checked labels written as its label set."""
        if self.multilabel:
            self.label(";".join(self.checked))

    def _label_typed(self) -> None:
        """Enter in the class box: the name typed. An empty box is nothing to label (the editable box says Enter
        once more after a label has cleared it)."""
        typed = self.name.currentText().strip()
        if typed and self.multilabel:
            self.toggle(typed)
            self.name.setCurrentText("")
        elif typed:
            self.label(typed)

    def label(self, class_name: str) -> None:
        """The shown image as `class_name`: an addition in the manifest, then the next image."""
        if self.at >= len(self.picks):
            return
        names = [n for n in class_name.split(";") if n] if self.multilabel else [class_name]  # a set, or a class
        if any(n not in self.classes for n in names):
            self.status.setText(f"<span style='color:#c9302c'>{html.escape(class_name)!s} is not a class of the run "
                                f"({html.escape(', '.join(self.classes))})</span>")
            return
        error = self.add_label(self.picks[self.at]["path"], class_name)
        if error:  # the manifest could not be read or written: nothing is lost, the image stays shown
            self.status.setText(f"<span style='color:#c9302c'>{html.escape(error)}</span>")
            return
        path = self.picks[self.at]["path"]
        self.labelled[path] = class_name
        self.last_written = f"Labelled {path.rsplit('/', 1)[-1]} as <b>{html.escape(class_name or 'no label')}</b>"
        self.train_button.setEnabled(True)
        self.name.setCurrentText("")
        self.preview.setFocus()  # the number keys label the next image, even after a name typed in the box
        self.skip()

    def skip(self) -> None:
        if self.at < len(self.picks):
            self.at += 1
            self._show()

    def _train(self) -> None:
        self.trainRequested.emit()


def class_keys(classes: list[str]) -> dict[str, str]:
    """Number key -> class: a class named by a digit has that digit's key ("9" is 9); the other classes take the
    digits left, 1-9 then 0, in class order; classes beyond ten are labelled from the class box."""
    keys = {name: name for name in classes if len(name) == 1 and name in KEY_ORDER}
    free = [key for key in KEY_ORDER if key not in keys]
    for name in classes:
        if name not in keys.values() and free:
            keys[free.pop(0)] = name
    return keys
