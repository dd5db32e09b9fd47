"""The Results tab, the manifest and Try it, driven like a user on a real finished run (offscreen)."""

import hashlib
import os
import re
import shutil
from types import SimpleNamespace

import numpy as np
import pytest
import torch
import yaml
from helpers import run_here, train_here, write_config
from PySide6.QtCore import QSize, Qt

from trainer.core.rundir import RunDir
from trainer.data.manifest import read_manifest
from trainer.deploy.evaluation import Predictions, write_evaluation


def checksums(root):
    return {str(p): hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(root.rglob("*")) if p.is_file()}


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory, shapes_dir):
    """One short run (it still gets some validation images wrong), on a copy of the shapes."""
    tmp = tmp_path_factory.mktemp("results")
    photos = tmp / "photos" / "train"
    shutil.copytree(shapes_dir, photos)
    cfg = write_config(tmp, photos, train={"epochs": 2})
    run, code = train_here(cfg, tmp / "runs")
    assert code == 0, run.tail_log()
    return run, photos, cfg


def open_results(qtbot, window, run):
    window.run_actions.open(str(run.path))
    window.dashboard.tabs.setCurrentWidget(window.dashboard.results)
    tab = window.dashboard.results
    qtbot.waitUntil(lambda: tab.evaluation is not None, timeout=20_000)
    return tab


def test_matrix_cells_gallery_grad_cam_and_the_manifest(qtbot, make_window, finished_run, tmp_path):
    run, photos, cfg = finished_run
    before = checksums(photos)
    window = make_window(cfg, runs_dir=run.path.parent)
    tab = open_results(qtbot, window, run)
    metrics = tab.evaluation.metrics
    conf = metrics["confusion"]
    assert tab.matrix_model.rowCount() == 4 and "val:" in tab.headline.text()
    r, c = next((i, j) for i in range(4) for j in range(4) if conf[i][j])
    cell = tab.matrix_model.index(r, c)
    assert tab.matrix_model.data(cell) == str(conf[r][c])
    tab.confusion.row_share.setChecked(True)
    assert tab.matrix_model.data(cell) == f"{100 * conf[r][c] / sum(conf[r]):.0f}"
    tab.confusion.zoom.setValue(tab.confusion.zoom.minimum())
    narrow = tab.matrix.horizontalHeader().sectionSize(0)
    tab.confusion.zoom.setValue(tab.confusion.zoom.maximum())
    assert tab.matrix.horizontalHeader().sectionSize(0) > narrow

    errors = sum(conf[i][j] for i in range(4) for j in range(4) if i != j)
    assert errors > 0, "the run got nothing wrong: the test needs errors"
    assert tab.gallery.count() == errors and f"{errors} misclassified" in tab.gallery_title.text()
    losses = [p.loss for p in tab.shown]
    assert losses == sorted(losses, reverse=True)  # top losses first
    true, predicted, n = max(((i, j, conf[i][j]) for i in range(4) for j in range(4) if i != j), key=lambda t: t[2])
    classes = metrics["classes"]
    assert (tab.pairs.item(0, 0).text(), tab.pairs.item(0, 1).text(), tab.pairs.item(0, 2).text()) == \
        (classes[true], classes[predicted], str(n))

    # a click on a matrix cell shows that cell's images
    tab.matrix.scrollTo(tab.matrix_model.index(true, predicted))
    rect = tab.matrix.visualRect(tab.matrix_model.index(true, predicted))
    qtbot.mouseClick(tab.matrix.viewport(), Qt.MouseButton.LeftButton, pos=rect.center())
    assert tab.gallery.count() == n and all(p.true == classes[true] and p.predicted == classes[predicted]
                                            for p in tab.shown)
    assert f"{n} images of {classes[true]} predicted as {classes[predicted]}" in tab.gallery_title.text()
    qtbot.waitUntil(lambda: not tab.gallery.item(0).icon().isNull(), timeout=10_000)

    # the selected image: its classes, then Grad-CAM from a subprocess
    tab.gallery.setCurrentRow(0)
    image = tab.image.selected.path
    assert f"true <b>{classes[true]}</b>" in tab.image.details.text() and "%" in tab.image.details.text()
    tab.image.cam_button.click()
    qtbot.waitUntil(lambda: "Grad-CAM for" in tab.image.preview.toolTip(), timeout=60_000)
    assert not tab.image.preview.pixmap().isNull() and tab.image.cam_button.isEnabled()

    # exclude it: the manifest is written beside the config, the Dataset page lists it, the scan honours it
    tab.image.exclude_button.click()
    manifest_path = cfg.with_name("config.exclude.yaml")
    assert read_manifest(manifest_path).exclude == [os.path.realpath(image)]
    assert window.binder.widgets["data.exclude"].text() == str(manifest_path)
    qtbot.waitUntil(lambda: window.dataset_page.manifest_entries.count() == 1, timeout=20_000)
    assert "leaves out 1" in window.dataset_page.summary.text()
    assert "excluded from training" in tab.image.details.text()
    # relabel another image of the gallery
    tab.show_errors()
    other = next(i for i, p in enumerate(tab.shown) if p.path != image)
    tab.gallery.setCurrentRow(other)
    tab.image.relabel_choice.setCurrentText(tab.shown[other].predicted)
    tab.image.relabel_button.click()
    qtbot.waitUntil(lambda: window.dataset_page.manifest_entries.count() == 2, timeout=20_000)
    assert read_manifest(manifest_path).relabel == {os.path.realpath(tab.shown[other].path): tab.shown[other].predicted}
    # undo the exclusion on the Dataset page
    entries = window.dataset_page.manifest_entries
    next(entries.item(i) for i in range(entries.count()) if entries.item(i).text().startswith("excluded")).setSelected(True)
    window.dataset_page.undo_entry.click()
    qtbot.waitUntil(lambda: entries.count() == 1, timeout=20_000)
    assert read_manifest(manifest_path).exclude == []
    assert checksums(photos) == before  # the user's files are untouched


