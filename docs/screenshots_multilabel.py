"""Screenshots of a multi-label run in the real app (issue #36), driven as a user would: mosaics of real handwritten
digits with their labels file (the tests' own builder; 5% of the images given a wrong or a missing label), chosen on
the Dataset page; a run; its mAP curve; the per-label table with one label's false positives; the audit's label
issues, its outliers and the map; a pool labelled with label sets; Try it with the run's ONNX export.

Usage: QT_QPA_PLATFORM=offscreen .venv/bin/python docs/screenshots_multilabel.py [OUT_DIR] [WxH]
(default docs/images at 1280x720; `docs/images/1024x700 1024x700` for the smallest screen the window is made for)
"""

import os
import shutil
import sys
import tempfile
from pathlib import Path

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "tests"))
sys.path.insert(0, str(REPO / "docs"))

import yaml  # noqa: E402
from PySide6.QtCore import QSettings  # noqa: E402
from PySide6.QtWidgets import QApplication  # noqa: E402
from screenshots_data import HEIGHT, WIDTH, settle, wait  # noqa: E402


def main() -> int:
    out = Path(sys.argv[1] if len(sys.argv) > 1 else REPO / "docs" / "images")
    out.mkdir(parents=True, exist_ok=True)
    from helpers import digit_mosaics, plant_label_set_errors

    from app.main_window import PAGES, MainWindow, load_style

    tmp = Path(tempfile.mkdtemp(prefix="traindeck-multilabel-shots-"))
    try:
        labels = digit_mosaics(tmp / "mosaics", 1500)
        plant_label_set_errors(labels, 0.05)
        config = tmp / "mosaics.yaml"
        config.write_text(yaml.safe_dump({
            "data": {"train_dir": str(tmp / "mosaics"), "image_size": 32, "batch_size": 64, "num_workers": 0,
                     "test_split": 0.15},
            "model": {"name": "small_cnn"}, "optimizer": {"name": "adamw", "lr": 0.003},
            "train": {"epochs": 8, "seed": 0}, "export": {"formats": ["onnx"]}}))
        app = QApplication([])
        app.setStyleSheet(load_style())
        window = MainWindow(QSettings(str(tmp / "s.ini"), QSettings.Format.IniFormat), tmp / "runs", config)
        size = sys.argv[2] if len(sys.argv) > 2 else f"{WIDTH}x{HEIGHT}"
        window.resize(*(int(v) for v in size.split("x")))
        window.show()

        def shoot(name: str, widget=None) -> None:
            settle(0.6)
            (widget or window).grab().save(str(out / f"{name}.png"))
            print("saved", out / f"{name}.png")

        page = window.dataset_page
        page.binder.widgets["data.labels"].setText(str(labels))  # as Browse… leaves it
        wait(lambda: page.scan_result is not None and "Multi-label" in page.summary.text(), 60, "the scan")
        shoot("multilabel_dataset")
        window.run_actions.start()
        wait(lambda: window.run_model is not None and window.run_model.state == "completed", 600, "the run")
        run = window.run_model.run
        window.nav.setCurrentRow(PAGES.index("Training"))
        window.dashboard.tabs.setCurrentWidget(window.dashboard.curves)
        shoot("multilabel_curves")
        tab = window.dashboard.results
        window.dashboard.tabs.setCurrentWidget(tab)
        wait(lambda: tab.pages.currentWidget() is tab.multilabel and tab.multilabel.evaluation is not None, 60,
             "the results")
        view = tab.multilabel
        view.choose("3")
        view.gallery.setCurrentRow(0)
        shoot("multilabel_results")
        view.issues_button.click()
        wait(lambda: view.issues is not None, 180, "the audit")
        wait(lambda: not view.gallery.item(0).icon().isNull(), 30, "the thumbnails")
        view.gallery.setCurrentRow(0)
        wait(lambda: not view.preview.pixmap().isNull(), 30, "the preview")
        shoot("multilabel_issues")
        view.outliers_button.click()
        wait(lambda: not view.gallery.item(0).icon().isNull(), 30, "the thumbnails")
        view.gallery.setCurrentRow(0)
        wait(lambda: not view.preview.pixmap().isNull(), 30, "the preview")
        shoot("multilabel_outliers")
        view.side_tabs.setCurrentWidget(view.data_map)
        view.data_map.colour_by.setCurrentIndex(2)  # what the audit found
        view.data_map.draw()
        wait(lambda: bool(view.data_map.rows), 180, "the map")
        shoot("multilabel_map")
        pool = digit_mosaics(tmp / "pool", 40, seed=3)
        view.pool_button.click()
        from app.dialogs.label_dialog import LabelDialog

        (labelling,) = [w for w in window.findChildren(LabelDialog) if w.isVisible()]
        labelling.pool.setText(str(pool.parent / "images"))
        labelling.count.setValue(10)
        labelling.order_pool()
        wait(lambda: bool(labelling.picks) and not labelling.preview.pixmap().isNull(), 120, "the pool")
        shoot("multilabel_label_pool", labelling)
        labelling.close()
        dialog = window.run_actions.try_it()
        dialog.resize(1000, 420)
        dialog.set_model_source(str(run.path / "exports" / "model.onnx"))
        images = sorted((tmp / "mosaics" / "images").glob("*.png"))[:6]
        dialog.classify([str(p) for p in images])
        wait(lambda: bool(dialog.results), 120, "Try it")
        shoot("multilabel_try_it", dialog)
        dialog.close()
        window._leave_running = True
        window.close()
        return 0
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
