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
    QProgressBar,
    QPushButton,
    QTableWidget,
    QTableWidgetItem,
    QVBoxLayout,
    QWidget,
)

from app.widgets.forms import ExactDoubleSpinBox
from trainer.core.catalog import AUTO_MAX_MINUTES, AUTO_MIN_MINUTES


def candidate_rows(probes: list[dict], model: str, size) -> list[tuple[str, str, str]]:
    """The plan's candidates (every network and size Auto measured or predicted, best first) as rows of the choices
    table: what each would train in the budget and how that was known; the one chosen marked."""
    rows = []
    for p in probes:
        chosen = p.get("model") == model and p.get("size") == size
        rows.append((f"candidate{' (chosen)' if chosen else ''}", f"{p.get('model')} @ {p.get('size')} px",
                     f"{p.get('epochs')} epochs in the budget at {float(p.get('train_images_per_s') or 0):.0f} "
                     f"training images/s, {p.get('how', 'measured')}"))
    return rows


def shown_value(value) -> str:
    if isinstance(value, list):
        return ", ".join(map(str, value)) or "none"
    if isinstance(value, bool):
        return "on" if value else "off"
    return "none" if value is None else str(value)


class AutoPanel(QGroupBox):
    requested = Signal(float)  # minutes
    downloadRequested = Signal(str, str)  # model, weights: the offered ImageNet weights, into the cache
    downloadCancelled = Signal()

    def __init__(self, parent=None):
        super().__init__("Auto", parent)
        self.setObjectName("autoPanel")
        self.minutes = ExactDoubleSpinBox()  # as typed: 2.25 min stays 2.25
        self.minutes.setObjectName("autoMinutes")
        self.minutes.setRange(AUTO_MIN_MINUTES, AUTO_MAX_MINUTES)  # Auto's own bounds
        self.minutes.setValue(10)
        self.minutes.setSuffix(" min")
        self.minutes.setToolTip("the whole budget: planning, training, the test set and the export")
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
        self._build_choices()
        self._build_offer()
        row = QHBoxLayout()  # the button on a row of its own: the left column stays as narrow as the folders need
        row.addWidget(QLabel("Budget"))
        row.addWidget(self.minutes, 1)
        layout = QVBoxLayout(self)
        layout.addLayout(row)
        layout.addWidget(self.button)
        layout.addWidget(self.status)
        layout.addWidget(self.offer_box)

    def _build_choices(self) -> None:
        """The plan's table: each setting, its value and why (shown by the Dataset page where there is width)."""
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

    def _build_offer(self) -> None:
        """The offer of ImageNet weights the plan makes when none are cached: what, a Download button, its progress
        and Cancel."""
        self.offer = None  # the plan's offer of ImageNet weights (the trainer's answer), while one is shown
        self.offer_text = QLabel()
        self.offer_text.setObjectName("autoOffer")
        self.offer_text.setWordWrap(True)
        self.download = QPushButton("Download")
        self.download.setObjectName("autoDownload")
        self.download.clicked.connect(lambda: self.offer and self.downloadRequested.emit(self.offer["model"],
                                                                                          self.offer["weights"]))
        self.download_progress = QProgressBar()
        self.download_progress.setObjectName("autoDownloadProgress")
        self.download_progress.setFormat("%v of %m MB")
        self.cancel_download = QPushButton("Cancel")
        self.cancel_download.setObjectName("autoDownloadCancel")
        self.cancel_download.clicked.connect(self.downloadCancelled.emit)
        self.offer_box = QWidget()
        offer_row = QHBoxLayout()
        offer_row.setContentsMargins(0, 0, 0, 0)
        for widget in (self.download, self.download_progress, self.cancel_download):
            offer_row.addWidget(widget)
        offer_layout = QVBoxLayout(self.offer_box)
        offer_layout.setContentsMargins(0, 0, 0, 0)
        offer_layout.addWidget(self.offer_text)
        offer_layout.addLayout(offer_row)
        self.offer_box.hide()

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

    def show_choices(self, choices: list[dict], seconds: float, probes: list[dict] | None = None,
                     offer: dict | None = None) -> None:
        self._planned()
        self.status.setText(f"Planned in {seconds:.0f} s; the run is on the Training page. The forms keep the plan, "
                            f"but not its time budget (that was the run's): Start trains with no budget unless you "
                            f"set one (Advanced page, train.budget). New (Ctrl+N) starts from the defaults.")
        self._fill(choices, probes or [])
        self.show_offer(offer)

    # ---- the offer of ImageNet weights (the plan's `offer`: photographs, none cached) ----------------------------
    def show_offer(self, offer: dict | None) -> None:
        self.offer = offer
        self.offer_box.setVisible(offer is not None)
        if offer is None:
            return
        size = f"{offer['megabytes']:.1f} MB" if offer.get("megabytes") else "size not published"
        self.offer_text.setText(f"This run trains from scratch: {offer['why']}. Download them ({size}, from "
                                f"{offer['url']}) and the next Auto plans with them.")
        self.download.setText(f"Download {offer['model']}'s ImageNet weights ({size})")
        self.download.setEnabled(True)
        self.download_progress.hide()
        self.cancel_download.hide()

    def downloading(self, line: str) -> None:
        """A progress line of `main.py fetch-weights` ("FILE: 12.3/44.7 MB"), or its first line."""
        self.download.setEnabled(False)
        self.cancel_download.show()
        done, _, total = line.rpartition(": ")[2].removesuffix(" MB").partition("/")
        try:
            self.download_progress.setRange(0, max(1, round(float(total))))
            self.download_progress.setValue(round(float(done)))
            self.download_progress.show()
        except ValueError:
            pass  # "downloading ADDRESS into FOLDER": the bar comes with the first figures

    def download_ended(self, text: str, ok: bool) -> None:
        self.download_progress.hide()
        self.cancel_download.hide()
        self.download.setEnabled(not ok)
        self.offer_text.setText(text)

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

    def _fill(self, choices: list[dict], probes: list[dict] | None = None) -> None:
        self.planned_folder = next((str(c["value"]) for c in choices if c["key"] == "data.train_dir"), "")
        chosen = {c["key"]: c["value"] for c in choices}
        rows = [(c["key"], shown_value(c["value"]), c["why"]) for c in choices]
        rows += candidate_rows(probes or [], chosen.get("model.name"), chosen.get("data.image_size"))
        self.choices.setRowCount(len(rows))
        for i, row in enumerate(rows):
            for j, text in enumerate(row):
                item = QTableWidgetItem(text)
                item.setToolTip(text)
                self.choices.setItem(i, j, item)
        self.choices.resizeRowsToContents()
        self.choices.show()
