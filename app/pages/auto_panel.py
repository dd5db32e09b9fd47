"""The Dataset page's Auto box: a time budget, one button, and then every choice Auto made with its reason.

Auto itself runs in the trainer (`main.py auto FOLDER --minutes N --plan-only`, a subprocess); this box only asks
and shows what it answered. The main window loads the plan into the forms and starts it as a run; for a SLURM host
the trainer answers that the plan is made inside the job, and the choices are shown when the job has made them.
"""

from __future__ import annotations

import os

from PySide6.QtCore import Qt, Signal
from PySide6.QtWidgets import (
    QGroupBox,
    QHBoxLayout,
    QHeaderView,
    QLabel,
    QPushButton,
    QTableWidget,
    QTableWidgetItem,
    QVBoxLayout,
)

from app.widgets.forms import ExactDoubleSpinBox
from trainer.core.catalog import AUTO_MAX_MINUTES, AUTO_MIN_MINUTES


def shown_value(value) -> str:
    if isinstance(value, list):
        return ", ".join(map(str, value)) or "none"
    if isinstance(value, bool):
        return "on" if value else "off"
    return "none" if value is None else str(value)


class AutoPanel(QGroupBox):
    requested = Signal(float)  # minutes

    def __init__(self, parent=None):
        super().__init__("Auto", parent)
        self.setObjectName("autoPanel")
        self.minutes = ExactDoubleSpinBox()  # as typed: 2.25 min stays 2.25
        self.minutes.setObjectName("autoMinutes")
        self.minutes.setRange(AUTO_MIN_MINUTES, AUTO_MAX_MINUTES)  # Auto's own bounds
        self.minutes.setValue(10)
        self.minutes.setSuffix(" min")
        self.minutes.setToolTip("the whole budget: planning and training (the test set and the export come after)")
        self.shown_run = None  # the run whose job-made choices are shown (Auto on a SLURM host)
        self._planning = False
        self.planned_folder = ""  # the training folder of the plan shown ("" when none is)
        self._unusable = ""  # why the folder's scan says it cannot be trained on ("" when it can, or is unscanned)
        self.button = QPushButton("Train the best model in this time")
        self.button.setObjectName("autoStart")
        self.button.clicked.connect(lambda: self.requested.emit(self.minutes.value()))
        self.status = QLabel("Chooses the network, image size, batch, learning rate and epochs for this folder and "
                             "this machine from a measured speed probe, trains, tests and exports to ONNX.")
        self.status.setObjectName("autoStatus")
        self.status.setWordWrap(True)
        self.choices = QTableWidget(0, 3)
        self.choices.setObjectName("autoChoices")
        self.choices.setHorizontalHeaderLabels(["Setting", "Value", "Why"])
        self.choices.verticalHeader().hide()
        self.choices.setWordWrap(True)
        self.choices.setEditTriggers(QTableWidget.EditTrigger.NoEditTriggers)
        header = self.choices.horizontalHeader()
        for column, width in ((0, 150), (1, 110)):  # fixed: a long key or path must not squeeze the reasons
            header.setSectionResizeMode(column, QHeaderView.ResizeMode.Interactive)
            self.choices.setColumnWidth(column, width)
        header.setSectionResizeMode(2, QHeaderView.ResizeMode.Stretch)
        # rows as tall as their wrapped reasons at the width they have now (a page resize rewraps them)
        self.choices.verticalHeader().setSectionResizeMode(QHeaderView.ResizeMode.ResizeToContents)
        self.choices.setTextElideMode(Qt.TextElideMode.ElideNone)  # reasons wrap, whole; never cut mid-sentence
        self.choices.setMinimumHeight(220)
        self.choices.hide()  # the Dataset page places it where there is width for the reasons
        row = QHBoxLayout()  # the button on a row of its own: the left column stays as narrow as the folders need
        row.addWidget(QLabel("Budget"))
        row.addWidget(self.minutes, 1)
        layout = QVBoxLayout(self)
        layout.addLayout(row)
        layout.addWidget(self.button)
        layout.addWidget(self.status)

    def set_folder_problem(self, why: str) -> None:
        """The Dataset page's scan: `why` the folder cannot be trained on ("" when it can). Auto waits for a folder
        it could plan for (on an empty one it took ~25 s to refuse)."""
        self._unusable = why
        self._enable()

    def _enable(self) -> None:
        self.button.setEnabled(not self._planning and not self._unusable)
        self.button.setToolTip(f"Auto needs a folder it can train on: {self._unusable}" if self._unusable else "")

    def planning(self, text: str) -> None:
        self._planning = True
        self._enable()
        self.status.setText(f"Planning: {text}…")

    def _planned(self) -> None:
        self._planning = False
        self._enable()

    def failed(self, text: str) -> None:
        self._planned()
        self.status.setText(f"Auto could not plan: {text}")

    def show_choices(self, choices: list[dict], seconds: float) -> None:
        self._planned()
        self.status.setText(f"Planned in {seconds:.0f} s; the run is on the Training page. The forms keep the plan, "
                            f"but not its time budget (that was the run's): Start trains with no budget unless you "
                            f"set one (Advanced page, train.budget). New (Ctrl+N) starts from the defaults.")
        self._fill(choices)

    def waiting_for_job(self, why: str) -> None:
        """Auto submitted as a job that plans where it lands: the run is going, its choices are not made yet."""
        self._planned()
        self.shown_run = None
        self.choices.hide()
        self.status.setText(f"{why}. The run is on the Training page; its choices appear here once the job has "
                            f"made them.")

    def show_job_choices(self, choices: list[dict], run, host: str) -> None:
        self.shown_run = run
        self.status.setText(f"Planned inside the job on {host}; the run is on the Training page. The forms were left "
                            f"as they were: this plan is the job's.")
        self._fill(choices)

    def folder_changed(self, folder: str) -> None:
        """The Dataset page's training folder is now `folder`: a plan made for another folder goes from the page (it
        stayed there, over the new folder's widgets)."""
        planned = self.planned_folder
        if planned and os.path.normpath(planned) != os.path.normpath(folder or ""):
            self.planned_folder = ""
            self.shown_run = None
            self.choices.hide()
            self.status.setText(f"The last plan was for {planned}; plan again for this folder.")

    def _fill(self, choices: list[dict]) -> None:
        self.planned_folder = next((str(c["value"]) for c in choices if c["key"] == "data.train_dir"), "")
        self.choices.setRowCount(len(choices))
        for i, c in enumerate(choices):
            for j, text in enumerate((c["key"], shown_value(c["value"]), c["why"])):
                item = QTableWidgetItem(text)
                item.setToolTip(text)
                self.choices.setItem(i, j, item)
        self.choices.resizeRowsToContents()
        self.choices.show()
