"""Queue page: the runs waiting in the runs directory's queue and those its scheduler has going; reorder, hold,
remove, retry; start the scheduler when none is running (it is a separate process and outlives the app).

The queue's rules (what may be held, moved, retried; what placement allows) are trainer/runs/queue.py's; this page calls
them off the GUI thread and shows what the files say.
"""

from __future__ import annotations

import datetime as dt
from pathlib import Path

from PySide6.QtCore import QTimer, Signal
from PySide6.QtWidgets import (
    QHBoxLayout,
    QHeaderView,
    QLabel,
    QPushButton,
    QTableWidget,
    QTableWidgetItem,
    QVBoxLayout,
    QWidget,
)

import trainer.runs.queue as queue
from app.jobs.background import run_in_thread, start_detached
from trainer.core.rundir import ENDINGS, UNFINISHED_STATES, RunDir, list_runs
from trainer.runs.commands import Queue

COLUMNS = ["#", "run", "state", "progress", "best val acc", "model", "sweep", "values", "GPUs", "added"]
REFRESH_MS = 1500
RECENT = 30  # finished queue runs shown under the waiting ones


def queue_rows(runs_dir: Path) -> tuple[list[dict], list[int]]:
    """Runs the queue knows (going, waiting in order, then the most recently ended) and the live schedulers."""
    going, ended = [], []
    waiting = queue.queued(runs_dir)
    waiting_paths = {r.path for r in waiting}
    for r in list_runs(runs_dir):
        status = r.read_status()
        if r.path in waiting_paths or "queue" not in status:
            continue
        (going if r.is_live() else ended).append((r, status))
    rows = [_row(r, s, "") for r, s in going]
    rows += [_row(r, r.read_status(), str(i)) for i, r in enumerate(waiting, start=1)]
    ended.sort(key=lambda rs: -(rs[1].get("ended") or rs[1].get("updated") or 0))
    rows += [_row(r, s, "") for r, s in ended[:RECENT]]
    return rows, queue.live_schedulers(runs_dir)


def _row(run: RunDir, status: dict, position: str) -> dict:
    q = status.get("queue") or {}
    state = status.get("state", "?")
    if state == "queued" and q.get("held"):
        state = "held"
    elif state == "queued" and q.get("scheduler"):
        state = "starting"
    values = ", ".join(f"{k.split('.')[-1]}={v}" for k, v in (q.get("values") or {}).items())
    added = dt.datetime.fromtimestamp(q.get("added") or run.path.stat().st_mtime).strftime("%m-%d %H:%M")
    epoch, epochs, best = status.get("epoch"), status.get("epochs"), status.get("best_acc")
    progress = f"epoch {epoch}/{epochs}" if epoch is not None and epochs else ""
    if status.get("reason") and state not in ("held", *UNFINISHED_STATES):
        progress = f"{progress} ({ENDINGS.get(status['reason'], status['reason'])})".strip()
    return {"path": str(run.path), "#": position, "run": run.name, "state": state, "progress": progress,
            "best val acc": f"{100 * best:.1f}%" if isinstance(best, (int, float)) and best >= 0 else "",
            "model": str(status.get("model", "?")).split("/")[-1], "sweep": q.get("sweep") or "", "values": values,
            "GPUs": ",".join(map(str, q.get("gpus") or [])), "added": added,
            "message": status.get("message", "")}


