"""Runs page: the runs directory as a table of experiments (a column for each hyper-parameter that differs, best
and final metrics, duration, tags and notes; filter and sort), compare overlays, a metric against a hyper-parameter
and parallel coordinates of a sweep; open, resume, continue, export, open folder, delete."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from PySide6.QtCore import (
    QAbstractTableModel,
    QFileSystemWatcher,
    QModelIndex,
    QSortFilterProxyModel,
    Qt,
    QTimer,
    QUrl,
    Signal,
)
from PySide6.QtGui import QColor, QDesktopServices
from PySide6.QtWidgets import (
    QFileDialog,
    QHBoxLayout,
    QHeaderView,
    QLabel,
    QLineEdit,
    QMessageBox,
    QPushButton,
    QSplitter,
    QTableView,
    QVBoxLayout,
    QWidget,
)

from app.dialogs.export_dialog import ExportDialog
from app.dialogs.run_dialogs import NotesDialog
from app.jobs.background import CliJob, run_in_thread, without_collection_pauses
from app.state.buffers import Series
from app.state.experiments import METRICS, RowCache, column_title, format_duration, varying_keys
from app.state.grad_views import elide_middle
from trainer.core.events import EventTail
from trainer.core.rundir import (
    FAILED_STATES,
    LIVE_STATES,
    RESUMABLE_STATES,
    STATUS_FILE,
    RunDir,
    is_run_folder,
    list_runs,
    state_text,
)
from trainer.core.summary import needs_building
from trainer.runs.commands import Summarize

COMPARE_POINTS = 1200  # of each compared run's loss curve: each bucket's lowest and highest (a one-step spike stays);
# two a pixel column of the plot at its widest on a laptop screen: 10 runs of 4,000 took 0.15 s to draw and paint


def load_curves(paths: list[str]) -> list[tuple[str, dict]]:
    """Each run's loss per step, thinned to COMPARE_POINTS, and validation accuracy per epoch, read through the run's
    summary (`trainer.core.summary`: a 10^5-step run's event file is over 100 MB, its million points too many to
    draw), then the events after it, as a stream."""
    out = []
    for path in paths:
        loss, epochs = Series(), []
        tail = EventTail(RunDir(path).events, summary=True)
        while not tail.at_end:
            for e in tail.read_new():
                if e["event"] == "step" and isinstance(e.get("step"), int) and isinstance(e.get("loss"), (int, float)):
                    loss.append(e["step"], e["loss"])
                elif e["event"] == "epoch" and isinstance(e.get("epoch"), int) and isinstance(e.get("val_acc"),
                                                                                              (int, float)):
                    epochs.append((e["epoch"], e["val_acc"]))
        shown = loss.display_index(COMPARE_POINTS)
        out.append((Path(path).name, {"steps": list(zip(loss.x[shown].tolist(), loss.y[shown].tolist())),
                                      "epochs": epochs}))
    return out


# what matters first (the accuracies were off-screen at 1024 px behind the hyper-parameters), then what was run
BASE_COLUMNS = ["run", "status", "test acc", "best val acc", "last val acc", "model", "dataset"]
METRIC_COLUMNS = ["trained", "duration", "started", "tags"]
FOLLOW_MS = 2000  # while the Runs page is shown, how often it looks for status changes
SETTLE_MS = 150  # after the file system says a folder changed: the table looks once the writes settle
SHOW_CHUNK = 100  # new rows put in the table per event-loop turn
RESIZE_ROWS = 60  # rows measured when fitting the columns to their contents (all of 500 took 0.6 s)
LONGEST_CELL = 40  # characters; longer values (parameter groups) are elided in the middle, whole on hover
# a run's state, coloured by what it means to the user: done, failed, ended early (resumable), going, waiting
STATUS_COLORS = {**dict.fromkeys(RESUMABLE_STATES, "#b8860b"), **dict.fromkeys(FAILED_STATES, "#c9302c"),
                 **dict.fromkeys(LIVE_STATES, "#1f77b4"), "completed": "#2b7a2b", "queued": "#777777"}


class ExperimentModel(QAbstractTableModel):
    """The runs as rows; columns: name and status, each hyper-parameter that differs between them, metrics."""

    SORT_ROLE = Qt.ItemDataRole.UserRole + 1

    def __init__(self):
        super().__init__()
        self.rows: list[dict] = []
        self.params: list[str] = []
        self.columns: list[str] = BASE_COLUMNS + METRIC_COLUMNS

    def set_rows(self, rows: list[dict], params: list[str] | None = None) -> None:
        """Show `rows` (from summarize(); a row unchanged since the last call is the same dict, `RowCache`);
        `params`, the differing keys, when already worked out off the GUI thread. With the same columns the table is
        updated row by row (a run changed, added or gone), never rebuilt: a reset re-sorted and re-laid out 1,000
        rows on the GUI thread at every status change."""
        params = varying_keys(rows) if params is None else params
        # model.name has its own column (BASE_COLUMNS' "model"): not a second one when it differs between runs
        columns = BASE_COLUMNS + [p for p in params if p != "model.name"] + METRIC_COLUMNS
        if columns != self.columns:
            self.beginResetModel()
            for row in rows:
                row.pop("_filter_text", None)  # worked out for the old columns
            self.rows, self.params, self.columns = list(rows), params, columns
            self.endResetModel()
            return
        self.params = params
        fresh = {row["path"]: row for row in rows}
        for i in reversed(range(len(self.rows))):
            if self.rows[i]["path"] not in fresh:
                self.beginRemoveRows(QModelIndex(), i, i)
                del self.rows[i]
                self.endRemoveRows()
        for i, row in enumerate(self.rows):
            if fresh[row["path"]] is not row:
                self.rows[i] = fresh[row["path"]]
                self.dataChanged.emit(self.index(i, 0), self.index(i, len(self.columns) - 1))
        known = {row["path"] for row in self.rows}
        added = [row for row in rows if row["path"] not in known]
        if added:
            self.beginInsertRows(QModelIndex(), len(self.rows), len(self.rows) + len(added) - 1)
            self.rows.extend(added)
            self.endInsertRows()

    def rowCount(self, parent=QModelIndex()) -> int:  # noqa: N802 - Qt's name
        return 0 if parent.isValid() else len(self.rows)

    def columnCount(self, parent=QModelIndex()) -> int:  # noqa: N802
        return 0 if parent.isValid() else len(self.columns)

    def value(self, row: dict, column: str):
        if column in self.params:
            return row["params"].get(column)
        if column == "tags":
            return ", ".join(row["tags"])
        return row.get(column)

    def data(self, index: QModelIndex, role=Qt.ItemDataRole.DisplayRole):
        if not index.isValid():
            return None
        row, column = self.rows[index.row()], self.columns[index.column()]
        value = self.value(row, column)
        if role == Qt.ItemDataRole.DisplayRole:
            if column in METRICS:
                return "—" if value is None else f"{100 * value:.1f}%"
            if column == "duration":
                return format_duration(value)
            if column == "status":
                return state_text(value, row.get("reason"), row.get("requeues"), row.get("requeue_lost_s"))
            text = "—" if value is None else (f"{value:.4g}" if isinstance(value, float) else str(value))
            return elide_middle(text, LONGEST_CELL)
        if role == self.SORT_ROLE:  # compared by Qt itself (no Python per comparison): numbers, else text
            if column == "started":
                return row["started_ts"]
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                return float(value)
            return -1e300 if value is None and column in (*METRICS, "duration") else str(value)
        if role == Qt.ItemDataRole.ForegroundRole and column == "status":
            return QColor(STATUS_COLORS.get(value, "#222"))
        if role == Qt.ItemDataRole.ToolTipRole:
            whole = state_text(value, row.get("reason"), row.get("requeues"), row.get("requeue_lost_s")) \
                if column == "status" else str(value) if column in self.params else ""  # whole where a cell is cut
            return "\n".join(filter(None, [whole, row["notes"], row["path"]]))
        return None

    def headerData(self, section: int, orientation, role=Qt.ItemDataRole.DisplayRole):  # noqa: N802
        if orientation != Qt.Orientation.Horizontal or section >= len(self.columns):
            return None
        column = self.columns[section]
        if role == Qt.ItemDataRole.DisplayRole:
            return column_title(column) if column in self.params else column
        if role == Qt.ItemDataRole.ToolTipRole:
            return column
        return None


SUMMARIES_AT_ONCE = max(1, min(4, os.cpu_count() or 1))  # Compare's missing summaries, built side by side


class RunFilter(QSortFilterProxyModel):
    """Rows whose text in any column contains every word typed (lr=0.01 matches the lr column's 0.01)."""

    def __init__(self):
        super().__init__()
        self.words: list[str] = []
        self.setSortRole(ExperimentModel.SORT_ROLE)

    def set_text(self, text: str) -> None:
        self.beginFilterChange()
        self.words = text.lower().split()
        self.endFilterChange(QSortFilterProxyModel.Direction.Rows)

    def filterAcceptsRow(self, source_row: int, parent) -> bool:  # noqa: N802
        if not self.words:
            return True
        m: ExperimentModel = self.sourceModel()
        row = m.rows[source_row]
        if "_filter_text" not in row:  # worked out once per row and table, on the first filter typed
            row["_filter_text"] = [f"{m.headerData(c, Qt.Orientation.Horizontal) or ''}="
                                   f"{m.data(m.index(source_row, c)) or ''}".lower() for c in range(m.columnCount())]
            row["_filter_text"].append(row["notes"].lower())
        return all(any(w in cell for cell in row["_filter_text"]) for w in self.words)


class RunsPage(QWidget):
    openRequested = Signal(str)
    resumeRequested = Signal(str)
    extendRequested = Signal(str)
    runsDirChosen = Signal(str)  # the user chose another runs folder (the window moves to it and remembers it)

    def __init__(self, parent: QWidget | None = None):
        super().__init__(parent)
        self.runs_dir: Path | None = None
        self.folder = QLineEdit()  # the whole path, scrollable and selectable; the window decides what it is
        self.folder.setObjectName("runsFolder")
        self.folder.setReadOnly(True)
        change = QPushButton("Change…")
        change.setObjectName("runs:Change folder")
        change.setToolTip("Write and list runs in another folder (remembered for the next start; --runs-dir wins)")
        change.clicked.connect(self._choose_folder)
        self._row_cache = RowCache()
        self._reading = self._read_again = False  # a read_table under way; another asked for meanwhile
        self._showing_rest = False  # a table's rows still going in, a chunk a turn
        self._showing = 0  # the tables shown so far (a newer one stops the showing of an older one in pieces)
        self._signature: tuple = ()
        self._checking = False
        self._follow = QTimer(self)
        self._follow.setInterval(FOLLOW_MS)
        self._follow.timeout.connect(self._check_changes)
        # shown or not, a run folder that appears (from the window, the command line, the queue) is in the table as
        # soon as it is a run: the runs folder is watched, and each new folder until it holds its config
        self._watch = QFileSystemWatcher(self)
        self._soon = QTimer(self)
        self._soon.setSingleShot(True)
        self._soon.setInterval(SETTLE_MS)
        self._soon.timeout.connect(self._check_changes)
        self._watch.directoryChanged.connect(lambda _: self._soon.start())
        self._build_table()
        buttons = self._build_buttons()

        self._views = None  # RunViews, built when the page is first shown (pyqtgraph's plots: not at start-up)
        self._views_holder = QWidget()
        QVBoxLayout(self._views_holder).setContentsMargins(0, 0, 0, 0)

        top = QWidget()
        tl = QVBoxLayout(top)
        tl.setContentsMargins(0, 0, 0, 0)
        where = QHBoxLayout()
        where.addWidget(QLabel("Runs folder:"))
        where.addWidget(self.folder, 1)
        where.addWidget(change)
        tl.addLayout(where)
        tl.addWidget(self.filter)
        tl.addLayout(buttons)
        tl.addWidget(self.table)
        split = QSplitter(Qt.Orientation.Vertical)
        split.addWidget(top)
        split.addWidget(self._views_holder)
        split.setSizes([360, 340])
        layout = QVBoxLayout(self)
        layout.addWidget(split)


    def _build_table(self) -> None:
        """The runs table (sortable, filtered by the words typed) and its filter field."""
        self.model = ExperimentModel()
        self.proxy = RunFilter()
        self.proxy.setSourceModel(self.model)
        self.table = QTableView()
        self.table.setObjectName("runsTable")
        self.table.setModel(self.proxy)
        self.table.setSortingEnabled(True)
        self.table.sortByColumn(BASE_COLUMNS.index("best val acc"), Qt.SortOrder.DescendingOrder)
        header = self.table.horizontalHeader()
        header.setSectionResizeMode(QHeaderView.ResizeMode.Interactive)
        header.setStretchLastSection(True)
        header.setResizeContentsPrecision(RESIZE_ROWS)
        self.table.setSelectionBehavior(QTableView.SelectionBehavior.SelectRows)
        self.table.setEditTriggers(QTableView.EditTrigger.NoEditTriggers)
        self.table.verticalHeader().hide()
        self.table.doubleClicked.connect(lambda _: self._open())
        self.filter = QLineEdit()
        self.filter.setObjectName("runsFilter")
        self.filter.setPlaceholderText("filter: words or column=value (resnet18  lr=0.01  completed  baseline)")
        self.filter.textChanged.connect(self.proxy.set_text)

    def _build_buttons(self) -> QHBoxLayout:
        """The row of actions on the selected runs."""
        buttons = QHBoxLayout()  # under the filter, not beside it: the row fits a laptop screen
        for text, slot in (("Refresh", self.refresh), ("Open", self._open), ("Compare", self._compare),
                           ("Resume", self._resume), ("Continue…", self._extend), ("Notes…", self._notes),
                           ("Export…", self._export), ("Open folder", self._open_folder),
                           ("MLflow", self._open_mlflow), ("Delete", self._delete)):
            b = QPushButton(text)
            b.setObjectName(f"runs:{text}")
            b.clicked.connect(slot)
            buttons.addWidget(b)
            if slot == self._open_mlflow:
                self.mlflow_button = b
        self.mlflow_button.setEnabled(False)  # a run that logs to an MLflow tracking server (monitor.mlflow)
        self._mlflow_page = ""  # the selected run's page there
        self.mlflow_button.setToolTip("the selected run's page in the MLflow UI of the tracking server it logs to "
                                      "(monitor.mlflow on the Optimizer page)")
        self.table.selectionModel().selectionChanged.connect(self._selection_changed)
        return buttons

    @property
    def views(self):
        """The compare, metric-against-hyper-parameter and parallel-coordinates views, built at the first need."""
        if self._views is None:
            from app.pages.run_views import RunViews

            self._views = RunViews(self.model, self.shown_rows)
            self._views_holder.layout().addWidget(self._views)
            self._views.refresh()
        return self._views

    @property
    def rows(self) -> list[dict]:
        return self.model.rows

    def set_runs_dir(self, runs_dir: Path) -> None:
        self.runs_dir = Path(runs_dir)
        if self._watch.directories():
            self._watch.removePaths(self._watch.directories())
        self._watch_folders(())
        self.folder.setText(str(self.runs_dir))
        self.folder.setToolTip(str(self.runs_dir))
        self.folder.setCursorPosition(0)
        self.refresh()

    def _choose_folder(self) -> None:
        chosen = QFileDialog.getExistingDirectory(self, "Runs folder", str(self.runs_dir or Path.home()))
        if chosen:
            self.runsDirChosen.emit(chosen)

    def showEvent(self, event) -> None:  # noqa: N802 - Qt's name
        self.views  # noqa: B018 - built on the first show
        self._follow.start()  # while shown, the table follows status changes by itself (a queued run starting)
        super().showEvent(event)

    def hideEvent(self, event) -> None:  # noqa: N802
        self._follow.stop()
        super().hideEvent(event)

    def _check_changes(self) -> None:
        """Refresh when any run's status.json changed (a cheap stat of each, off the GUI thread); not while a read or
        the showing of one is under way (its thread held the interpreter lock against the table's painting)."""
        if self.runs_dir is None:
            return
        if self._checking or self._reading or self._showing_rest:
            if self._watch.directories():
                self._soon.start()  # a change the file system reported is looked at once this is done
            return
        self._checking = True
        runs_dir = self.runs_dir

        def changed(signature) -> None:
            self._checking = False
            if runs_dir == self.runs_dir:
                self._watch_folders(signature)
            if signature != self._signature:
                self._signature = signature
                self.refresh()

        def failed(_error) -> None:
            self._checking = False

        run_in_thread(lambda: status_signature(runs_dir), changed, failed, owner=self)

    def _watch_folders(self, signature: tuple) -> None:
        """Watch the runs folder (and its mirrors' host folders) for new folders, and each folder that is not a run
        yet (made, its config not yet written) for its files; a runs folder not made yet, through the nearest folder
        above it that is (nothing is made here before a run is)."""
        there = next((p for p in (self.runs_dir, *self.runs_dir.parents) if p.is_dir()), None)
        wanted = {str(there)} if there is not None else set()
        wanted |= {p for p, _, is_run in signature if not is_run}
        remote = self.runs_dir / "remote"
        if remote.is_dir():
            wanted |= {str(remote), *(str(p) for p in remote.iterdir() if p.is_dir())}
        watched = set(self._watch.directories())
        if watched - wanted:
            self._watch.removePaths(sorted(watched - wanted))
        added = [path for path in sorted(wanted - watched) if os.path.isdir(path) and self._watch.addPath(path)]
        if added:  # what changed in them before the watch began is seen by a look now
            self._soon.start()

    def refresh(self) -> None:
        """Read the table again on the thread pool; asked while a read is under way, once more after it (two reads
        at once did the work twice, and held the interpreter lock against the GUI thread's painting)."""
        if self.runs_dir is None:
            return
        if self._reading:
            self._read_again = True
            return
        self._reading, self._read_again = True, False
        runs_dir = self.runs_dir

        def done(read) -> None:
            self._reading = False
            signature, table = read
            if runs_dir == self.runs_dir:
                self._signature = signature  # what the follow timer compares with: no second read of the same
                self._watch_folders(signature)
                self._show(*table)
            if self._read_again:
                self.refresh()

        def failed(_error) -> None:
            self._reading = False

        run_in_thread(lambda: (status_signature(runs_dir), read_table(runs_dir, self._row_cache)), done, failed,
                      owner=self)

    def _show(self, rows: list[dict], params: list[str] | None = None) -> None:
        """The table as read (`read_table`); many new rows at once go in SHOW_CHUNK an event-loop turn (1,000 at
        once held the GUI thread for 0.2 s, sorting them)."""
        params = varying_keys(rows) if params is None else params
        self._showing += 1
        self._show_part(self._showing, rows, params, min(len(rows), len(self.model.rows) + SHOW_CHUNK))

    def _show_part(self, serial: int, rows: list[dict], params: list[str], count: int) -> None:
        if serial != self._showing:  # a newer table arrived: that one is shown
            return
        shown = rows[:count]
        if count < len(rows):  # the runs not shown yet are kept where they are (not removed, then added again)
            at, listed = {row["path"] for row in shown}, {row["path"] for row in rows}
            shown += [row for row in self.model.rows if row["path"] not in at and row["path"] in listed]
        columns = list(self.model.columns)
        self.model.set_rows(shown, params)
        if self.model.columns != columns:  # fitting columns to their contents is the slow part: only when they change
            self.table.resizeColumnsToContents()
        self._showing_rest = count < len(rows)
        if count < len(rows):
            QTimer.singleShot(1, lambda: self._show_part(serial, rows, params, count + SHOW_CHUNK))
        elif self._views is not None:
            self._views.refresh()

    def shown_rows(self) -> list[dict]:
        """The runs the filter lets through, in the table's order."""
        return [self.model.rows[self.proxy.mapToSource(self.proxy.index(i, 0)).row()]
                for i in range(self.proxy.rowCount())]

    def selected(self) -> list[str]:
        rows = sorted({self.proxy.mapToSource(i).row() for i in self.table.selectionModel().selectedRows()})
        return [self.model.rows[r]["path"] for r in rows if r < len(self.model.rows)]

    def _open(self) -> None:
        for path in self.selected()[:1]:
            self.openRequested.emit(path)

    def _resume(self) -> None:
        for path in self.selected()[:1]:
            self.resumeRequested.emit(path)

    def _extend(self) -> None:
        for path in self.selected()[:1]:
            self.extendRequested.emit(path)

    def _notes(self) -> None:
        for path in self.selected()[:1]:
            dialog = NotesDialog(RunDir(path), self)
            dialog.accepted.connect(self.refresh)
            dialog.open()

    def _compare(self) -> None:
        """The selected runs' curves, read through their summaries in a thread (bounded: COMPARE_POINTS a run); a
        long finished run without one has it built first by `main.py summarize`, a process of its own, as many side
        by side as the machine has cores (SUMMARIES_AT_ONCE), so no thread of the GUI's process parses a whole events
        file (issue #72: 10 such runs held the interpreter lock for 112 s)."""
        paths = self.selected()
        if not paths:
            return
        waiting = [p for p in paths if needs_building(RunDir(p).events) and not RunDir(p).is_live()]
        building: list[CliJob] = []

        def compare() -> None:
            run_in_thread(lambda: load_curves(paths), self.views.show_compare, owner=self)

        def build_next() -> None:
            job = CliJob(Summarize(run_dir=str(waiting.pop(0))), self)
            building.append(job)
            job.done.connect(lambda _answer, job=job: built(job))
            job.failed.connect(lambda _why, job=job: built(job))  # read whole then, in the thread: slow, not wrong

        def built(job: CliJob) -> None:
            building.remove(job)
            if waiting:
                build_next()
            elif not building:
                compare()

        if not waiting:
            compare()
            return
        self.views.compare_note(f"building the summaries of {len(waiting)} long run(s) first…")
        for _ in range(min(SUMMARIES_AT_ONCE, len(waiting))):
            build_next()

    def _export(self) -> None:
        for path in self.selected()[:1]:
            ExportDialog(path, self).open()

    def _selection_changed(self) -> None:
        paths = self.selected()[:1]
        self._mlflow_page = RunDir(paths[0]).mlflow_page() if paths else ""  # a small JSON file beside the run's
        self.mlflow_button.setEnabled(bool(self._mlflow_page))

    def _open_mlflow(self) -> None:
        if self._mlflow_page:
            QDesktopServices.openUrl(QUrl(self._mlflow_page))

    def _open_folder(self) -> None:
        for path in self.selected()[:1]:
            QDesktopServices.openUrl(QUrl.fromLocalFile(path))

    def _delete(self) -> None:
        paths = self.selected()
        running = [r["run"] for r in self.model.rows if r["path"] in paths and r["status"] in LIVE_STATES]
        if running:
            QMessageBox.warning(self, "Delete runs", f"Stop {', '.join(running)} before deleting it.")
            return
        if not paths or QMessageBox.question(
                self, "Delete runs", f"Delete {len(paths)} run(s) and their checkpoints from disk?") \
                != QMessageBox.StandardButton.Yes:
            return
        run_in_thread(lambda: [shutil.rmtree(p, ignore_errors=True) for p in paths], lambda _: self.refresh(), owner=self)


def status_signature(runs_dir: Path) -> tuple:
    """(folder, status.json mtime or None, whether it is a run yet) of every folder in the runs folder (and the
    mirrors'): what changes when a run appears, changes state or progresses."""
    out = []
    try:
        entries = sorted(os.scandir(runs_dir), key=lambda e: e.name)
        remote = os.path.join(runs_dir, "remote")
        if os.path.isdir(remote):  # the mirrors of runs on hosts (trainer/remote/mirror.py)
            entries += sorted((e for host in os.scandir(remote) if host.is_dir() for e in os.scandir(host.path)),
                              key=lambda e: e.path)
    except OSError:
        return ()
    for entry in entries:
        if entry.name.startswith(".") or entry.path == remote or not entry.is_dir():
            continue
        try:
            status = os.stat(os.path.join(entry.path, STATUS_FILE)).st_mtime_ns
        except OSError:
            status = None
        out.append((entry.path, status, is_run_folder(Path(entry.path))))
    return tuple(out)


def read_table(runs_dir: Path, cache: RowCache) -> tuple[list[dict], list[str]]:
    """Every run's row and the hyper-parameters that differ (on the thread pool: the GUI thread only shows them);
    only the rows of runs that changed since `cache` last saw them are read again."""
    with without_collection_pauses():  # 1,000 configs parsed: no full collections over them while the GUI waits
        rows = cache.rows(list_runs(runs_dir, remote=True))
        return rows, varying_keys(rows)