def test_fifty_classes_scroll_and_zoom_with_names_readable(qtbot, tmp_path):
    from app.training.results_tab import ResultsTab

    classes = [f"species_{i:02d}_with_a_long_name" for i in range(60)]
    n = 600
    labels = torch.arange(n) % 60
    logits = torch.randn(n, 60, generator=torch.Generator().manual_seed(0))
    logits[torch.arange(n), labels] += 3
    write_evaluation(tmp_path, "val", Predictions([f"/nowhere/{i}.png" for i in range(n)], labels, logits), classes)
    tab = ResultsTab()
    qtbot.addWidget(tab)
    tab.resize(1000, 640)
    tab.show()
    tab.set_model(SimpleNamespace(run=RunDir(tmp_path), best_epoch={}, start_event={}))
    tab.redraw()
    qtbot.waitUntil(lambda: tab.evaluation is not None, timeout=10_000)
    assert tab.matrix_model.rowCount() == 60
    assert tab.matrix_model.headerData(59, Qt.Orientation.Vertical) == f"{classes[59]}  59"
    assert classes[3] in tab.matrix_model.headerData(3, Qt.Orientation.Horizontal, Qt.ItemDataRole.ToolTipRole)
    tab.confusion.zoom.setValue(tab.confusion.zoom.maximum())
    qtbot.waitUntil(lambda: tab.matrix.horizontalScrollBar().maximum() > 0)  # scrolls, nothing cut off
    tab.matrix.scrollTo(tab.matrix_model.index(59, 59))
    assert tab.matrix.viewport().rect().intersects(tab.matrix.visualRect(tab.matrix_model.index(59, 59)))
    before = tab.matrix.horizontalHeader().length()
    tab.confusion.zoom.setValue(tab.confusion.zoom.minimum())  # zoomed out: the whole matrix in far less room
    assert tab.matrix.horizontalHeader().length() < 0.6 * before


