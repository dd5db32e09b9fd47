"""Live dashboard of one run: the Curves, Gradients, Results and Log tabs, and a side panel (summary, system,
warnings).

Views hold no training state: they read the RunModel's buffers on a 10 Hz timer and redraw only what changed
(curves created once, `setData`, min/max-thinned series). Each tab is its own module; this one composes them.
"""

from __future__ import annotations

import html
from pathlib import Path

from PySide6.QtCore import Qt, QTimer
from PySide6.QtGui import QFont
from PySide6.QtWidgets import (
    QHBoxLayout,
    QLabel,
    QListWidget,
    QListWidgetItem,
    QPlainTextEdit,
    QProgressBar,
    QSplitter,
    QTabWidget,
    QVBoxLayout,
    QWidget,
)

from app.jobs.run_model import RunModel
from app.training.curves_tab import CurvesTab
from app.training.gradients_tab import GradientsTab
from app.training.results_tab import ResultsTab

REDRAW_MS = 100
# Curves redrawn per timer tick, whichever changed, in turn: repainting one plot (its axes, their text, its curves)
# costs 10-17 ms on 2 EPYC cores, so redrawing all six at once under a flood of events stalled the GUI thread.
PLOTS_PER_TICK = 1
# While the run model is catching up on unread events, redraw only every this many ticks: painting (axes with
# their text, curves) otherwise takes most of the GUI thread and the backlog drains slowly.
CATCHING_UP_EVERY = 5
GRADIENTS_TAB, RESULTS_TAB = 1, 2


def augment_line(decided: list[dict]) -> str:
    """What the trainer decided for data.augment's auto values, for the summary (the reasons on hover)."""
    shown = {"data.augment.hflip": lambda v: "flips " + ("on" if v else "off"),
             "data.augment.crop_scale_min": lambda v: f"crops from {100 * v:.0f}%"}
    parts = [f"<span title='{html.escape(c['why'], quote=True)}'>{shown[c['key']](c['value'])}</span>"
             for c in decided if c["key"] in shown]
    return f"<br>augmentation (auto): {', '.join(parts)}" if parts else ""


TAB_CLASSES = (CurvesTab, GradientsTab, ResultsTab)  # built in this order, each its own part (`Dashboard.parts`)


