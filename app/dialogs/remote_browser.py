"""Choosing a folder (or a labels file) on a host: a small browser over `main.py agent ls PATH --host NAME` (one SSH
round trip per folder, on a QProcess: the GUI thread never waits for the network)."""

from __future__ import annotations

from PySide6.QtCore import Qt, Signal
from PySide6.QtWidgets import (
    QDialog,
    QDialogButtonBox,
    QHBoxLayout,
    QLabel,
    QLineEdit,
    QListWidget,
    QListWidgetItem,
    QPushButton,
    QVBoxLayout,
)

from app.jobs.background import CliJob
from trainer.runs.commands import Agent


class RemoteFolderDialog(QDialog):
    chosen = Signal(str)

    def __init__(self, host: str, start: str, parent=None, file: bool = False):
        """`file`: a labels file (CSV) is chosen, not a folder."""
        super().__init__(parent)
        self.host, self.file = host, file
        self.setWindowTitle(f"Choose a {'labels file' if file else 'folder'} on {host}")
        self.setObjectName("remoteFolderDialog")
        self.resize(520, 420)
        self.path = QLineEdit(start or "~")
        self.path.setObjectName("remotePath")
        self.path.returnPressed.connect(lambda: self.go(self.path.text()))
        up = QPushButton("Up")
        up.setObjectName("remoteUp")
        up.clicked.connect(lambda: self.go(self.parent_path))
        self.entries = QListWidget()
        self.entries.setObjectName("remoteEntries")
        self.entries.itemDoubleClicked.connect(self._open)
        self.note = QLabel("")
        self.note.setObjectName("remoteNote")
        self.note.setWordWrap(True)
        buttons = QDialogButtonBox(QDialogButtonBox.StandardButton.Ok | QDialogButtonBox.StandardButton.Cancel)
        self.ok = buttons.button(QDialogButtonBox.StandardButton.Ok)
        self.ok.setText("Choose this file" if file else "Choose this folder")
        if file:
            self.entries.currentItemChanged.connect(lambda item, _: self.ok.setEnabled(self._file_of(item) is not None))
        buttons.accepted.connect(self._accept)
        buttons.rejected.connect(self.reject)
        row = QHBoxLayout()
        row.addWidget(self.path, 1)
        row.addWidget(up)
        layout = QVBoxLayout(self)
        layout.addLayout(row)
        layout.addWidget(self.entries, 1)
        layout.addWidget(self.note)
        layout.addWidget(buttons)
        self.parent_path = start or "~"
        self._job: CliJob | None = None
        self.go(start or "~")

    def go(self, path: str) -> None:
        if self._job is not None:
            self._job.cancel()
        self.note.setText(f"Reading {path} on {self.host}…")
        self._job = CliJob(Agent(action="ls", agent_args=[path], host=self.host), self)
        self._job.done.connect(self._show)
        self._job.failed.connect(self._failed)

    def _show(self, listing: dict) -> None:
        self._job = None
        self.path.setText(listing["path"])
        self.parent_path = listing["parent"]
        self.entries.clear()
        for e in listing["entries"]:
            what = f"{e['images']} images" if e["images"] else f"{e['folders']} folders"
            item = QListWidgetItem(f"{e['name']}/    {what}")
            item.setData(Qt.ItemDataRole.UserRole, f"{listing['path'].rstrip('/')}/{e['name']}")
            self.entries.addItem(item)
        for name in listing["files"] if self.file else []:
            item = QListWidgetItem(name)
            item.setData(Qt.ItemDataRole.UserRole, f"{listing['path'].rstrip('/')}/{name}")
            item.setData(Qt.ItemDataRole.UserRole + 1, "file")
            self.entries.addItem(item)
        if self.file:
            self.ok.setEnabled(False)
            self.note.setText(f"{len(listing['files'])} CSV file(s) here: choose the labels file (file,labels)"
                              if listing["files"] else "No CSV file here. Double-click a folder to open it.")
            return
        looks = sum(1 for e in listing["entries"] if e["images"])
        self.note.setText(f"{looks} of these folders hold images: this looks like an ImageFolder (one folder per "
                          f"class)" if looks >= 2 else "Double-click a folder to open it.")

    def _failed(self, error: str) -> None:
        self._job = None
        self.note.setText(error)

    @staticmethod
    def _file_of(item: QListWidgetItem | None) -> str | None:
        if item is None or item.data(Qt.ItemDataRole.UserRole + 1) != "file":
            return None
        return item.data(Qt.ItemDataRole.UserRole)

    def _open(self, item: QListWidgetItem) -> None:
        if self._file_of(item) is not None:
            self._accept()
        else:
            self.go(item.data(Qt.ItemDataRole.UserRole))

    def _accept(self) -> None:
        if self.file:
            chosen = self._file_of(self.entries.currentItem())
            if chosen is None:
                return
            self.chosen.emit(chosen)
        else:
            self.chosen.emit(self.path.text())
        self.accept()

    def done(self, result: int) -> None:  # noqa: D401 - QDialog's
        if self._job is not None:
            self._job.cancel()
            self._job = None
        super().done(result)
