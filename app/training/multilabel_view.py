"""The Results tab of a multi-label run (issue #36): mAP, a table of every label (AP, F1 at its threshold, precision,
recall, support), the chosen label's precision-recall curve and, in the gallery, its false positives and false
negatives; the selected image's labels and every probability, and one click to add or remove the label in the
dataset manifest (the labels file itself is never rewritten). **Label issues**, **Outliers** and **Copies** (issue #49)
fill the gallery with `main.py audit`'s lists (images that probably miss a label or carry a wrong one; far from every
other or undecided at a label's threshold; copies and leaks), with one key per decision; the **Map** tab draws the
run's images as the audit places them. Torch-free: the
trainer wrote the files (trainer.deploy.multilabel, trainer.deploy.audit_multilabel); app/state/eval_results.py
reads them."""

from __future__ import annotations

import html
import os
from collections import Counter

import pyqtgraph as pg
from PySide6.QtCore import Qt, Signal
from PySide6.QtGui import QImage, QKeySequence, QPixmap, QShortcut
from PySide6.QtWidgets import (
    QAbstractItemView,
    QComboBox,
    QHBoxLayout,
    QHeaderView,
    QLabel,
    QListWidgetItem,
    QPushButton,
    QSplitter,
    QTableWidget,
    QTableWidgetItem,
    QTabWidget,
    QVBoxLayout,
    QWidget,
)

from app.jobs.background import CliJob, run_in_thread
from app.state.audit_gallery import Listed, multilabel_gallery
from app.state.eval_results import LabelledPrediction, MultiLabelEvaluation
from app.widgets.data_map_view import DataMap
from app.widgets.grad_cam import GradCam
from app.widgets.plots import NumericItem, set_title
from app.widgets.thumbnails import (
    load_pair_thumbnails,
    load_thumbnails,
    scaled_pixmap,
    set_gallery_icons,
    thumbnail_gallery,
)
from trainer.runs.commands import Audit

THUMB = 96
PREVIEW = 160
ISSUE_KEYS = "R relabel as suggested · E exclude · K keep"
AUDIT_LISTS = (  # (the report's list, the button, its tooltip)
    ("suspects", "Label issues", "main.py audit: the images that probably miss a label or carry one they should not (a "
     "cross-fitted probe on the run's embeddings and cleanlab's multi-label confident learning), in a separate "
     "process; then " + ISSUE_KEYS),
    ("outliers", "Outliers", "the run's images farthest from every other (their embeddings' distance to their nearest "
     "ones), then those with a label whose probability sits next to its threshold: " + ISSUE_KEYS),
    ("copies", "Copies", "images that are copies of another (byte-identical, resized or recompressed), a leak when the "
     "other is a validation or test image: each beside the image it copies; E excludes the copy from training, R "
     "gives it the labels of the image it copies, K keeps it"))
# (header, metrics.json key, tooltip)
COLUMNS = (("label", "", "the label, as the labels file names it"),
           ("AP", "ap", "average precision: the area under the label's precision-recall curve"),
           ("F1", "f1", "F1 at the label's threshold"),
           ("prec.", "precision", "precision at the threshold: of the images given the label, the share that carry it"),
           ("recall", "recall", "recall at the threshold: of the images that carry the label, the share given it"),
           ("thr.", "threshold", "the threshold, chosen on the validation split for the label's best F1"),
           ("images", "support", "images that carry the label"))


def percent(value: float | None) -> str:
    return "—" if value is None else f"{100 * value:.1f}%"


def errors_with(positives: list[LabelledPrediction], negatives: list[LabelledPrediction], label: str,
                top: int = 3) -> str:
    """The labels a label's errors come with: the ones its false positives carry (what it is taken for), and the
    ones the network gives its false negatives instead."""
    def most(counter: Counter) -> str:
        return ", ".join(f"{html.escape(n)} ({k})" for n, k in counter.most_common(top)) or "none"

    carried = Counter(n for p in positives for n in p.true)
    instead = Counter(n for p in negatives for n in p.predicted if n not in p.true and n != label)
    return (f"<br><span style='color:#555'>Its false positives carry most often: {most(carried)}; its false "
            f"negatives are given instead: {most(instead)}</span>")