class Dashboard(QWidget):
    def __init__(self, parent: QWidget | None = None, built: list[QWidget] | None = None):
        """`built`: the first of its tabs, already built (`parts()`, while the window was idle); the rest now."""
        super().__init__(parent)
        self.model: RunModel | None = None
        built = list(built or [])
        self.curves, self.gradients, self.results = built + [cls() for cls in TAB_CLASSES[len(built):]]
        self.log_view = QPlainTextEdit()
        self.log_view.setObjectName("logView")
        self.log_view.setReadOnly(True)
        self.log_view.setMaximumBlockCount(5000)
        self.log_view.setFont(QFont("monospace", 9))

        self.tabs = QTabWidget()
        self.tabs.addTab(self.curves, "Curves")
        self.tabs.addTab(self.gradients, "Gradients")
        self.tabs.addTab(self.results, "Results")
        self.tabs.addTab(self.log_view, "Log")
        self.tabs.currentChanged.connect(lambda _: self.redraw())

        side = self._build_side_panel()

        # the side panel can be narrowed or dragged shut (a laptop screen), the tabs keep the rest
        self.splitter = QSplitter()
        self.splitter.setObjectName("dashboardSplitter")
        self.splitter.addWidget(self.tabs)
        self.splitter.addWidget(side)
        self.splitter.setStretchFactor(0, 1)
        self.splitter.setCollapsible(0, False)
        self.splitter.setSizes([1000, 260])
        layout = QHBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 0)
        layout.addWidget(self.splitter)
        self.side = side

        self._timer = QTimer(self)
        self._timer.setInterval(REDRAW_MS)
        self._timer.timeout.connect(self._tick)
        self._ticks = 0

    @staticmethod
    def parts(built: list[QWidget]):
        """The dashboard's tabs built one per step into `built` (a generator: a step per turn of the event loop,
        none holding the GUI thread much longer than its plots take to make)."""
        for cls in TAB_CLASSES[len(built):]:
            built.append(cls())
            yield True

    def _build_side_panel(self) -> QWidget:
        """The side panel: the run's summary, its progress, the machine's load and the warnings."""
        # ---- side panel ----
        self.summary = QLabel("No run yet: press Start.")
        self.summary.setObjectName("runSummary")
        self.summary.setWordWrap(True)
        self.summary.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        self.progress = QProgressBar()
        self.progress.setObjectName("prepareProgress")
        self.progress.hide()
        self.system = QLabel("")
        self.system.setObjectName("systemPanel")
        self.system.setWordWrap(True)
        self.warnings = QListWidget()
        self.warnings.setObjectName("warnings")
        self.warnings.setWordWrap(True)  # a long warning wraps in the narrow panel, not cut at its edge
        self.warnings.setResizeMode(QListWidget.ResizeMode.Adjust)
        self.warnings.setHorizontalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)
        self._replan_item: QListWidgetItem | None = None  # the one line the re-plans of a run share
        side = QWidget()
        side.setObjectName("sidePanel")
        side.setMinimumWidth(150)
        side.setMaximumWidth(320)
        sl = QVBoxLayout(side)
        sl.addWidget(QLabel("<b>Run</b>"))
        sl.addWidget(self.summary)
        sl.addWidget(self.progress)
        sl.addWidget(QLabel("<b>System</b>"))
        sl.addWidget(self.system)
        sl.addWidget(QLabel("<b>Warnings and errors</b>"))
        sl.addWidget(self.warnings, 1)
        return side

    # ---- binding to a run ----------------------------------------------------------------------
    def set_model(self, model: RunModel) -> None:
        """Show `model` (the previous RunModel is discarded by its owner, and its connections with it)."""
        self.model = model
        for tab in (self.curves, self.gradients, self.results):
            tab.set_model(model)
        self.log_view.clear()
        self.warnings.clear()
        self._replan_item = None
        self.system.setText("")
        self._facts = f"<b>{model.run.name}</b>"  # what the summary says of the run, once it has started
        self.summary.setText(f"{model.run.name}<br>preparing: starting the trainer…")
        self.progress.hide()
        model.preparing.connect(self._preparing)
        model.runStarted.connect(self._run_started)
        model.warningRaised.connect(self._warning)
        model.replanned.connect(self._replanned)
        model.restarted.connect(self._restarted)
        model.errorRaised.connect(self._error)
        model.systemSampled.connect(self._system)
        model.logAppended.connect(self._log)
        model.tested.connect(self._tested)
        model.epochEnded.connect(lambda e: self.results.redraw())
        model.finished.connect(self._finished)
        model.segmentExpected.connect(self._resuming)
        self._timer.start()
        self.redraw()

    def stop_updates(self) -> None:
        self._timer.stop()

    def _preparing(self, e: dict) -> None:
        if self.model.start_event and not self.model.awaiting_start:  # the test set and exports, after training
            self.summary.setText(f"{self._facts}<br>finishing: {e.get('message', '')}")
            return
        self.summary.setText(f"{self.model.run.name}<br>preparing: {e.get('message', '')}")
        if e.get("total"):
            self.progress.setRange(0, e["total"])
            self.progress.setValue(e.get("done", 0))
            self.progress.setFormat("downloading weights %p%" if e.get("phase") == "weights" else "decoding images %v/%m")
            self.progress.show()

    def _run_started(self, e: dict) -> None:
        self.progress.hide()
        cfg = e.get("config", {})
        budget = cfg.get("train", {}).get("budget") or 0
        self._facts = (
            f"<b>{self.model.run.name}</b><br>{cfg.get('model', {}).get('name')} on {len(e.get('classes') or [])} "
            f"classes<br>{e.get('train_size', '?')} train / {e.get('val_size', '?')} val images"
            f"<br>{e.get('device', '?')}, cache {e.get('cache', '?')}"
            f"<br>{e.get('precision', 'fp32')}, {e.get('memory_format', 'contiguous_format')}"
            + (", compiled" if e.get("compiled") else "")
            + (f"<br>{e['trainable']:,} trainable parameters" if isinstance(e.get("trainable"), int) else "")
            + (f"<br>weights {e['weights'].get('name') or Path(e['weights']['file']).name}" if e.get("weights") else "")
            + ("<br>linear probe: backbone frozen" if e.get("frozen", {}).get("backbone") else "")
            + (f"<br>backbone frozen until epoch {e['frozen']['until_epoch']}"
               if e.get("frozen", {}).get("until_epoch") else "")
            + (f"<br>resumed from {Path(e['resumed_from']).name} at epoch {e.get('start_epoch', 0)}, step "
               f"{e.get('start_step', 0)}" if e.get("resumed_from") else "")
            + (f"<br><b>time budget {budget:g} min</b> (train.budget)" if budget else "")
            + augment_line(e.get("augment") or []))
        self.summary.setText(self._facts)
        self.curves.add_group_curves()

    def _tested(self, e: dict) -> None:
        if "map" in e:  # a multi-label run's test set
            self._facts += (f"<br><b>test set: mAP {100 * (e['map'] or 0):.1f}%</b> (micro "
                            f"{100 * (e.get('map_micro') or 0):.1f}%) on {e['images']} images")
            self.summary.setText(self._facts)
            return
        top5 = f", top-5 {100 * e['top5_accuracy']:.1f}%" if e.get("top5_accuracy") is not None else ""
        self._facts += f"<br><b>test accuracy: {100 * e['accuracy']:.1f}%</b> on {e['images']} images{top5}"
        self.summary.setText(self._facts)

    def _resuming(self) -> None:
        """Resume or Continue launched: the trainer takes a while to start again; the panel says so, not 'stopped'."""
        self.summary.setText(f"{self._facts}<br><b>resuming</b>: starting the trainer, loading the last checkpoint…")
        self._timer.start()

    def _finished(self, state: str, message: str) -> None:
        """The run's end in the summary, in place of whatever it was doing last (no stale "preparing")."""
        self.summary.setText(f"{self._facts}<br><b>{state}</b>" + (f": {html.escape(message)}" if message else ""))
        self.progress.hide()
        self.redraw(PLOTS_PER_TICK)  # the other plots on the next ticks: all at once held the GUI 0.1 s

    def _add_line(self, text: str) -> QListWidgetItem:
        item = QListWidgetItem(text)
        item.setToolTip(text)
        self.warnings.addItem(item)
        return item

    def _warning(self, e: dict) -> None:
        self._add_line(f"⚠ {e.get('message', '')}")
        step = e.get("step") or (self.model.last_step.get("step") if self.model else None)
        if step is not None:
            self.curves.mark_warning(step)

    def _replanned(self, e: dict) -> None:
        """One line for all of a run's re-plans (one a epoch filled the panel): the epochs' path and the last why."""
        replans = self.model.replans if self.model is not None and self.model.replans else [e]
        epochs = [str(r.get("epochs")) for r in replans]
        path = " → ".join(epochs if len(epochs) <= 6 else [epochs[0], "…", *epochs[-4:]])
        times = f" ({len(replans)} times)" if len(replans) > 1 else ""
        text = f"↻ re-planned{times}: {replans[0].get('old_epochs')} → {path} epochs ({e.get('why', '')})"
        if self._replan_item is None or self.warnings.row(self._replan_item) < 0:
            self._replan_item = self._add_line(text)
        else:
            self._replan_item.setText(text)
            self._replan_item.setToolTip(text)

    def _restarted(self, e: dict) -> None:
        lost = e.get("lost_s")
        lost = f", {lost / 60:.1f} min lost waiting" if isinstance(lost, (int, float)) and lost >= 0 else ""
        self._add_line(f"↻ {e.get('message', 'started again')}{lost}")

    def _error(self, e: dict) -> None:
        self._add_line(f"✖ {e.get('message', '')}")
        self.warnings.item(self.warnings.count() - 1).setForeground(Qt.GlobalColor.red)

    def _system(self, e: dict) -> None:
        ranks = self.model.start_event.get("world_size") or 1 if self.model is not None else 1
        processes = e.get("processes", 1)
        text = f"CPU {e.get('cpu_percent', 0):.0f}%  ·  memory {e.get('rss_mb', 0):.0f} MB  ·  " + \
            (f"{ranks} ranks, {processes} processes" if ranks > 1 else
             f"{processes} process{'es' if processes != 1 else ''}")
        for g in e.get("gpus", []):
            util = f"{g['utilization']}%" if g.get("utilization") is not None else "n/a"
            text += f"<br>GPU {g['index']}: {util} busy, {g['memory_used_mb']:.0f}/{g['memory_total_mb']:.0f} MB"
        self.system.setText(text)

    def _log(self, text: str) -> None:
        self.log_view.appendPlainText(text.rstrip("\n"))

    # ---- drawing -----------------------------------------------------------------------------
    def _tick(self) -> None:
        self._ticks += 1
        if self.model is not None and self.model.catching_up and self._ticks % CATCHING_UP_EVERY:
            return
        self.redraw(PLOTS_PER_TICK)

    def redraw(self, plots: int | None = None) -> None:
        """Bring the visible views up to date (hidden tabs are redrawn from the buffers when shown)."""
        if self.model is None:
            return
        self.curves.redraw(plots)
        if self.tabs.currentIndex() == GRADIENTS_TAB:
            self.gradients.redraw()
        elif self.tabs.currentIndex() == RESULTS_TAB and plots is None:  # its files change at epochs, not steps
            self.results.redraw()
