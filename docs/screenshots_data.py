"""Screenshots of the data views (issue #35) in the real app, driven as a user would: a run on real handwritten digits
with label errors, copies and odd images planted (the tests' own folder builders), its audit, a few fixes, 20 pool
images labelled, a second run trained on them, and the Runs page showing what the two runs' data differ by.

Usage: QT_QPA_PLATFORM=offscreen .venv/bin/python docs/screenshots_data.py [OUT_DIR] (default docs/images; 1280x720)
Takes about four minutes on a 2-core CPU (two short training runs and the audit).
"""

import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "tests"))

import yaml  # noqa: E402
from PySide6.QtCore import QSettings, Qt  # noqa: E402
from PySide6.QtGui import QColor, QPainter  # noqa: E402
from PySide6.QtTest import QTest  # noqa: E402
from PySide6.QtWidgets import QApplication  # noqa: E402

WIDTH, HEIGHT = 1280, 720


def wait(ready, timeout: float = 600, what: str = "") -> None:
    """Let the app work until `ready()` (the GUI thread keeps running: this only pumps its events)."""
    end = time.monotonic() + timeout
    while not ready():
        if time.monotonic() > end:
            raise SystemExit(f"gave up waiting for {what or ready}")
        QApplication.processEvents()
        time.sleep(0.05)


def settle(seconds: float = 0.5) -> None:
    wait(lambda end=time.monotonic() + seconds: time.monotonic() > end)


def build_folders(tmp: Path) -> tuple[Path, dict[str, str]]:
    """The tests' digits (5% flipped, four photo crops, 150 moved to test/ and 30 copied back), a config for them,
    and a pool of 60 new digits (path -> the digit shown)."""
    from helpers import digits_with_flipped_labels, photo_crops_among, split_off_test_with_copies
    from PIL import Image
    from sklearn.datasets import load_digits

    flipped = digits_with_flipped_labels(tmp / "digits", 0.05)
    photo_crops_among(tmp / "digits", 4)
    split_off_test_with_copies(tmp / "digits", tmp / "test", per_class=15, copies=30, keep=flipped)
    config = tmp / "digits.yaml"
    config.write_text(yaml.safe_dump({
        "data": {"train_dir": str(tmp / "digits"), "test_dir": str(tmp / "test"), "image_size": 32, "batch_size": 64,
                 "num_workers": 0},
        "model": {"name": "small_cnn"}, "optimizer": {"name": "adamw", "lr": 0.003}, "train": {"epochs": 4, "seed": 0}}))
    digits, pool, shown = load_digits(), tmp / "pool", {}
    pool.mkdir()
    for i in range(5, 1797, 30):
        path = pool / f"new-{i:04d}.png"
        Image.fromarray((digits.images[i] * 255 / 16).astype("uint8")).resize((36, 36), Image.BICUBIC).save(path)
        shown[str(path)] = str(digits.target[i])
    return config, shown