def test_try_it_gives_the_command_line_s_top_1_and_names_a_non_image(qtbot, make_window, finished_run, tmp_path):
    run, photos, cfg = finished_run
    window = make_window(cfg, runs_dir=run.path.parent)
    window.run_actions.open(str(run.path))
    dialog = window.run_actions.try_it()
    assert dialog.model_source == str(run.path)
    folder = tmp_path / "mine"
    folder.mkdir()
    for p in sorted(photos.glob("*/*.png"))[::15]:
        shutil.copy(p, folder / f"{p.parent.name}-{p.name}")
    notes = tmp_path / "notes.txt"
    notes.write_text("not a picture")
    with qtbot.waitSignal(dialog.predicted, timeout=60_000) as got:
        dialog.classify([str(folder), str(notes)])
    results = got.args[0]
    readable = [r for r in results if not r["error"]]
    assert len(readable) == 8 and all(len(r["top"]) == 4 for r in readable)  # 4 classes: all of them, best first
    bad_row = next(i for i, r in enumerate(results) if r["error"])
    assert f"{notes}: cannot read image" in dialog.table.item(bad_row, 2).text()
    assert "8 image(s) classified; 1 could not be read" in dialog.status.text()
    cli = run_here("predict", run.path, *sorted(folder.iterdir()))
    expected = {line.split("\t")[0]: line.split("\t")[1] for line in cli.stdout.splitlines()}
    assert {r["path"]: r["top"][0][0] for r in readable} == expected
    dialog.close()


def test_only_images_of_the_training_folder_can_be_excluded_or_relabelled(qtbot, make_window, finished_run, shapes_dir,
                                                                          tmp_path):
    """The validation split of the training folder can be cleaned (its images are in the dataset); an evaluated
    folder outside it cannot: "Exclude from training" was offered for images it would not change."""
    run, photos, cfg = finished_run
    other = tmp_path / "elsewhere"
    shutil.copytree(shapes_dir, other)
    assert run_here("evaluate", run.path, "--data", other).returncode == 0
    window = make_window(cfg, runs_dir=run.path.parent)
    tab = open_results(qtbot, window, run)
    tab.gallery.setCurrentRow(0)
    assert tab.image.selected.path.startswith(str(photos)) and tab.image.exclude_button.isEnabled()
    index = next(i for i in range(tab.eval_choice.count()) if tab.eval_choice.itemData(i) == "elsewhere")
    assert "elsewhere" in tab.eval_choice.itemText(index), "listed by the folder it evaluated"
    tab.eval_choice.setCurrentIndex(index)
    qtbot.waitUntil(lambda: tab.evaluation is not None and tab.evaluation.name == "elsewhere", timeout=20_000)
    tab.show_cell(tab.evaluation.classes[0], tab.evaluation.classes[0])
    tab.gallery.setCurrentRow(0)
    assert tab.image.selected.path.startswith(str(other))
    assert not tab.image.exclude_button.isEnabled() and not tab.image.relabel_button.isEnabled()
    assert "not in the training folder" in tab.image.exclude_button.toolTip()
    assert tab.image.cam_button.isEnabled(), "Grad-CAM still explains it"


def test_ten_classes_in_a_narrow_pane_show_every_column_numbered(qtbot, tmp_path):
    """At 1024x700 4 of 10 confusion-matrix columns showed: names above columns widened them past the pane."""
    from app.training.results_tab import ResultsTab

    classes = [f"digit_{i}" for i in range(10)]
    labels = torch.arange(200) % 10
    logits = torch.randn(200, 10, generator=torch.Generator().manual_seed(0))
    logits[torch.arange(200), labels] += 3
    write_evaluation(tmp_path, "val", Predictions([f"/nowhere/{i}.png" for i in range(200)], labels, logits), classes)
    tab = ResultsTab()
    qtbot.addWidget(tab)
    tab.resize(700, 560)  # the Results tab's share of a 1024 px window
    tab.show()
    tab.set_model(SimpleNamespace(run=RunDir(tmp_path), best_epoch={}, start_event={}))
    tab.redraw()
    qtbot.waitUntil(lambda: tab.evaluation is not None, timeout=10_000)
    qtbot.waitUntil(lambda: tab.matrix_model.numbered, timeout=5_000)
    last = tab.matrix.visualRect(tab.matrix_model.index(9, 9))
    assert tab.matrix.viewport().rect().contains(last), "the tenth column is whole, with no scrolling"
    assert tab.matrix_model.headerData(9, Qt.Orientation.Horizontal) == "9"
    assert tab.matrix_model.headerData(9, Qt.Orientation.Vertical) == "digit_9  9"


