"""Dataset page: train/val folders, a background scan (classes, counts, samples, unusable files), loading options."""

from __future__ import annotations

import html
import random
from pathlib import Path

from PySide6.QtCore import QSize, Qt, QTimer, Signal
from PySide6.QtGui import QImage, QPixmap
from PySide6.QtWidgets import (
    QComboBox,
    QFileDialog,
    QFormLayout,
    QGroupBox,
    QHBoxLayout,
    QLabel,
    QListWidget,
    QListWidgetItem,
    QPushButton,
    QSplitter,
    QVBoxLayout,
    QWidget,
)

from app.jobs.background import run_in_thread, run_to_end, without_collection_pauses
from app.pages.auto_panel import AutoPanel
from app.state.form_model import USER
from app.state.runs_folder import RunsFolder
from app.widgets.augment_preview import AugmentPreview
from app.widgets.class_bars import ClassBars
from app.widgets.forms import Binder, FullHeight, WrappedLabel, breakable
from app.widgets.thumbnails import load_thumbnails
from trainer.core.config import key_choices
from trainer.core.rundir import RunDir
from trainer.data.duplicates import Duplicates, ImageRef, find_duplicates
from trainer.data.findings import Findings, latest_audit
from trainer.data.manifest import Manifest, edit_manifest, read_manifest
from trainer.data.scan import DataError, ScanResult, find_layout, scan_image_folder
from trainer.data.suggest import flip_rule, median_aspect, median_short_side, suggest
from trainer.remote.protocol import read_scan
from trainer.runs.commands import Agent

THUMB = 56
SUGGESTED = "the folder's suggestion"  # who set a value the scan suggested (Apply)
NEW_MANIFEST = "your marks (a new manifest)"  # who set data.exclude when marking an image made a manifest
# what a scan hands the page: the scan, thumbnails, the manifest, the flip rule, the exact duplicates and the last
# audit's findings (None: not looked for, as on a host)
ScanPayload = tuple[ScanResult, list[tuple[str, QImage]], "Manifest | None", object, "Duplicates | None",
                    "Findings | None"]
THUMBS_PER_CLASS = 6
SCAN_THREADS = 2  # header-reading threads in the GUI's process: the scan's 8 left the GUI thread waiting for the
# interpreter lock behind them (gaps of 105-150 ms at 100,000 images; docs/benchmarks.md, "Long runs, many runs")


def _scan_with_thumbnails(folder: str, manifest_path: str, runs_dir: Path | None, labels: str = "") -> ScanPayload:
    """Runs on the thread pool: header scan (honouring the manifest) plus a few decoded thumbnails per class
    (QImage is thread-safe), the flip rule, the exact duplicates and what the last audit of a run on the folder
    found. With a labels file (multi-label), the images it lists and a few of each label's."""
    with without_collection_pauses():  # 100,000 samples: no full collections over them while the GUI waits
        manifest = read_manifest(manifest_path) if manifest_path else None
        if labels:
            return _labelled_with_thumbnails(folder, labels, manifest)
        result = scan_image_folder(folder, full=False, manifest=manifest, workers=SCAN_THREADS)
        if result.image_sizes:  # here, not on the GUI thread, where the suggestions read them
            median_short_side(result), median_aspect(result)
        thumbs = _thumbnails(result, lambda label, index: label == index)
        findings = latest_audit(runs_dir, folder) if runs_dir else None
        return result, thumbs, manifest, flip_rule(result), _duplicates(folder, result), findings


def _thumbnails(result: ScanResult, shows) -> list[tuple[str, QImage]]:
    """A seeded few decoded thumbnails of each class: the samples whose label `shows(label, class index)`."""
    rng = random.Random(0)
    thumbs = []
    for index, name in enumerate(result.classes):
        paths = [p for p, label in result.samples if shows(label, index)]
        for image in load_thumbnails(rng.sample(paths, min(THUMBS_PER_CLASS, len(paths))), THUMB):
            if not image.isNull():
                thumbs.append((name, image))
    return thumbs


def _labelled_with_thumbnails(folder: str, labels: str, manifest) -> ScanPayload:
    """Multi-label: the labels file against the folder (trainer.data.labels, the trainer's own reading), a few
    images of each label."""
    from trainer.data.labels import labelled_scan

    result = labelled_scan(labels, "data.labels", folder, manifest=manifest)
    result.pairs = result.together()  # here, off the GUI thread: a pass over every image's labels
    return result, _thumbnails(result, lambda on, index: on[index]), manifest, None, None, None


