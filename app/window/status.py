"""The status bar: the run's state, the form's first problem, the time budget, the ETA and the epoch progress; a
finished run's word (a box for a failure, the tray when the window is not in front)."""

from __future__ import annotations

from PySide6.QtCore import QObject
from PySide6.QtWidgets import QLabel, QMessageBox, QProgressBar, QPushButton, QStatusBar, QStyle, QSystemTrayIcon, QWidget

from app.jobs.run_controller import RunController
from app.pages.advanced_page import value_text
from trainer.core.rundir import FAILED_STATES


class StatusLine(QObject):
    def __init__(self, bar: QStatusBar, runs: RunController, restore_button: QPushButton, parent: QWidget):
        super().__init__(parent)
        self.runs = runs
        self.parent_widget = parent  # a failure's box over it, or the tray when it is not in front
        self.state_label = QLabel("Ready")
        self.state_label.setObjectName("stateLabel")
        self.problem_label = QLabel("")
        self.problem_label.setObjectName("problemLabel")
        self.problem_label.setStyleSheet("color: #c9302c;")
        self.progress = QProgressBar()
        self.progress.setObjectName("epochProgress")
        self.progress.setMaximumWidth(260)
        self.progress.setFormat("epoch %v/%m")
        self.eta_label = QLabel("")
        self.budget_label = QLabel("")
        self.budget_label.setObjectName("budgetLabel")
        self.budget_label.setStyleSheet("font-weight: bold;")
        bar.addWidget(self.state_label)
        bar.addWidget(self.problem_label, 1)
        for widget in (self.budget_label, self.eta_label, restore_button, self.progress):
            bar.addPermanentWidget(widget)
        self.tray = QSystemTrayIcon(parent.windowIcon(), parent) if QSystemTrayIcon.isSystemTrayAvailable() else None
        if self.tray:
            self.tray.setIcon(parent.style().standardIcon(QStyle.StandardPixmap.SP_ComputerIcon))
            self.tray.show()
        runs.stateText.connect(self.state_label.setText)
        runs.progressed.connect(self.show_progress)
        runs.runFinished.connect(self.run_finished)

    def show_problems(self, problems: list[str]) -> None:
        self.problem_label.setText(problems[0] + (f"  (+{len(problems) - 1} more)" if len(problems) > 1 else "")
                                   if problems else "")
        self.problem_label.setToolTip("\n".join(problems))

    def show_hidden_settings(self, differing: dict, actions) -> None:
        """Before Start: its tooltip names every setting with no form of its own that differs from its default (the
        Advanced page lists them), and a time budget shows in the status bar. `actions`: Start's and Queue's."""
        budget = differing.get("train.budget")
        budget = budget if isinstance(budget, (int, float)) and budget > 0 else None
        tip = "Start a run with the settings on the pages"
        if differing:
            tip += ", including these from the Advanced page:\n" + "\n".join(
                f"{key} = {value_text(value)}" for key, value in differing.items())
        if budget:
            tip = f"The run ends after its time budget of {budget:g} min (train.budget).\n" + tip
        start, queue = actions
        start.setToolTip(tip)
        queue.setToolTip(tip.replace("Start a run", "Queue a run"))
        self.budget_label.setText(f"budget {budget:g} min" if budget else "")
        self.budget_label.setToolTip("train.budget, on the Advanced page: the run ends when it is spent" if budget
                                     else "")

    def _fit_progress(self) -> None:
        """The progress as wide as its text ("epoch 61/97 · stopped early" was cut at 1024 px)."""
        self.progress.setMinimumWidth(min(self.progress.maximumWidth(),
                                          self.progress.fontMetrics().horizontalAdvance(self.progress.text()) + 40))

    def show_progress(self, done: float, epochs: int, eta_s: float | None) -> None:
        model = self.runs.model
        preparing = model is not None and not model.start_event and not model.ended  # before the trainer's run_start
        self.progress.setFormat(("preparing" + (f" · {epochs} epochs planned" if epochs else "")) if preparing
                                else "epoch %v/%m")
        self.progress.setMaximum(max(epochs, 1))
        self.progress.setValue(int(done))
        self._fit_progress()
        budget = model.start_event.get("config", {}).get("train", {}).get("budget") or 0 if model is not None else 0
        text = "" if eta_s is None else f"ETA {int(eta_s // 60)}:{int(eta_s % 60):02d}"
        if budget:  # the trainer ends the run when its budget is spent, whatever the pace says
            text = f"{text} (budget {budget:g} min)".strip()
        self.eta_label.setText(text)

    def run_finished(self, state: str, message: str) -> None:
        self.eta_label.setText("")
        model, window = self.runs.model, self.parent_widget
        if state == "completed":  # what the run trained, of what it planned (an early stop ends short of it)
            done, epochs, reason = model.final_progress()
            self.progress.setMaximum(max(epochs, 1))
            self.progress.setValue(done)
            self.progress.setFormat(f"epoch %v/%m · {reason}" if reason else "epoch %v/%m")
            self._fit_progress()
        elif self.progress.format().startswith("preparing"):  # ended before its first step: no longer preparing
            self.progress.setFormat(state)
            self._fit_progress()
        if state in FAILED_STATES and message and window.isVisible() and window.isActiveWindow():
            box = QMessageBox(QMessageBox.Icon.Warning, f"Run {state}", message, parent=window)
            box.setDetailedText(model.run.tail_log(30))
            box.setObjectName("runFailedBox")
            box.open()
        if self.tray and not window.isActiveWindow():
            self.tray.showMessage("TrainDeck", f"{model.run.name}: {state}",
                                  QSystemTrayIcon.MessageIcon.Warning if state != "completed"
                                  else QSystemTrayIcon.MessageIcon.Information)

    def shutdown(self) -> None:
        if self.tray:
            self.tray.hide()