@pytest.mark.slow
def test_label_issues_fill_the_gallery_and_one_key_decides_each(qtbot, make_window, flipped_digits_run):
    """Label issues from the Results tab: `main.py audit` in a subprocess, its suspects most likely first (the flipped
    digits among them), and E, R, K decide each one into the manifest and move on; then the outliers (the crops of a
    photograph among the digits) from what the audit kept."""
    pytest.importorskip("cleanlab", reason="pip install cleanlab (the .[dev] set-up installs it)")
    run, flipped, cfg, crops, copies = flipped_digits_run
    window = make_window(cfg, runs_dir=run.path.parent)
    tab = open_results(qtbot, window, run)
    tab.issues_button.click()
    qtbot.waitUntil(lambda: bool(tab.shown) and tab.shown[0].audit == "issue", timeout=180_000)
    assert "probably labelled wrong" in tab.gallery_title.text() and tab.gallery.currentRow() == 0
    assert sum(p.path in flipped for p in tab.shown[:10]) >= 5, "the flipped digits head the list"
    assert "given <b>" in tab.image.details.text() and "suggested <b>" in tab.image.details.text()
    first, second = tab.shown[0], tab.shown[1]
    qtbot.keyClick(tab.gallery, Qt.Key.Key_E)  # exclude, next
    qtbot.keyClick(tab.gallery, Qt.Key.Key_R)  # relabel as suggested, next
    qtbot.keyClick(tab.gallery, Qt.Key.Key_K)  # keep, next
    assert tab.gallery.currentRow() == 3
    manifest = cfg.with_name("config.exclude.yaml")
    qtbot.waitUntil(lambda: manifest.exists() and len(read_manifest(manifest).relabel) == 1, timeout=20_000)
    assert read_manifest(manifest).exclude == [os.path.realpath(first.path)]
    assert read_manifest(manifest).relabel == {os.path.realpath(second.path): second.predicted}
    tab.outliers_button.click()  # the audit kept its work: the outliers come from it
    qtbot.waitUntil(lambda: bool(tab.shown) and tab.shown[0].audit == "outlier", timeout=60_000)
    assert "far from every other" in tab.gallery_title.text() and "cosine distance" in tab.image.details.text()
    assert set(crops) <= {p.path for p in tab.shown}, "the photograph's crops among them"
    tab.gallery.setCurrentRow(len(tab.shown) - 1)  # after the far ones, the images the network is unsure of
    assert tab.shown[-1].audit == "unsure" and "no class even odds" in tab.image.details.text()
    tab.copies_button.click()  # the test images copied into training, each beside its test image
    qtbot.waitUntil(lambda: bool(tab.shown) and tab.shown[0].copy_of is not None, timeout=60_000)
    assert "of a test or validation image: a leak" in tab.gallery_title.text()
    assert "without the 30 leaked ones" in tab.gallery_title.text(), "what the leak was worth to the test score"
    shown = {p.path: p.copy_of for p in tab.shown}
    assert all(shown[c] == ("test", s) for c, (s, _) in copies.items()), "each copy beside its test image"
    qtbot.waitUntil(lambda: tab.gallery.item(0).icon().actualSize(QSize(96, 96)).width() == 96, timeout=10_000)
    qtbot.keyClick(tab.gallery, Qt.Key.Key_E)  # exclude the copy, not its test image
    qtbot.waitUntil(lambda: os.path.realpath(tab.shown[0].path) in read_manifest(manifest).exclude, timeout=20_000)
    assert tab.gallery.currentRow() == 1 and "copy of the test image" in tab.image.details.text()
    tab.side_tabs.setCurrentWidget(tab.data_map)  # the map: every image audited, a lasso, its images in the gallery
    tab.data_map.draw_button.click()
    qtbot.waitUntil(lambda: len(tab.data_map.rows) == 1681 + 150, timeout=180_000)
    legend = re.sub("<[^>]+>", "", tab.data_map.legend.text())  # as shown, without its colour markup
    assert all(f"● {digit}" in legend for digit in "0123456789"), "each class named beside its colour"
    tab.data_map.colour_by.setCurrentIndex(2)
    assert "label issue" in tab.data_map.legend.text()
    planted = {r["path"]: r for r in tab.data_map.rows if r["path"] in copies}
    assert len(planted) == 30 and {r["finding"] for r in planted.values()} == {"leak"}
    point = tab.data_map.xy[[r["path"] for r in tab.data_map.rows].index(next(iter(planted)))]
    tab.data_map.select_inside(point + np.array([[-1e-3, -1e-3], [1e-3, -1e-3], [1e-3, 1e-3], [-1e-3, 1e-3]]))
    assert next(iter(planted)) in [r["path"] for r in tab.data_map.selection()]
    tab.data_map.show_button.click()
    assert tab.side_tabs.currentIndex() == 0 and next(iter(planted)) in [p.path for p in tab.shown]
    page = window.dataset_page  # the data check's line on the Dataset page, each finding a link to its view
    page.scan()
    qtbot.waitUntil(lambda: not page.findings.isHidden(), timeout=30_000)
    assert f"The data check of run {run.name}: " in page.findings.text() and "label issue(s)" in page.findings.text()
    page.findings.linkActivated.emit(f"outliers|{run.path}")
    qtbot.waitUntil(lambda: bool(tab.shown) and tab.shown[0].audit == "outlier", timeout=60_000)
    assert window.dashboard.tabs.currentWidget() is tab