def _duplicates(folder: str, result: ScanResult) -> Duplicates:
    """Byte-identical images in the training folder and, for a folder with its own splits, across train/val/test."""
    images = [ImageRef("train", path, result.classes[label]) for path, label in result.samples]
    layout = find_layout(folder)
    for split in ("val", "test"):
        other_dir = layout[f"{split}_dir"]
        if other_dir and Path(other_dir).resolve() != Path(folder).resolve():
            other = scan_image_folder(other_dir, full=False)
            images += [ImageRef(split, path, other.classes[label]) for path, label in other.samples]
    return find_duplicates(images)


def remote_scan(host: str, folder: str, labels: str = "") -> ScanPayload:
    """Runs on the thread pool: the scan done on the host (`main.py agent scan --host`; multi-label with `labels`,
    a labels file there), with its thumbnails."""
    done = run_to_end(Agent(action="scan", agent_args=[folder], host=host, thumbs=THUMBS_PER_CLASS, thumb_size=THUMB,
                            labels=labels or None), timeout=600)
    if done.returncode != 0:
        lines = [line for line in done.stderr.splitlines() if line.strip()]
        raise DataError(lines[-1].removeprefix("error: ") if lines else f"the scan on {host} failed")
    result, thumbs = read_scan(done.stdout, f"{host}: `agent scan`")
    return result, [(name, QImage.fromData(png)) for name, png in thumbs], None, None, None, None  # flips: by names


def duplicates_warning(found: Duplicates | None, root: str) -> list[str]:
    """The Dataset page's line for exact duplicates (none, or none looked for on a host: no line)."""
    if not found or not found.groups:
        return []
    return [f"{len(found.groups)} image(s) are in the dataset more than once ({len(found.leaks)} across train/val/test, "
            f"{len(found.conflicting)} under two classes): main.py check-data {root} lists them"]


def folder_row(binder: Binder, key: str, placeholder: str, title: str, parent: QWidget,
               file_filter: str | None = None, host_of=lambda: "") -> QWidget:
    """A path field bound to `key` with a Browse… button: a folder dialog, or a file dialog with `file_filter`;
    a folder (a CSV file, with `file_filter`) on the host `host_of()` names, when it names one."""
    edit = binder.line(key, placeholder)
    model = binder.model
    edit.setToolTip(edit.text())
    edit.textChanged.connect(edit.setToolTip)  # the whole path, whatever the field's width shows
    button = QPushButton("Browse…")
    button.setObjectName(f"browse:{key}")

    def browse():
        if host_of():  # a folder or a labels file there
            from app.dialogs.remote_browser import RemoteFolderDialog

            start = edit.text()
            if file_filter:  # the file's folder, or the dataset's
                start = str(Path(start).parent) if start else str(model.get("data.train_dir") or "")
            dialog = RemoteFolderDialog(host_of(), start, parent, file=bool(file_filter))
            dialog.chosen.connect(lambda chosen: model.set(key, chosen, USER))
            dialog.open()
            return
        dataset = str(model.get("data.train_dir") or "")
        start = edit.text() or (str(Path(dataset).parent) if dataset else str(Path.home()))  # near the dataset
        if file_filter:
            chosen, _ = QFileDialog.getOpenFileName(parent, title, start, file_filter)
        else:
            chosen = QFileDialog.getExistingDirectory(parent, title, start)
        if chosen:
            model.set(key, chosen, USER)

    button.clicked.connect(browse)
    row = QWidget()
    layout = QHBoxLayout(row)
    layout.setContentsMargins(0, 0, 0, 0)
    layout.addWidget(edit, 1)
    layout.addWidget(button)
    return row


def format_normalisation(mean, std, auto: dict | None) -> str:
    """The normalisation in effect: data.mean/std as set, or what auto means for the chosen model and weights
    (the trainer's answer, from describe-model)."""
    if auto is None and "auto" in (mean, std):
        return "auto (working out the model's…)"
    shown_mean = auto["mean"] if mean == "auto" else mean
    shown_std = auto["std"] if std == "auto" else std
    where = f" — auto: {auto['source']}" if "auto" in (mean, std) else " — set in data.mean/std"
    return (f"mean {', '.join(f'{v:.3f}' for v in shown_mean)} · std {', '.join(f'{v:.3f}' for v in shown_std)}"
            + where)