class MultiLabelView(QWidget):
    marksRequested = Signal(list, object)  # image paths, the image's new labels (";"-separated; "" none)
    poolRequested = Signal()  # label a pool of new images (the Results tab knows the run)

    def __init__(self, parent: QWidget | None = None):
        super().__init__(parent)
        self.evaluation: MultiLabelEvaluation | None = None
        self.label = ""  # the label whose errors the gallery shows
        self.shown: list[tuple[LabelledPrediction, str]] = []  # (image, "FP" or "FN")
        self.selected: tuple[LabelledPrediction, str] | None = None
        self.issues: list[Listed] | None = None  # the audit's list while the gallery shows it, else None
        self._audit_job: CliJob | None = None
        self._audit: tuple[str, dict] | None = None  # (run path, `main.py audit --json`'s report) last read
        self.marked: dict[str, str | None] = {}  # real path -> the manifest's labels for it (None: excluded)
        self._thumb_serial = 0
        self.cam: dict | None = None  # the last Grad-CAM shown: main.py grad-cam's answer
        self.set_choice = QComboBox()  # the Results tab's evaluations (it shares its list with this)
        self.set_choice.setObjectName("multilabelSet")
        self.headline = QLabel("")
        self.headline.setObjectName("multilabelHeadline")
        self.headline.setWordWrap(True)
        self._build_table_and_curve()
        self.gallery_title = QLabel("")
        self.gallery_title.setWordWrap(True)
        self.gallery = thumbnail_gallery("labelErrors", THUMB, caption_lines=1, margin=16)
        self.gallery.currentRowChanged.connect(self._select)
        buttons = []
        for kind, text, tip in AUDIT_LISTS:  # one button per list of the audit
            button = QPushButton(text)
            button.setObjectName(f"multilabel:{kind}")
            button.setToolTip(tip)
            button.clicked.connect(lambda _=False, kind=kind: self.find_label_issues(kind))
            buttons.append(button)
        self.issues_button, self.outliers_button, self.copies_button = buttons
        self.data_map = DataMap(relabel=False)  # Show in gallery, then R: each image its own suggested set
        self.data_map.setObjectName("multilabelMap")
        self.data_map.showRequested.connect(self._show_on_map)
        self.data_map.marksRequested.connect(self.marksRequested)
        self.pool_button = QPushButton("Label a pool…")
        self.pool_button.setObjectName("multilabelPool")
        self.pool_button.setToolTip("label a folder of new images one at a time, the ones whose labels this run's "
                                    "network is least decided on first (main.py label); each label set goes into the "
                                    "manifest")
        self.pool_button.clicked.connect(self.poolRequested)
        for key, action in (("R", lambda: self._decide(True)), ("E", lambda: self._decide(False)),
                            ("K", self._next)):  # one key per decision while going down the audit's list
            QShortcut(QKeySequence(key), self.gallery, action, context=Qt.ShortcutContext.WidgetShortcut)
        self._build_detail()
        self.run_path = ""  # the run whose network Grad-CAM asks
        self.gradcam = GradCam(self)
        self.gradcam.done.connect(self._cam_done)
        self.gradcam.failed.connect(self._cam_failed)
        self._layout()

    def _build_table_and_curve(self) -> None:
        """The per-label table (choosing a row shows its errors) and the precision-recall plot."""
        self.table = QTableWidget(0, len(COLUMNS))
        self.table.setObjectName("perLabel")
        self.table.setHorizontalHeaderLabels([header for header, _, _ in COLUMNS])
        for c, (_, _, tip) in enumerate(COLUMNS):
            self.table.horizontalHeaderItem(c).setToolTip(tip)
        self.table.horizontalHeader().setSectionResizeMode(QHeaderView.ResizeMode.ResizeToContents)
        self.table.verticalHeader().setVisible(False)
        self.table.setSelectionBehavior(QAbstractItemView.SelectionBehavior.SelectRows)
        self.table.setSelectionMode(QAbstractItemView.SelectionMode.SingleSelection)
        self.table.setEditTriggers(QAbstractItemView.EditTrigger.NoEditTriggers)
        self.table.itemSelectionChanged.connect(self._label_chosen)
        self.curve = pg.PlotWidget()
        self.curve.setObjectName("precisionRecall")
        self.curve.setBackground("w")
        self.curve.setLabel("bottom", "recall")
        self.curve.setLabel("left", "precision")
        self.curve.setRange(xRange=(0, 1), yRange=(0, 1))

    def _build_detail(self) -> None:
        """The chosen image: its preview, what the network and the labels say, and its two actions."""
        self.preview = QLabel()
        self.preview.setFixedSize(PREVIEW, PREVIEW)
        self.preview.setAlignment(Qt.AlignmentFlag.AlignCenter)
        self.details = QLabel("")
        self.details.setWordWrap(True)
        self.details.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        self.fix_button = QPushButton("")
        self.fix_button.setObjectName("fixLabel")
        self.fix_button.setToolTip("an entry in the dataset manifest (data.exclude) giving the image its labels; the "
                                   "labels file and the image stay as they are")
        self.fix_button.clicked.connect(self.fix)
        self.fix_button.setEnabled(False)
        self.cam_button = QPushButton("Grad-CAM")
        self.cam_button.setObjectName("labelGradCam")
        self.cam_button.setToolTip("where the network finds the chosen label in this image (main.py grad-cam --class)")
        self.cam_button.clicked.connect(self.grad_cam)
        self.cam_button.setEnabled(False)

    def _layout(self) -> None:
        left = QWidget()
        ll = QVBoxLayout(left)
        ll.setContentsMargins(0, 0, 0, 0)
        top = QHBoxLayout()
        top.addWidget(QLabel("Set"))
        top.addWidget(self.set_choice, 1)
        ll.addLayout(top)
        ll.addWidget(self.headline)
        ll.addWidget(self.table, 3)
        ll.addWidget(self.curve, 2)
        detail = QWidget()
        dl = QHBoxLayout(detail)
        dl.setContentsMargins(0, 0, 0, 0)
        dl.addWidget(self.preview)
        side = QVBoxLayout()
        side.addWidget(self.details, 1)
        buttons = QHBoxLayout()
        buttons.addWidget(self.cam_button)
        buttons.addWidget(self.fix_button, 1)
        side.addLayout(buttons)
        dl.addLayout(side, 1)
        gallery_box = QWidget()
        gl = QVBoxLayout(gallery_box)
        gl.setContentsMargins(0, 0, 0, 0)
        row = QHBoxLayout()  # the buttons above the title: a long title wraps over the gallery's whole width
        for button in (self.issues_button, self.outliers_button, self.copies_button):
            row.addWidget(button)
        row.addStretch(1)
        row.addWidget(self.pool_button)
        gl.addLayout(row)
        gl.addWidget(self.gallery_title)
        gl.addWidget(self.gallery, 1)
        self.side_tabs = QTabWidget()
        self.side_tabs.addTab(gallery_box, "Gallery")
        self.side_tabs.addTab(self.data_map, "Map")
        right = QWidget()
        rl = QVBoxLayout(right)
        rl.setContentsMargins(0, 0, 0, 0)
        rl.addWidget(self.side_tabs, 1)
        rl.addWidget(detail)
        splitter = QSplitter()
        splitter.addWidget(left)
        splitter.addWidget(right)
        splitter.setSizes([560, 440])  # the table's seven columns whole at 1024 px; the gallery wraps
        layout = QVBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 0)
        layout.addWidget(splitter)

    def show_evaluation(self, ev: MultiLabelEvaluation) -> None:
        """`ev`'s figures; the label chosen before stays chosen (else the one with the lowest AP)."""
        self.evaluation = ev
        m = ev.metrics
        epoch = f" · epoch {m['epoch']}" if m.get("epoch") is not None else ""
        self.headline.setText(
            f"<b>{ev.name}: mAP {percent(m['map'])}</b> (micro {percent(m['map_micro'])}) on {m['images']} images · "
            f"every label right: {percent(m['exact_match'])} of the images · loss {m['loss']:.3f}{epoch}<br>"
            f"<span style='color:#777'>Thresholds chosen on the validation split, each label's best F1"
            f"{'' if m.get('thresholds_chosen_here') else ' (applied here as chosen)'}</span>")
        self.table.setSortingEnabled(False)
        self.table.setRowCount(0)
        for name, figures in m["per_label"].items():
            r = self.table.rowCount()
            self.table.insertRow(r)
            self.table.setItem(r, 0, QTableWidgetItem(name))
            for c, (_, key, _) in enumerate(COLUMNS[1:], start=1):
                value = figures.get(key)
                text = "—" if value is None else (str(value) if key == "support" else f"{value:.2f}"
                                                  if key == "threshold" else percent(value) if key == "ap" else
                                                  f"{100 * value:.0f}%")
                item = NumericItem(text)
                item.setData(Qt.ItemDataRole.UserRole, value)
                self.table.setItem(r, c, item)
        self.table.setSortingEnabled(True)
        self.table.sortItems(0, Qt.SortOrder.AscendingOrder)
        worst = min(m["per_label"], key=lambda n: m["per_label"][n]["ap"] if m["per_label"][n]["ap"] is not None
                    else 2.0, default="")
        self.choose(self.label if self.label in m["per_label"] else worst)

    def choose(self, label: str) -> None:
        """Show `label`'s curve and errors (selects its row)."""
        for r in range(self.table.rowCount()):
            if self.table.item(r, 0).text() == label:
                self.table.selectRow(r)
                return

    def _label_chosen(self) -> None:
        rows = self.table.selectionModel().selectedRows()
        if not rows or self.evaluation is None:
            return
        self.label = self.table.item(rows[0].row(), 0).text()
        self.issues = None  # the gallery goes back to the chosen label's errors
        ev, label = self.evaluation, self.label
        recall, precision = ev.precision_recall(label)
        self.curve.clear()
        self.curve.plot(recall, precision, pen=pg.mkPen("#1f77b4", width=2))
        threshold = ev.metrics["thresholds"].get(label)
        figures = ev.metrics["per_label"][label]
        if figures.get("recall") is not None and figures.get("precision") is not None:
            self.curve.plot([figures["recall"]], [figures["precision"]], pen=None, symbol="o", symbolBrush="#d62728")
        set_title(self.curve, f"{html.escape(label)}: AP {percent(figures['ap'])}; dot: threshold {threshold:.2f}")
        self.curve.setRange(xRange=(0, 1), yRange=(0, 1))
        positives, negatives = ev.false_positives(label), ev.false_negatives(label)
        self.shown = [(p, "FP") for p in positives] + [(p, "FN") for p in negatives]
        self.gallery_title.setText(
            f"<b>{html.escape(label)}</b>: {len(positives)} false positive(s), the network gives the label and the "
            f"image does not carry it (most probable first); then {len(negatives)} false negative(s), the image "
            f"carries it and the network leaves it out" + errors_with(positives, negatives, label))
        self._fill()

    def _fill(self) -> None:
        self.gallery.clear()
        for p, kind in self.shown:
            item = QListWidgetItem(f"{kind} {100 * p.probabilities[self.label]:.0f}%")
            item.setToolTip(f"{p.path}\nlabels: {', '.join(p.true) or 'none'}\npredicted: "
                            f"{', '.join(p.predicted) or 'none'}")
            self.gallery.addItem(item)
        self._thumb_serial += 1
        serial, paths = self._thumb_serial, [p.path for p, _ in self.shown]
        run_in_thread(lambda: load_thumbnails(paths, THUMB), lambda images: self._icons(serial, images), owner=self)
        self._select(-1)

    # ---- the audit's lists -------------------------------------------------------------------------
    def set_run(self, run_path: str) -> None:
        """The run whose audit, map and Grad-CAM the view asks for."""
        self.run_path = run_path
        self.data_map.set_run(run_path)

    def find_label_issues(self, kind: str = "suspects") -> None:
        """`main.py audit RUN --json` in a subprocess (a second time it reuses what it kept); its `kind`, "suspects"
        (a label missing or wrong), "outliers" or "copies", fills the gallery, worst first."""
        if not self.run_path or self._audit_job is not None:
            return
        run = self.run_path
        if self._audit is not None and self._audit[0] == run:  # this run's audit, already read: its other lists
            self._issues_found(self._audit[1], kind)
            return
        self._enable_audit(False)
        self.side_tabs.setCurrentIndex(0)
        self.gallery_title.setText("Auditing the run's images: through its network, then a cross-fitted probe…")
        job = self._audit_job = CliJob(Audit(run_dir=str(run), json=True), self)
        job.done.connect(lambda report: self._issues_found(report, kind, run))
        job.failed.connect(self._issues_failed)

    def _enable_audit(self, on: bool) -> None:
        for button in (self.issues_button, self.outliers_button, self.copies_button):
            button.setEnabled(on)

    def _issues_found(self, report: dict, kind: str, run: str | None = None) -> None:
        """The audit's `kind` in the gallery; a new report (from `run`) is kept for the run's other lists."""
        if run is not None:
            self._audit_job = None
            self._enable_audit(True)
            if run != self.run_path:  # another run was opened meanwhile
                return
            self._audit = (run, report)
        found, title = multilabel_gallery(report, kind)
        self._show_listed(found, title)

    def _show_on_map(self, rows: list[dict]) -> None:
        """The map's training and validation images selected, in the gallery: R gives an image the probe's labels
        (a test image cannot be changed: the manifest is for what the run learns from)."""
        found = [Listed(r["path"], r["label"], r["suggested"], r["finding"] or r["split"],
                        f"chosen on the map; the cross-fitted probe gives it {r['suggested'] or 'no label'}")
                 for r in rows if r["split"] != "test"]
        test = len(rows) - len(found)
        self._show_listed(found, f"{len(found)} images chosen on the map ({ISSUE_KEYS})" +
                          (f"; {test} test images left out" if test else ""))

    def _show_listed(self, found: list[Listed], title: str) -> None:
        self.issues = found
        self.side_tabs.setCurrentIndex(0)
        self.gallery_title.setText(title)
        self.gallery.clear()
        for listed in found:
            item = QListWidgetItem(listed.caption)
            item.setToolTip(f"{listed.path}\nlabels: {listed.given or 'none'}\nsuggested: {listed.suggested or 'none'}")
            self.gallery.addItem(item)
        self._thumb_serial += 1
        serial, pairs = self._thumb_serial, [(listed.path, listed.copy_of) for listed in found]
        run_in_thread(lambda: load_pair_thumbnails(pairs, THUMB), lambda images: self._icons(serial, images),
                      owner=self)
        if found:
            self.gallery.setCurrentRow(0)
            self.gallery.setFocus()
        else:
            self._select(-1)

    def _issues_failed(self, error: str) -> None:
        self._audit_job = None
        self._enable_audit(True)
        self.gallery_title.setText(f"Audit: {html.escape(error)}")

    def _decide(self, relabel: bool) -> None:
        """R: the selected image's labels become the suggested set; E: it leaves training; into the manifest, then
        on to the next."""
        row = self.gallery.currentRow()
        if self.issues is None or not 0 <= row < len(self.issues):
            return
        listed = self.issues[row]
        new = listed.suggested if relabel else None
        self.marked[os.path.realpath(listed.path)] = new  # shown at once; the manifest write follows
        self.marksRequested.emit([listed.path], new)
        self.gallery.item(row).setText("relabelled" if relabel else "excluded")
        self._next()

    def _next(self) -> None:
        self.gallery.setCurrentRow(min(self.gallery.currentRow() + 1, self.gallery.count() - 1))

    def _describe_issue(self, listed: Listed) -> None:
        real = os.path.realpath(listed.path)
        decided = ""
        if real in self.marked:
            now = self.marked[real]
            decided = (f"<br>In the manifest: {'excluded' if now is None else 'labels ' + html.escape(now or 'none')}")
        self.details.setText(
            f"<b>{html.escape(os.path.basename(listed.path))}</b><br>labels: {html.escape(listed.given or 'none')}<br>"
            f"suggested: <b>{html.escape(listed.suggested or 'none')}</b><br>{html.escape(listed.measure)}{decided}"
            f"<br><span style='color:#777'>{html.escape(listed.path)}</span>")

    def _icons(self, serial: int, images: list[QImage]) -> None:
        if serial == self._thumb_serial:  # not a list shown since
            set_gallery_icons(self.gallery, images)

    def current_labels(self, p: LabelledPrediction) -> list[str]:
        """The image's labels as the next run will read them: the manifest's, else the labels file's."""
        given = self.marked.get(os.path.realpath(p.path), ...)
        if given is ...:
            return list(p.true)
        return [n for n in (given or "").split(";") if n]

    def _select(self, row: int) -> None:
        if self.issues is not None:
            self._select_issue(row)
            return
        self.selected = self.shown[row] if 0 <= row < len(self.shown) else None
        self.preview.setPixmap(QPixmap())
        self.cam_button.setEnabled(self.selected is not None and bool(self.run_path) and not self.gradcam.busy)
        self.cam_button.setText(f"Grad-CAM of {self.label}" if self.selected is not None else "Grad-CAM")
        if self.selected is None:
            self.details.setText("")
            self.fix_button.setEnabled(False)
            self.fix_button.setText("")
            return
        p, _ = self.selected
        self._describe(p)
        run_in_thread(lambda: load_thumbnails([p.path], PREVIEW)[0], lambda image: self._preview(p, image),
                      owner=self)

    def _select_issue(self, row: int) -> None:
        self.selected = None
        self.preview.setPixmap(QPixmap())
        self.cam_button.setEnabled(False)
        inside = 0 <= row < len(self.issues)
        self.fix_button.setEnabled(inside)
        self.fix_button.setText("Relabel as suggested (R)" if inside else "")
        if not inside:
            self.details.setText("")
            return
        listed = self.issues[row]
        self._describe_issue(listed)
        run_in_thread(lambda: load_pair_thumbnails([(listed.path, listed.copy_of)], PREVIEW)[0],
                      lambda image: self._issue_preview(row, image), owner=self)

    def _issue_preview(self, row: int, image: QImage) -> None:
        if self.issues is not None and self.gallery.currentRow() == row and not image.isNull():
            self.preview.setPixmap(QPixmap.fromImage(image))

    def _preview(self, p: LabelledPrediction, image: QImage) -> None:
        if self.selected is not None and self.selected[0] is p and not image.isNull():
            self.preview.setPixmap(QPixmap.fromImage(image))

    def grad_cam(self) -> None:
        """Where the network finds the chosen label in the selected image: `main.py grad-cam --class LABEL`."""
        if self.selected is None or not self.run_path or self.gradcam.busy:
            return
        self.cam_button.setEnabled(False)
        self.cam_button.setText("Computing…")
        self.gradcam.ask(self.run_path, self.selected[0].path, self.label)

    def _cam_over(self) -> None:
        self.cam_button.setEnabled(True)
        self.cam_button.setText(f"Grad-CAM of {self.label}")

    def _cam_done(self, image: str, result: dict) -> None:
        self._cam_over()
        if self.selected is None or self.selected[0].path != image:
            return
        self.cam = result
        self.preview.setPixmap(scaled_pixmap(result["overlay"], PREVIEW))
        self.preview.setToolTip(f"Grad-CAM of {result['explained']} ({100 * result['explained_probability']:.0f}%): "
                                f"bright where the network finds it")

    def _cam_failed(self, image: str, message: str) -> None:
        self._cam_over()
        self.details.setText(self.details.text() + f"<br><span style='color:#c9302c'>Grad-CAM failed: "
                             f"{html.escape(message)}</span>")

    def _describe(self, p: LabelledPrediction) -> None:
        labels = self.current_labels(p)
        changed = " (the manifest's)" if labels != list(p.true) else ""
        ranked = sorted(p.probabilities.items(), key=lambda x: -x[1])
        thresholds = self.evaluation.metrics["thresholds"]
        shown = " · ".join(f"<b>{html.escape(n)}</b> {100 * q:.0f}%" if q >= thresholds[n] else
                           f"{html.escape(n)} {100 * q:.0f}%" for n, q in ranked)
        self.details.setText(f"<b>{html.escape(os.path.basename(p.path))}</b><br>labels{changed}: "
                             f"{html.escape(', '.join(labels) or 'none')}<br>the network (bold: at its threshold): "
                             f"{shown}<br><span style='color:#777'>{html.escape(p.path)}</span>")
        has = self.label in labels
        self.fix_button.setText(f"Remove {self.label} from its labels" if has else f"Add {self.label} to its labels")
        self.fix_button.setEnabled(True)

    def fix(self) -> None:
        """The selected image with the chosen label added (it lacks it) or removed (it has it), in the manifest; in
        the audit's list, the image's labels as suggested (R)."""
        if self.issues is not None:
            self._decide(True)
            return
        if self.selected is None or self.evaluation is None:
            return
        p, _ = self.selected
        labels = self.current_labels(p)
        labels = [n for n in labels if n != self.label] if self.label in labels else labels + [self.label]
        order = self.evaluation.labels
        labels.sort(key=lambda n: order.index(n) if n in order else len(order))
        self.marked[os.path.realpath(p.path)] = ";".join(labels)  # shown at once; the manifest write follows
        self.marksRequested.emit([p.path], ";".join(labels))
        self._describe(p)

    def set_marked(self, marked: dict[str, str | None]) -> None:
        self.marked = dict(marked)
        row = self.gallery.currentRow()
        if self.issues is not None and 0 <= row < len(self.issues):
            self._describe_issue(self.issues[row])
        elif self.selected is not None:
            self._describe(self.selected[0])
