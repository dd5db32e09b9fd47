"""A multi-label run from the app (issue #36): the folder and its labels file on the Dataset page, a run with its mAP
curve, the per-label table, one label's false positives and negatives, two labels fixed in the manifest (the next
run reads them), the audit's label issues decided by key and a pool labelled with label sets (#49), and Try it with
the run's ONNX export giving every label at its threshold; the audit's outliers and copies (a planted copy excluded) and the
map's selection relabelled (#49)."""

from __future__ import annotations

import os
import shutil
from collections import Counter

import numpy as np
import pytest
import yaml
from helpers import digit_mosaics, write_config
from PySide6.QtCore import Qt
from PySide6.QtWidgets import QPushButton

from app.dialogs.label_dialog import LabelDialog
from app.state.audit_gallery import change_text
from trainer.data.labels import labelled_scan
from trainer.data.manifest import read_manifest


@pytest.mark.slow  # a real multi-label run (4 epochs of 510 mosaics) and its ONNX export
def test_a_multi_label_run_from_the_dataset_page_to_two_fixed_labels_and_an_onnx_file(qtbot, make_window, tmp_path):
    labels = digit_mosaics(tmp_path / "mosaics", 600)
    original, copy = labels.parent / "images" / "00007.png", labels.parent / "images" / "copy_of_7.png"
    shutil.copyfile(original, copy)  # a copy under another name, for the audit's Copies
    with labels.open("a") as f:
        f.write(f"images/{copy.name},{labels.read_text().splitlines()[8].split(',')[1]}\n")
    config = write_config(tmp_path, tmp_path / "mosaics", data={"image_size": 32, "batch_size": 64},
                          optimizer={"name": "adamw", "lr": 0.003}, train={"epochs": 4, "seed": 0},
                          export={"formats": ["onnx"]})
    window = make_window(config)
    page = window.dataset_page
    page.binder.widgets["data.labels"].setText(str(labels))  # as Browse… leaves it
    assert window.binder.widgets["loss.name"].currentText() == "bce", "the multi-label loss, shown before Start"
    qtbot.waitUntil(lambda: page.scan_result is not None and "Multi-label" in page.summary.text(), timeout=30_000)
    assert "10 labels on 601 images" in page.summary.text() and "most often together: " in page.summary.text()
    assert sum(page.scan_result.counts.values()) == sum(len(line.split(";")) for line in
                                                         labels.read_text().splitlines()[1:])

    window.run_actions.start()
    qtbot.waitUntil(lambda: window.run_model is not None and window.run_model.state == "completed", timeout=120_000)
    run = window.run_model.run
    curves = window.dashboard.curves
    assert window.run_model.score_key == "val_map" and len(window.run_model.val_score) == 4
    assert curves.acc_plot.getPlotItem().titleLabel.text == "Val mAP"
    assert "━ val mAP</span>" in curves.acc_plot.getAxis("bottom").labelString(), "the curve named under it"

    window.dashboard.tabs.setCurrentWidget(window.dashboard.results)
    tab = window.dashboard.results
    view = tab.multilabel
    qtbot.waitUntil(lambda: tab.pages.currentWidget() is view and view.evaluation is not None, timeout=30_000)
    assert view.table.rowCount() == 10 and "mAP" in view.headline.text()
    assert all(view.table.item(r, c).text().endswith("%") for r in range(10) for c in (1, 2)), "AP and F1 shown"
    view.choose("3")
    positives, negatives = view.evaluation.false_positives("3"), view.evaluation.false_negatives("3")
    assert positives and negatives, "a 4-epoch run errs both ways on some label"
    assert view.gallery.count() == len(positives) + len(negatives)
    qtbot.waitUntil(lambda: not view.gallery.item(0).icon().isNull(), timeout=20_000)  # thumbnails in
    rects = [view.gallery.visualItemRect(view.gallery.item(i)) for i in range(min(6, view.gallery.count()))]
    assert not any(a.intersects(b) for i, a in enumerate(rects) for b in rects[i + 1:]), "thumbnails never overlap"
    assert f"{len(positives)} false positive(s)" in view.gallery_title.text()
    carried = Counter(n for p in positives for n in p.true)  # what a 3 is taken for: the labels its errors carry
    most = carried.most_common(1)[0][1]
    assert any(f"carry most often: {n} ({most})" in view.gallery_title.text() for n, k in carried.items() if k == most)

    view.gallery.setCurrentRow(0)  # a false positive: the image lacks 3; the fix adds it
    first = view.shown[0][0]
    assert "Add 3 to its labels" == view.fix_button.text()
    view.cam_button.click()  # where the network finds a 3 in it: Grad-CAM of that label's own output
    qtbot.waitUntil(lambda: view.cam is not None, timeout=60_000)
    assert view.cam["explained"] == "3" and view.cam["explained_probability"] == pytest.approx(
        first.probabilities["3"], abs=0.02)  # the network's sigmoid for 3 (bf16 here, 4 decimals in the file)
    assert not view.preview.pixmap().isNull() and "Grad-CAM of 3" in view.preview.toolTip()
    view.fix_button.click()
    view.gallery.setCurrentRow(len(positives))  # a false negative: the image carries 3; the fix removes it
    second = view.shown[len(positives)][0]
    assert "Remove 3 from its labels" == view.fix_button.text()
    view.fix_button.click()
    manifest_path = page.manifest_path
    qtbot.waitUntil(lambda: bool(manifest_path) and os.path.exists(manifest_path)
                    and len(read_manifest(manifest_path).relabel) == 2, timeout=10_000)
    relabel = read_manifest(manifest_path).relabel
    assert set(relabel[os.path.realpath(first.path)].split(";")) == set(first.true) | {"3"}
    assert set(relabel[os.path.realpath(second.path)].split(";")) == set(second.true) - {"3"}
    scan = labelled_scan(str(labels), "data.labels", str(labels.parent), manifest=read_manifest(manifest_path))
    names, hot = scan.classes, dict(scan.samples)
    assert hot[first.path][names.index("3")] == 1.0 and hot[second.path][names.index("3")] == 0.0
    assert scan.relabelled == 2, "the next run trains on the two fixed labels"
    assert yaml.safe_load(open(manifest_path))["relabel"], "a manifest a person can read"

    view.issues_button.click()  # the audit's label issues (#49): R relabels as suggested, E excludes, K keeps
    qtbot.waitUntil(lambda: view.issues is not None, timeout=60_000)
    issues = view.issues
    report = view._audit[1]
    assert len(issues) >= 3 and view.gallery.count() == len(issues) and view.gallery.currentRow() == 0
    assert "Label issues" in view.gallery_title.text() and view.gallery.item(0).text() == change_text(
        report["suspects"][0])
    assert issues[0].suggested in view.details.text() and view.fix_button.text() == "Relabel as suggested (R)"
    qtbot.keyClick(view.gallery, Qt.Key.Key_R)  # relabel as suggested, next
    qtbot.keyClick(view.gallery, Qt.Key.Key_E)  # exclude, next
    qtbot.keyClick(view.gallery, Qt.Key.Key_K)  # keep, next
    assert view.gallery.currentRow() == 3 and view.gallery.item(0).text() == "relabelled"
    relabelled, excluded = (os.path.realpath(issues[i].path) for i in (0, 1))
    qtbot.waitUntil(lambda: relabelled in read_manifest(manifest_path).relabel
                    and excluded in read_manifest(manifest_path).exclude, timeout=10_000)
    scan = labelled_scan(str(labels), "data.labels", str(labels.parent), manifest=read_manifest(manifest_path))
    hot = dict(scan.samples)
    assert {n for n, on in zip(scan.classes, hot[issues[0].path]) if on} == set(issues[0].suggested.split(";"))
    assert issues[1].path not in hot and scan.excluded == 1, "the next run leaves the excluded image out"
    assert os.path.realpath(issues[2].path) not in read_manifest(manifest_path).relabel, "K keeps it as it is"

    view.outliers_button.click()  # the same audit's other lists, at once: the far images, then the undecided ones
    assert "Outliers" in view.gallery_title.text() and view.gallery.count() == len(report["outliers"]) > 0
    unsure = next(i for i, o in enumerate(report["outliers"]) if o["why"] == "unsure")
    about, top = report["outliers"][unsure]["about"], report["outliers"][unsure]["top"]
    assert view.gallery.item(unsure).text() == f"{about} {top:.0%}"
    thresholds = view.evaluation.metrics["thresholds"]
    assert abs(top - thresholds[about]) < 0.05, "undecided: the label's probability next to its threshold"
    view.copies_button.click()  # the planted copy beside its original; E takes it out of training
    (listed,) = view.issues
    assert {os.path.realpath(listed.path), os.path.realpath(listed.copy_of)} == {str(original.resolve()),
                                                                                 str(copy.resolve())}
    assert "byte-identical" in view.details.text() and view.gallery.item(0).text() in ("copy", "leak")
    qtbot.keyClick(view.gallery, Qt.Key.Key_E)
    qtbot.waitUntil(lambda: os.path.realpath(listed.path) in read_manifest(manifest_path).exclude, timeout=10_000)

    view.side_tabs.setCurrentWidget(view.data_map)  # the map: a lasso round its left half, shown, one relabelled
    view.data_map.draw()
    qtbot.waitUntil(lambda: len(view.data_map.rows) == 601, timeout=120_000)
    xs = view.data_map.xy[:, 0]
    (low, high), (bottom, top) = (xs.min() - 1, np.median(xs)), (view.data_map.xy[:, 1].min() - 1,
                                                                 view.data_map.xy[:, 1].max() + 1)
    view.data_map.select_inside(np.array([[low, bottom], [high, bottom], [high, top], [low, top]]))
    chosen = view.data_map.selection()
    assert view.data_map.relabel_button.isHidden(), "one class for many images is a single-label action"
    assert 0 < len(chosen) < 601 and all(row["x"] <= high for row in chosen)
    view.data_map.show_button.click()
    assert view.side_tabs.currentIndex() == 0 and [i.path for i in view.issues] == [r["path"] for r in chosen]
    target = next(i for i in view.issues if i.suggested and i.suggested != i.given)
    view.gallery.setCurrentRow(view.issues.index(target))
    view.fix_button.click()
    qtbot.waitUntil(lambda: read_manifest(manifest_path).relabel.get(os.path.realpath(target.path))
                    == target.suggested, timeout=10_000)
    view.choose("5")  # another label: the gallery shows its errors again
    assert view.issues is None and "false positive" in view.gallery_title.text()

    pool = digit_mosaics(tmp_path / "pool", 20, seed=3)  # label a pool (#49): toggles from the network's set, then L
    view.pool_button.click()
    (dialog,) = [w for w in window.findChildren(LabelDialog) if w.isVisible()]
    dialog.pool.setText(str(pool.parent / "images"))
    dialog.count.setValue(3)
    dialog.order_pool()
    qtbot.waitUntil(lambda: bool(dialog.picks), timeout=60_000)
    pick = dialog.picks[0]
    assert dialog.multilabel and dialog.set_button.isVisible() and dialog.checked == [n for n in pick["guess"].split(";")
                                                                                     if n]
    assert pick["about"] in dialog.guess.text()
    qtbot.keyClick(dialog, getattr(Qt.Key, f"Key_{pick['about']}"))  # the least decided label, toggled
    toggled = set(dialog.checked)
    assert toggled == set(filter(None, pick["guess"].split(";"))) ^ {pick["about"]}
    assert dialog.findChild(QPushButton, f"labelAs:{pick['about']}").isChecked() == (pick["about"] in toggled)
    qtbot.keyClick(dialog, Qt.Key.Key_L)
    assert dialog.at == 1 and "Labelled" in dialog.status.text()
    qtbot.waitUntil(lambda: os.path.realpath(pick["path"]) in read_manifest(page.manifest_path).add, timeout=10_000)
    scan = labelled_scan(str(labels), "data.labels", str(labels.parent), manifest=read_manifest(page.manifest_path),
                         additions=True)
    hot = dict(scan.samples)
    assert {n for n, on in zip(scan.classes, hot[os.path.realpath(pick["path"])]) if on} == toggled
    dialog.close()

    qtbot.waitUntil(lambda: not window.runs.running, timeout=30_000)  # the run's process has exited
    job = window.planning.auto_plan(0.5)  # Auto plans a run of the same labels file (tests/test_multilabel.py: its plan)
    arguments = job.process.arguments()
    assert arguments[arguments.index("--labels") + 1] == str(labels)
    job.cancel()
    window.planning.auto_job = None

    window.form.new()  # every setting at its default, on the same dataset: its labels file and its loss too
    assert window.binder.widgets["data.labels"].text() == str(labels)
    assert window.binder.widgets["loss.name"].currentText() == "bce" and not window.form.validate()

    dialog = window.run_actions.try_it()  # the ONNX file the run exported: every label at its threshold
    dialog.set_model_source(str(run.path / "exports" / "model.onnx"))
    with qtbot.waitSignal(dialog.predicted, timeout=60_000) as got:
        dialog.classify([first.path])
    (result,) = got.args[0]
    thresholds = view.evaluation.metrics["thresholds"]
    assert set(result["probabilities"]) == set(thresholds)
    assert {n for n, _ in result["labels"]} == {n for n, p in result["probabilities"].items() if p >= thresholds[n]}
    assert dialog.table.item(0, 2).text() == (" · ".join(f"{c} {100 * q:.0f}%" for c, q in result["labels"])
                                              or "no label at its threshold")
    dialog.close()