def is_run_copy(manifest_path: str) -> bool:
    """The manifest is a run directory's own copy (opening a past run loads its config, which points there)."""
    run = RunDir(Path(manifest_path).parent)
    return Path(manifest_path) == run.manifest and run.config.exists()


class DatasetPage(QWidget):
    scanned = Signal(object)  # ScanResult, or None when the folder cannot be scanned
    said = Signal(str, int)  # a line for the status bar (what the folder's layout set), and for how many ms
    manifestChanged = Signal(dict)  # real path -> new class (None: excluded), after each scan
    findingsRequested = Signal(str, str)  # a run's path, the audit's view: "suspects", "copies" or "outliers"

    def __init__(self, binder: Binder, parent: QWidget | None = None):
        super().__init__(parent)
        self.binder = binder
        self.model = binder.model  # the form's values (the page shows the dataset's)
        self.scan_result: ScanResult | None = None
        self.flips: tuple[bool, str] | None = None  # the trainer's flip rule, measured on the scan
        self.scan_error = ""
        self._scan_serial = 0
        self._scan_running = False  # a scan is on the thread pool
        self._scan_waiting = False  # and another was asked for meanwhile
        self.manifest: Manifest | None = None
        # where a new manifest goes when data.exclude is not set yet (the window decides: beside the config)
        self.default_manifest = lambda: Path.home() / "traindeck-exclude.yaml"
        self.host = ""  # device.host: the folders are on that host (browsed and scanned there)
        self.runs_folder: RunsFolder | None = None  # where the last audit of a run on the folder is looked for

        left = self._build_settings(binder)
        right = self._build_overview(binder)
        splitter = QSplitter()
        splitter.addWidget(left)
        splitter.addWidget(right)
        splitter.setSizes([420, 700])
        layout = QVBoxLayout(self)
        layout.addWidget(splitter)

        self._debounce = QTimer(self)
        self._debounce.setSingleShot(True)
        self._debounce.setInterval(400)
        self._debounce.timeout.connect(self.scan)
        self.model.listen(self._model_changed)

    def _model_changed(self, key: str | None, _by: str) -> None:
        """The folders are scanned again once their edits pause; the suggestions follow the loading settings."""
        if key in ("data.train_dir", "data.exclude"):
            self._debounce.start()
        elif key == "data.labels":  # multi-label now, or no longer: a scan under way read the folder the other way
            self._scan_serial += 1
            self._debounce.start()
        elif key in ("data.image_size", "data.image_width", "data.augment.hflip"):
            self._show_suggestions()

    def _build_settings(self, binder: Binder) -> QWidget:
        """The left column: Auto, the folders, loading and augmentation."""
        folders = QGroupBox("Folders")
        form = QFormLayout(folders)
        # each name above its field: a path gets the column's whole width (issue #71: beside their names, the fields
        # were 35-85 px wide at 1024x700, and a path read "/train")
        form.setRowWrapPolicy(QFormLayout.RowWrapPolicy.WrapAllRows)
        form.addRow("Training images", folder_row(binder, "data.train_dir", "ImageFolder: one sub-folder per class",
                                                  "Training images", self, host_of=lambda: self.host))
        form.addRow("Labels file", folder_row(binder, "data.labels", "optional: multi-label, a CSV of each image's "
                                              "labels (file,labels)", "Labels file", self, "CSV files (*.csv)",
                                              host_of=lambda: self.host))
        form.addRow("Validation images", folder_row(binder, "data.val_dir", "optional: else a split of the training set",
                                                    "Validation images", self, host_of=lambda: self.host))
        form.addRow("Validation split", binder.dspin("data.val_split"))
        form.addRow("Manifest", folder_row(binder, "data.exclude", "optional: images left out or relabelled (marked "
                                           "in the Results tab)", "Dataset manifest", self, "Manifests (*.yaml *.yml)"))

        loading = QGroupBox("Loading")
        lf = QFormLayout(loading)
        lf.addRow("Image size", binder.spin("data.image_size", " px"))
        lf.addRow("Image width", binder.spin("data.image_width", " px"))
        lf.addRow("Resize", binder.combo("data.resize", key_choices("data.resize")))
        lf.addRow("Batch size", binder.spin("data.batch_size"))
        lf.addRow("Workers", binder.spin("data.num_workers"))
        lf.addRow("Decoded cache", binder.combo("data.cache", key_choices("data.cache")))
        lf.addRow("Unusable files", binder.combo("data.on_bad_file", key_choices("data.on_bad_file")))
        lf.addRow("Sampler", binder.combo("data.sampler", key_choices("data.sampler")))
        self.normalisation = WrappedLabel("")
        self.normalisation.setObjectName("normalisation")
        self.normalisation.setStyleSheet("color: #555;")
        lf.addRow("Normalisation", self.normalisation)

        augment = QGroupBox("Augmentation")
        af = QFormLayout(augment)
        flip = binder.choice("data.augment.hflip", [({True: "on", False: "off"}.get(v, str(v)), v)
                                                    for v in key_choices("data.augment.hflip")])
        flip.setSizeAdjustPolicy(QComboBox.SizeAdjustPolicy.AdjustToMinimumContentsLengthWithIcon)
        flip.setMinimumContentsLength(10)  # "auto (off)": the page keeps its width on a laptop screen
        af.addRow("Horizontal flip", flip)
        af.addRow(binder.check("data.augment.random_resized_crop", "Random resized crop"))
        af.addRow("Smallest crop", binder.dspin("data.augment.crop_scale_min"))
        af.addRow("Colour jitter", binder.dspin("data.augment.color_jitter"))
        af.addRow("Policy", binder.combo("data.augment.policy", key_choices("data.augment.policy")))
        af.addRow("Random erasing", binder.dspin("data.augment.random_erasing"))
        af.addRow("MixUp", binder.dspin("data.augment.mixup"))
        af.addRow("CutMix", binder.dspin("data.augment.cutmix"))

        self.auto = AutoPanel()
        self.preview = AugmentPreview()  # drawn by the trainer for the form's config (the window asks)
        left = FullHeight()  # on a 700 px screen the page scrolls instead of squashing the spin boxes
        ll = QVBoxLayout(left)
        for box in (self.auto, folders, loading, augment, self.preview):
            ll.addWidget(box)
        ll.addStretch(1)
        return left

    def _build_overview(self, binder: Binder) -> QWidget:
        """The right column: what the scan found (counts, samples, unusable files), the manifest's entries, and the
        fixes and settings suggested for the folder."""
        self.summary = QLabel("Choose a folder of training images.")
        self.summary.setObjectName("scanSummary")
        self.summary.setWordWrap(True)
        self.findings = QLabel("")
        self.findings.setObjectName("dataFindings")
        self.findings.setWordWrap(True)
        self.findings.setToolTip("what `main.py audit` found in the latest audited run on this folder; a link opens "
                                 "that run's Results tab on the finding")
        self.findings.linkActivated.connect(lambda link: self.findingsRequested.emit(*link.split("|", 1)[::-1]))
        self.findings.hide()
        self.bars = ClassBars()
        self.thumbs = QListWidget()
        self.thumbs.setViewMode(QListWidget.ViewMode.IconMode)
        self.thumbs.setIconSize(QSize(THUMB, THUMB))
        self.thumbs.setResizeMode(QListWidget.ResizeMode.Adjust)
        self.thumbs.setMovement(QListWidget.Movement.Static)
        self.bad_files = QListWidget()
        self.bad_files.setObjectName("badFiles")
        self.manifest_entries = QListWidget()
        self.manifest_entries.setObjectName("manifestEntries")
        self.manifest_entries.setSelectionMode(QListWidget.SelectionMode.ExtendedSelection)
        self.undo_entry = QPushButton("Undo selected")
        self.undo_entry.setObjectName("undoManifestEntry")
        self.undo_entry.setToolTip("put the image back as it is in its folder")
        self.undo_entry.clicked.connect(self.undo_selected)
        self.manifest_title = QLabel("<b>Left out, relabelled or added</b> (none)")

        self._build_fixes(binder)

        right = QWidget()
        rl = QVBoxLayout(right)
        rl.addWidget(self.summary)
        rl.addWidget(self.findings)
        rl.addWidget(self.auto.choices, 3)  # Auto's choices, once planned: the wide column has room for the reasons
        rl.addWidget(self.imbalance_fixes)
        rl.addWidget(self.suggestion)
        self.bars_title = QLabel("<b>Images per class</b>")
        rl.addWidget(self.bars_title)
        rl.addWidget(self.bars, 2)
        rl.addWidget(QLabel("<b>Samples</b>"))
        rl.addWidget(self.thumbs, 3)
        rl.addWidget(QLabel("<b>Unusable files</b>"))
        rl.addWidget(self.bad_files, 1)
        row = QHBoxLayout()
        row.addWidget(self.manifest_title, 1)
        row.addWidget(self.undo_entry)
        rl.addLayout(row)
        rl.addWidget(self.manifest_entries, 1)
        return right

    def _build_fixes(self, binder: Binder) -> None:
        """The one-click fixes for unbalanced classes, and the settings suggested from the scan
        (`trainer.data.suggest`: the rule Auto uses too)."""
        self.imbalance_fixes = QWidget()
        self.imbalance_fixes.setObjectName("imbalanceFixes")
        fixes = QHBoxLayout(self.imbalance_fixes)
        fixes.setContentsMargins(0, 0, 0, 0)
        fixes.addWidget(QLabel("Unbalanced classes:"))
        self.weight_classes = QPushButton("Weight the loss by class")
        self.weight_classes.setToolTip("loss.class_weights: auto (inverse class frequency)")
        self.weight_classes.clicked.connect(lambda: self.model.set("loss.class_weights", "auto", USER))
        self.balance_sampler = QPushButton("Balanced sampler")
        self.balance_sampler.setToolTip("data.sampler: balanced (every class seen about equally often)")
        self.balance_sampler.clicked.connect(lambda: self.model.set("data.sampler", "balanced", USER))
        fixes.addWidget(self.weight_classes)
        fixes.addWidget(self.balance_sampler)
        fixes.addStretch(1)
        self.imbalance_fixes.hide()

        # settings suggested from the scan (trainer.data.suggest: the rule Auto uses too), applied with one click
        self.suggestion = QWidget()
        self.suggestion.setObjectName("suggestion")
        sugg = QHBoxLayout(self.suggestion)
        sugg.setContentsMargins(0, 0, 0, 0)
        self.suggestion_text = QLabel("")
        self.suggestion_text.setWordWrap(True)
        self.apply_suggestion = QPushButton("Apply")
        self.apply_suggestion.setObjectName("applySuggestion")
        self.apply_suggestion.clicked.connect(self._apply_suggestions)
        sugg.addWidget(self.suggestion_text, 1)
        sugg.addWidget(self.apply_suggestion)
        self.suggestion.hide()
        self.suggestions: list = []

    @property
    def labels_path(self) -> str:
        return str(self.model.get("data.labels") or "").strip()

    @property
    def train_dir(self) -> str:
        return str(self.model.get("data.train_dir") or "").strip()

    @property
    def manifest_path(self) -> str:
        return str(self.model.get("data.exclude") or "").strip()

    def set_host(self, host: str) -> None:
        """The folders are on `host` now ("" for this machine): browse and scan there."""
        if host != self.host:
            self.host = host
            self.scan()

    def hold(self, why: str) -> None:
        """No scan until `release()` (the folder is still being written, e.g. the demo dataset on first start)."""
        self._held = why
        self._scan_serial += 1  # a scan under way reports nothing
        self.summary.setText(why)

    def release(self) -> None:
        self._held = None
        self.scan()

    def scan(self) -> None:
        if self.train_dir and not getattr(self, "_held", None):
            # once per settled folder, not per keystroke: the window may turn a parent of train/ val/ test/ into
            # those splits (the folder field then holds its train/, scanned now, not again after the debounce)
            said = self.model.settle_folder(self.train_dir, local=not self.host)
            if said:
                self.said.emit(said, 10000)
            self._debounce.stop()
        folder, manifest_path, labels = self.train_dir, self.manifest_path, self.labels_path
        self._scan_serial += 1
        serial = self._scan_serial
        self.scan_result = None
        self.flips = None
        if getattr(self, "_held", None):
            self.summary.setText(self._held)
            return
        self.auto.set_folder_problem("" if folder else "no folder chosen")
        self.auto.folder_changed(folder)
        if not folder:
            self.summary.setText("Choose a folder of training images.")
            self.scanned.emit(None)
            return
        host = self.host
        self.summary.setText(f"Scanning {breakable(folder)} on {html.escape(host)} …" if host
                             else f"Scanning {breakable(folder)} …")
        runs_dir = self.runs_folder.path if self.runs_folder else None
        scan = (lambda: remote_scan(host, folder, labels)) if host else (
            lambda: _scan_with_thumbnails(folder, manifest_path, runs_dir, labels))
        if self._scan_running:  # one scan at a time: the newest state is scanned once the one under way ends
            self._scan_waiting = True  # (twenty quick labels queued twenty full scans of the folder)
            return
        self._scan_running = True
        run_in_thread(scan, lambda result: self._scan_ended(serial, result, self._show),
                      lambda error: self._scan_ended(serial, error, self._failed), owner=self)

    def _scan_ended(self, serial: int, payload, show) -> None:
        self._scan_running = False
        if self._scan_waiting:
            self._scan_waiting = False
            self.scan()  # what changed while it ran (its own result is stale: a newer serial)
            return
        show(serial, payload)

    def _failed(self, serial: int, error: str) -> None:
        if serial != self._scan_serial:
            return
        self.scan_error = error
        self.auto.set_folder_problem(error)
        self.summary.setText(f"<span style='color:#c9302c'>{breakable(error)}</span>")
        self.bars.show_counts({})
        self.thumbs.clear()
        self.bad_files.clear()
        self.scanned.emit(None)

    def _show(self, serial: int, payload) -> None:
        if serial != self._scan_serial:
            return  # a newer scan is under way
        result, thumbs, manifest, self.flips, duplicates, findings = payload
        self.scan_result = result
        self._show_manifest(manifest)
        self.scan_error = ""
        counts = result.counts
        text = f"<b>{len(result.classes)} classes, {len(result.samples)} images</b> in {breakable(result.root)}"
        self.bars_title.setText(f"<b>Images per {'label' if result.labels_file else 'class'}</b>")
        if result.labels_file:
            text = (f"<b>Multi-label: {len(result.classes)} labels on {len(result.samples)} images</b> listed in "
                    f"{breakable(result.labels_file)}; {sum(not any(on) for _, on in result.samples)} with no "
                    f"label; most often together: " + (", ".join(f"{html.escape(a)} + {html.escape(b)} ({n})"
                                                                 for a, b, n in result.pairs) or "none"))
        if result.bad_files:
            text += f"; {len(result.bad_files)} unusable"
        if result.excluded or result.relabelled:
            text += f"; the manifest leaves out {result.excluded} and relabels {result.relabelled}"
        for w in result.warnings + duplicates_warning(duplicates, result.root):
            text += f"<br><span style='color:#b8860b'>warning: {breakable(w)}</span>"
        for p in result.problems():
            text += f"<br><span style='color:#c9302c'>{breakable(p)}</span>"
        self.auto.set_folder_problem("; ".join(result.problems()))
        self.summary.setText(text)
        self._show_findings(findings)
        self.imbalance_fixes.setVisible(result.unbalanced)
        self._show_suggestions()
        self.bars.show_counts(counts)
        self.thumbs.clear()
        for name, image in thumbs:
            item = QListWidgetItem(QPixmap.fromImage(image), name)
            item.setToolTip(name)
            self.thumbs.addItem(item)
        self.bad_files.clear()
        for path, reason in result.bad_files:
            self.bad_files.addItem(f"{path}: {reason}")
        self.scanned.emit(result)

    def _show_findings(self, found: Findings | None) -> None:
        """The last audit's findings, each a link to its view in that run's Results tab."""
        self.findings.setVisible(found is not None)
        if found is None:
            return
        run = html.escape(str(found.run))
        self.findings.setText(
            f"The data check of run {html.escape(found.run.name)}: "
            f"<a href='suspects|{run}'>{found.label_issues} label issue(s)</a> · "
            f"<a href='copies|{run}'>{found.copies} cop(ies), {found.leaks} leak(s) across train/val/test</a> · "
            f"<a href='outliers|{run}'>{found.outliers} outlier(s), {found.unsure} unsure</a>")

    def _show_suggestions(self) -> None:
        self.suggestions = suggest(self.scan_result, self.model.raw(), self.flips) if self.scan_result is not None else []
        self._show_flip_rule()
        self.suggestion_text.setText("Suggested for this folder: " + "; ".join(
            f"<b>{s.key} {s.value}</b> ({s.why})" for s in self.suggestions))
        self.suggestion.setVisible(bool(self.suggestions))

    def _show_flip_rule(self) -> None:
        """What `auto` will decide for this folder's flips (the trainer's rule, measured on the scan) and why."""
        flip = self.binder.widgets["data.augment.hflip"]
        index = flip.findData("auto")
        if self.flips is None:
            flip.setItemText(index, "auto")
            flip.setItemData(index, "the trainer decides for this data", Qt.ItemDataRole.ToolTipRole)
            return
        safe, why = self.flips
        flip.setItemText(index, f"auto ({'on' if safe else 'off'})")
        flip.setItemData(index, f"the trainer's rule for this folder: {why}", Qt.ItemDataRole.ToolTipRole)
        flip.setToolTip(why if flip.currentIndex() == index else "")

    def _apply_suggestions(self) -> None:
        for s in self.suggestions:
            self.model.set(s.key, s.value, SUGGESTED)
        self._show_suggestions()

    # ---- the manifest (data.exclude) -----------------------------------------------------------------
    def _show_manifest(self, manifest: Manifest | None) -> None:
        self.manifest = manifest
        self.manifest_entries.clear()
        entries = manifest.entries() if manifest else []
        added = list(manifest.add.items()) if manifest else []
        for path, what in [(p, "excluded" if new is None else f"→ {new}") for p, new in entries] + \
                [(p, f"+ added as {c}") for p, c in added]:
            item = QListWidgetItem(f"{what}:  {path}")
            item.setData(Qt.ItemDataRole.UserRole, path)
            self.manifest_entries.addItem(item)
        where = f" in {manifest.path.name}" if manifest else ""
        self.manifest_title.setText(f"<b>Left out, relabelled or added</b> ({len(entries) + len(added) or 'none'}"
                                    f"{where}; your files are not touched)")
        self.undo_entry.setEnabled(bool(entries or added))
        self.manifestChanged.emit(dict(entries))

    def _edit_manifest(self, change) -> str:
        """Apply `change(manifest)` to the data.exclude file (created beside the config when not set yet) and
        rescan; "" or why it could not be (an entry is never written over a file that cannot be read: an edit by
        hand is read first, kept, or refused). Done here, not on the thread pool, so that quick successive marks
        never lose one another (the file is a few lines)."""
        path = self.manifest_path
        try:
            base = None
            if not path or is_run_copy(path):  # a run keeps the manifest it trained with: edit a new one
                base = read_manifest(path) if path else None
                path = str(self.default_manifest())
                self.model.set("data.exclude", path, NEW_MANIFEST)
            edit_manifest(path, change, base)  # under the manifest's lock: another writer's entries are kept
        except (OSError, DataError) as e:
            self.summary.setText(f"<span style='color:#c9302c'>cannot update the manifest: {html.escape(str(e))}</span>")
            return f"cannot update the manifest: {e}"
        self._debounce.stop()
        self.scan()
        return ""

    def mark(self, image: str, new_class: str | None) -> None:
        """Leave `image` out of training (new_class None) or give it another class, in the manifest."""
        self._edit_manifest(lambda m: m.mark_excluded(image) if new_class is None else m.mark_relabelled(image,
                                                                                                         new_class))

    def mark_many(self, images: list[str], new_class: str | None) -> None:
        """`mark` for each of `images`, in one write of the manifest."""
        self._edit_manifest(lambda m: [m.mark_excluded(i) if new_class is None else m.mark_relabelled(i, new_class)
                                       for i in images])

    def add_labelled(self, image: str, class_name: str) -> str:
        """Train on `image` (a pool image outside the folder) as `class_name`: an addition in the manifest; "" or
        why it could not be added."""
        return self._edit_manifest(lambda m: m.mark_added(image, class_name))

    def undo(self, image: str) -> None:
        self._edit_manifest(lambda m: m.undo(image))

    def undo_selected(self) -> None:
        images = [item.data(Qt.ItemDataRole.UserRole) for item in self.manifest_entries.selectedItems()]
        if images:
            self._edit_manifest(lambda m: [m.undo(p) for p in images])

    def show_normalisation(self, raw: dict, auto: dict | None) -> None:
        data = raw.get("data", {})
        self.normalisation.setText(format_normalisation(data.get("mean", "auto"), data.get("std", "auto"), auto))

    def problems(self) -> list[str]:
        """What stops a run from starting, as key-path messages."""
        if not self.train_dir:
            return ["data.train_dir: choose the folder of training images"]
        if self.scan_error:
            return [f"data.train_dir: {self.scan_error}"]
        if self.scan_result is not None:
            return [f"data.train_dir: {p}" for p in self.scan_result.problems()]
        return []