def main() -> int:
    out = Path(sys.argv[1] if len(sys.argv) > 1 else REPO / "docs" / "images")
    out.mkdir(parents=True, exist_ok=True)
    from app.dialogs.label_dialog import LabelDialog
    from app.main_window import PAGES, MainWindow, load_style

    tmp = Path(tempfile.mkdtemp(prefix="traindeck-data-shots-"))
    try:
        config, shown = build_folders(tmp)
        app = QApplication([])
        app.setStyleSheet(load_style())
        window = MainWindow(QSettings(str(tmp / "s.ini"), QSettings.Format.IniFormat), tmp / "runs", config)
        window.resize(WIDTH, HEIGHT)
        window.show()

        def shoot(name: str, over=None) -> None:
            settle(0.6)
            picture = window.grab()
            if over is not None:  # a dialog as it stands over the window, the window dimmed behind it
                painter = QPainter(picture)
                painter.fillRect(picture.rect(), QColor(0, 0, 0, 90))
                top = over.grab()
                painter.drawPixmap((picture.width() - top.width()) // 2, (picture.height() - top.height()) // 2, top)
                painter.end()
            picture.save(str(out / f"{name}.png"))
            print("saved", out / f"{name}.png")

        def train_and_wait(start) -> None:
            before = window.run_model.run if window.run_model else None
            start()
            wait(lambda: window.run_model is not None and window.run_model.run != before, 60, "the run to start")
            wait(lambda: window.run_model.state in ("completed", "failed", "stopped"), 900, "the run to end")
            assert window.run_model.state == "completed", window.run_model.state

        train_and_wait(window.start_run)
        first = window.run_model.run
        window.run_actions.open(str(first.path))
        tab = window.dashboard.results
        window.dashboard.tabs.setCurrentWidget(tab)
        wait(lambda: tab.evaluation is not None, 60, "the run's evaluation")

        tab.issues_button.click()
        wait(lambda: bool(tab.shown) and tab.shown[0].audit == "issue", 600, "the audit")
        QTest.keyClick(tab.gallery, Qt.Key.Key_R)  # two fixes: relabel as suggested, exclude
        QTest.keyClick(tab.gallery, Qt.Key.Key_E)
        shoot("label_issues")
        tab.outliers_button.click()
        wait(lambda: bool(tab.shown) and tab.shown[0].audit == "outlier", 60, "the outliers")
        tab.gallery.setCurrentRow(next(i for i, p in enumerate(tab.shown) if p.audit == "unsure"))
        tab.gallery.scrollToItem(tab.gallery.currentItem())
        shoot("outliers")
        tab.copies_button.click()
        wait(lambda: bool(tab.shown) and tab.shown[0].copy_of is not None, 60, "the copies")
        shoot("copies")
        tab.side_tabs.setCurrentWidget(tab.data_map)
        tab.data_map.draw_button.click()
        wait(lambda: len(tab.data_map.rows) > 0, 600, "the map")
        tab.data_map.colour_by.setCurrentIndex(2)
        shoot("data_map")

        window.nav.setCurrentRow(PAGES.index("Dataset"))
        wait(lambda: window.dataset_page.findings.isVisible(), 120, "the data check line")
        shoot("data_check")
        print(window.dataset_page.findings.text())

        window.nav.setCurrentRow(PAGES.index("Training"))
        window.dashboard.tabs.setCurrentWidget(tab)
        tab.label_pool_button.click()
        dialog = window.findChild(LabelDialog)
        dialog.pool.setText(str(tmp / "pool"))
        dialog.count.setValue(20)
        dialog.find_button.click()
        wait(lambda: bool(dialog.picks), 300, "the pool's order")
        dialog.activateWindow()  # its keys are the dialog's shortcuts: it must be the active window, as on a desktop
        wait(dialog.isActiveWindow, 10, "the labelling view to be active")
        for n in range(20):
            start = time.monotonic()
            wait(lambda: not dialog.preview.pixmap().isNull(), 60, "the image to show")
            print(f"image {n + 1}: shown after {time.monotonic() - start:.2f} s")
            if n == 5:
                shoot("label_next", over=dialog)
            digit = shown[dialog.picks[dialog.at]["path"]]
            if digit == "9":  # the tenth class: its name in the box
                dialog.name.setFocus()
                dialog.name.setCurrentText("9")
                QTest.keyClick(dialog.name.lineEdit(), Qt.Key.Key_Return)
            else:
                QTest.keyClick(dialog, Qt.Key.Key_0 + int(digit) + 1)  # key 1 is class "0"
            if dialog.at != n + 1:
                raise SystemExit(f"image {n + 1} was not labelled: {dialog.status.text()}")
        train_and_wait(dialog.train_button.click)

        window.nav.setCurrentRow(PAGES.index("Runs"))
        page = window.runs_page

        def both_runs() -> bool:
            page.refresh()  # the table is read on a thread: give it a second
            settle(1.0)
            return len(page.rows) == 2 and all(r["status"] == "completed" for r in page.rows)
        wait(both_runs, 60, "the Runs page")
        page.table.selectAll()
        page._compare()  # the two runs' curves side by side
        shoot("runs_data_changes")
        window._leave_running = True
        window.close()
        return 0
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