class QueuePage(QWidget):
    changed = Signal()
    openRequested = Signal(str)  # a run's directory, double-clicked: watch it (a running one live)

    def __init__(self, parent: QWidget | None = None):
        super().__init__(parent)
        self.runs_dir: Path | None = None
        self.rows: list[dict] = []
        self.schedulers: list[int] = []
        self._busy = False
        self.scheduler_label = QLabel("")
        self.scheduler_label.setObjectName("schedulerState")
        self.start_scheduler = QPushButton("Start scheduler")
        self.start_scheduler.setObjectName("startScheduler")
        self.start_scheduler.setToolTip("works the queue in its own process: it keeps going when this window closes")
        self.start_scheduler.clicked.connect(self.ensure_scheduler)
        self.table = QTableWidget(0, len(COLUMNS))
        self.table.setObjectName("queueTable")
        self.table.setHorizontalHeaderLabels(COLUMNS)
        header = self.table.horizontalHeader()
        header.setSectionResizeMode(QHeaderView.ResizeMode.ResizeToContents)
        header.setSectionResizeMode(COLUMNS.index("values"), QHeaderView.ResizeMode.Stretch)
        self.table.setSelectionBehavior(QTableWidget.SelectionBehavior.SelectRows)
        self.table.setSelectionMode(QTableWidget.SelectionMode.SingleSelection)
        self.table.setEditTriggers(QTableWidget.EditTrigger.NoEditTriggers)
        self.table.verticalHeader().hide()
        self.table.itemSelectionChanged.connect(self._update_buttons)
        self.table.cellDoubleClicked.connect(lambda row, _: row < len(self.rows)
                                             and self.openRequested.emit(self.rows[row]["path"]))
        self.table.setToolTip("double-click a run to watch it (a running one live)")
        self.buttons: dict[str, QPushButton] = {}
        row = QHBoxLayout()
        for name, slot in (("Up", lambda: self._move(-1)), ("Down", lambda: self._move(1)),
                           ("Hold", lambda: self._act(lambda d, r: queue.hold(d, r, True))),
                           ("Release", lambda: self._act(lambda d, r: queue.hold(d, r, False))),
                           ("Remove", lambda: self._act(queue.remove)), ("Retry", lambda: self._act(queue.retry))):
            b = QPushButton(name)
            b.setObjectName(f"queue:{name}")
            b.clicked.connect(slot)
            row.addWidget(b)
            self.buttons[name] = b
        row.addStretch(1)
        row.addWidget(self.scheduler_label)
        row.addWidget(self.start_scheduler)
        self.message = QLabel("")
        self.message.setObjectName("queueMessage")
        self.message.setWordWrap(True)
        layout = QVBoxLayout(self)
        intro = QLabel("<b>Queue</b> — runs wait here and start one after another (one per GPU set on a "
                       "GPU machine); a failed run does not stop the queue. Add runs with <i>Add to queue"
                       "</i> or a sweep.")
        intro.setWordWrap(True)
        layout.addWidget(intro)
        layout.addLayout(row)
        layout.addWidget(self.table, 1)
        layout.addWidget(self.message)
        self._timer = QTimer(self)
        self._timer.setInterval(REFRESH_MS)
        self._timer.timeout.connect(self.refresh)
        self._update_buttons()

    def set_runs_dir(self, runs_dir: Path) -> None:
        self.runs_dir = Path(runs_dir)
        self.refresh()

    def showEvent(self, event) -> None:  # noqa: N802 - Qt's name
        self._timer.start()
        self.refresh()
        super().showEvent(event)

    def hideEvent(self, event) -> None:  # noqa: N802
        self._timer.stop()
        super().hideEvent(event)

    def refresh(self) -> None:
        if self.runs_dir is None or self._busy:
            return
        self._busy = True
        runs_dir = self.runs_dir
        run_in_thread(lambda: queue_rows(runs_dir), self._show, self._failed, owner=self)

    def _failed(self, error: str) -> None:
        self._busy = False
        self.message.setText(f"<span style='color:#c9302c'>cannot read the queue: {error}</span>")

    def _show(self, payload) -> None:
        self._busy = False
        rows, schedulers = payload
        selected = self.selected_row()
        self.rows, self.schedulers = rows, schedulers
        self.table.setRowCount(len(rows))
        for i, r in enumerate(rows):
            for c, key in enumerate(COLUMNS):
                item = QTableWidgetItem(r[key])
                if key == "state" and r["message"]:
                    item.setToolTip(r["message"])
                self.table.setItem(i, c, item)
            if selected and r["path"] == selected["path"]:
                self.table.selectRow(i)
        self.scheduler_label.setText(f"scheduler running (pid {', '.join(map(str, schedulers))})" if schedulers
                                     else "no scheduler running")
        self.start_scheduler.setEnabled(not schedulers)
        self._update_buttons()
        self.changed.emit()

    def selected_row(self) -> dict | None:
        rows = self.table.selectionModel().selectedRows() if self.table.selectionModel() else []
        return self.rows[rows[0].row()] if rows and rows[0].row() < len(self.rows) else None

    def _update_buttons(self) -> None:
        r = self.selected_row()
        state = r["state"] if r else None
        self.buttons["Up"].setEnabled(state in ("queued", "held"))
        self.buttons["Down"].setEnabled(state in ("queued", "held"))
        self.buttons["Hold"].setEnabled(state == "queued")
        self.buttons["Release"].setEnabled(state == "held")
        self.buttons["Remove"].setEnabled(state in ("queued", "held"))
        self.buttons["Retry"].setEnabled(state in queue.RETRYABLE_STATES)

    def _act(self, action) -> None:
        r = self.selected_row()
        if r is None or self.runs_dir is None:
            return
        runs_dir, run = self.runs_dir, RunDir(r["path"])
        run_in_thread(lambda: action(runs_dir, run), lambda _: self.refresh(),
                      lambda error: self.message.setText(f"<span style='color:#c9302c'>{error}</span>"), owner=self)

    def _move(self, delta: int) -> None:
        r = self.selected_row()
        if r is None or not r["#"]:
            return
        to = max(0, int(r["#"]) - 1 + delta)
        self._act(lambda d, run: queue.move(d, run, to))

    def ensure_scheduler(self) -> None:
        """Start `main.py queue run` detached (it outlives the app) unless one is already working this queue."""
        if self.runs_dir is None or queue.live_schedulers(self.runs_dir):
            return
        log = self.runs_dir / queue.SCHEDULERS / queue.SCHEDULER_LOG
        log.parent.mkdir(parents=True, exist_ok=True)
        ok = start_detached(Queue(action="run", runs_dir=str(self.runs_dir)), log)
        self.message.setText(f"started the scheduler (its log: {log})" if ok else
                             "<span style='color:#c9302c'>could not start the scheduler</span>")
        QTimer.singleShot(500, self.refresh)