def test_a_gallery_laid_out_before_its_thumbnails_came_shows_them_whole(qtbot, tmp_path):
    """The audit's lists fill the gallery at once and its thumbnails are decoded off the GUI thread: a gallery drawn
    in between must still show each thumbnail whole, its caption under it (the items' size was fixed without the
    icons: thin strips of each thumbnail, no caption)."""
    from app.state.audit_gallery import Listed
    from app.training.multilabel_view import THUMB, MultiLabelView

    digit_mosaics(tmp_path / "mosaics", 8)
    images = sorted(str(p) for p in (tmp_path / "mosaics" / "images").glob("*.png"))
    view = MultiLabelView()
    qtbot.addWidget(view)
    view.resize(1000, 700)
    view.show()
    for caption in ("+1 \u22122", "8 38%"):  # a second list in the same gallery too
        view._show_listed([Listed(path, "1;2", "1", caption, "") for path in images], caption)
        qtbot.waitUntil(lambda: not view.gallery.item(len(images) - 1).icon().isNull(), timeout=10_000)
        rects = [view.gallery.visualItemRect(view.gallery.item(i)) for i in range(len(images))]
        assert all(r.height() >= THUMB + view.gallery.fontMetrics().height() for r in rects), rects[0]
        assert not any(a.intersects(b) for i, a in enumerate(rects) for b in rects[i + 1:])