def test_number_keys_label_the_class_they_read():
    from app.dialogs.label_dialog import class_keys

    assert class_keys([str(d) for d in range(10)]) == {str(d): str(d) for d in range(10)}, "9 is nine, 0 is zero"
    assert class_keys(["cat", "dog"]) == {"1": "cat", "2": "dog"}
    assert class_keys(["0", "cat", "2", "dog"]) == {"0": "0", "2": "2", "1": "cat", "3": "dog"}
    eleven = class_keys([f"c{i:02d}" for i in range(11)])
    assert list(eleven) == list("1234567890") and "c10" not in eleven.values(), "the eleventh class: the box"


@pytest.mark.slow
def test_twenty_pool_images_labelled_by_key_then_trained_on(qtbot, make_window, flipped_digits_run, tmp_path):
    """The labelling loop: a pool of new handwritten digits (with an unreadable file and a copy of a training
    image) ordered by `main.py label`, 20 labelled through the view (keys 1-9, the class box for the tenth class),
    a hand edit of the manifest in the middle kept, a broken one refused without losing a label; then "Train
    again" starts a run whose own manifest holds the 20 additions and whose training set counts them."""
    from PIL import Image
    from sklearn.datasets import load_digits

    from app.dialogs.label_dialog import LabelDialog
    from trainer.core.events import read_events

    run, _, cfg, _, _ = flipped_digits_run
    digits, pool = load_digits(), tmp_path / "pool"
    pool.mkdir()
    shown = {}
    for i in range(5, 1797, 30):  # 60 digits, drawn at another size than the training set's
        path = pool / f"new-{i:04d}.png"
        Image.fromarray((digits.images[i] * 255 / 16).astype("uint8")).resize((36, 36), Image.BICUBIC).save(path)
        shown[str(path)] = str(digits.target[i])
    known = next((run.path.parent.parent / "digits" / "3").glob("*.png"))
    shutil.copyfile(known, pool / "seen-before.png")
    (pool / "broken.png").write_bytes(b"not an image")

    window = make_window(cfg, runs_dir=run.path.parent)
    tab = open_results(qtbot, window, run)
    tab.label_pool_button.click()
    dialog = window.findChild(LabelDialog)
    dialog.pool.setText(str(pool))
    dialog.count.setValue(20)
    dialog.find_button.click()
    qtbot.waitUntil(lambda: bool(dialog.picks), timeout=120_000)
    assert "1 already in the run's data (left out)" in dialog.status.text() and "1 unreadable" in dialog.status.text()
    assert len(dialog.picks) == 20 and {p["path"] for p in dialog.picks} <= set(shown)
    qtbot.waitUntil(lambda: len(dialog.images) == 20, timeout=20_000)  # the picks' images, read in one go
    from PySide6.QtWidgets import QPushButton
    assert [dialog.findChild(QPushButton, f"labelAs:{d}").toolTip() for d in "09"] == ["key 0", "key 9"]
    manifest = lambda: read_manifest(window.dataset_page.manifest_path)  # noqa: E731
    for n in range(20):
        digit = shown[dialog.picks[dialog.at]["path"]]
        if n == 10:  # an edit by hand while the view is open (an image left out): kept
            path = window.dataset_page.manifest_path
            raw = yaml.safe_load(open(path))
            raw["exclude"] = (raw.get("exclude") or []) + [str(known)]
            open(path, "w").write(yaml.safe_dump(raw))
        if n == 15:  # a broken edit: the label is refused, the image stays, nothing is lost
            good = open(window.dataset_page.manifest_path).read()
            open(window.dataset_page.manifest_path, "w").write(good + "add: [oops\n")
            qtbot.keyClick(dialog, Qt.Key.Key_1)
            assert "cannot update the manifest" in dialog.status.text() and dialog.at == n
            open(window.dataset_page.manifest_path, "w").write(good)
        if n == 4:  # a class name typed in the box, then Enter
            dialog.name.setFocus()
            dialog.name.setCurrentText(digit)
            qtbot.keyClick(dialog.name.lineEdit(), Qt.Key.Key_Return)
            assert "not a class" not in dialog.status.text(), "Enter labels once, with no error after it"
        else:
            qtbot.keyClick(dialog, Qt.Key.Key_0 + int(digit))  # the key of a class named by a digit is that digit
        assert f"as <b>{digit}</b>" in dialog.status.text(), "the label written is shown"
        assert dialog.at == n + 1
        assert n == 19 or not dialog.preview.pixmap().isNull(), "the next image shows at once, never the last one"
    added = manifest().add
    assert len(added) == 20 and all(added[os.path.realpath(p)] == shown[p] for p in dialog.labelled)
    assert os.path.realpath(known) in manifest().exclude, "the hand edit was kept"
    assert "nothing more in this list" in dialog.status.text()

    window.binder.widgets["train.epochs"].setValue(1)
    dialog.train_button.click()
    qtbot.waitUntil(lambda: window.runs.running and window.run_model is not None and window.run_model.run != run,
                    timeout=30_000)
    new = window.run_model.run
    qtbot.waitUntil(lambda: any(e.get("event") == "run_start" for e in read_events(new.events))
                    if new.events.exists() else False, timeout=120_000)
    start = next(e for e in read_events(new.events) if e.get("event") == "run_start")
    assert start["manifest"]["added"] == 20, start["manifest"]
    excluded = len(manifest().exclude)  # the hand edit's, and any the tests before made
    assert start["train_size"] + start["val_size"] == 1681 - excluded + 20, "the 20 new images count in training"
    assert len(read_manifest(new.manifest).add) == 20, "the new run keeps the manifest it trained with"
