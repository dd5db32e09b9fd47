"""Starting the desktop app: `python main.py [--config FILE] [--runs-dir DIR] [--autostart]`.

Nothing here imports torch: the window is up before any training code is loaded.
"""

from __future__ import annotations

import argparse
import gc
import logging
import os
import sys
from pathlib import Path

from trainer.rundir import default_runs_dir

STANDBY_DELAY_MS = 3000  # after the window shows: its own start-up jobs first (measured in bench/startup.py)


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python main.py", description="TrainDeck desktop app")
    parser.add_argument("--config", type=Path, help="open with this YAML config loaded")
    parser.add_argument("--runs-dir", type=Path, help="where runs are written and listed (default ./runs)")
    parser.add_argument("--autostart", action="store_true", help="start training right away")
    return parser.parse_args(argv)


def quiet_garbage_collector() -> None:
    """Exempt everything built at start-up (Qt wrappers, pyqtgraph, modules) from Python's cyclic garbage
    collector: a full collection over them took ~80 ms, a visible stall, every time one ran during a run."""
    gc.collect()
    gc.freeze()


def run_app(argv: list[str]) -> int:
    args = parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s", datefmt="%H:%M:%S")
    from PySide6.QtCore import QSettings, QTimer
    from PySide6.QtWidgets import QApplication

    from app.background import run_in_thread
    from app.main_window import MainWindow, app_icon, load_style
    from trainer.demo_data import ensure_demo_dataset
    from trainer.launch import REPO_ROOT

    app = QApplication.instance() or QApplication(sys.argv[:1])
    app.setOrganizationName("TrainDeck")
    app.setApplicationName("TrainDeck")
    app.setWindowIcon(app_icon())
    app.setStyleSheet(load_style())
    demo = REPO_ROOT / "demo_data"
    writing_demo = not (demo / ".complete").exists()
    window = MainWindow(QSettings(), args.runs_dir or default_runs_dir(), args.config,
                        hold_scan="Writing the demo dataset…" if writing_demo else None)
    window.show()
    quiet_garbage_collector()
    if os.environ.get("TRAINDECK_STANDBY", "1") != "0":
        # A trainer that imports torch while the user chooses, so Start is quicker; started once the window's own
        # start-up jobs (device probe, model description) have had the CPU, not in their way.
        QTimer.singleShot(STANDBY_DELAY_MS, lambda: window.isVisible() and window.runs.process.keep_standby(
            str(REPO_ROOT)))

    app.aboutToQuit.connect(window.shutdown)

    def demo_ready(_):
        window.state_label.setText("Ready: the demo dataset is selected; press Start")
        window.dataset_page.release()  # scanned once complete: no "only one class folder" from a half-written one
        if args.autostart:
            QTimer.singleShot(500, window.start_run)

    if writing_demo:
        window.state_label.setText("Writing the demo dataset…")
        run_in_thread(lambda: ensure_demo_dataset(demo), demo_ready)
    elif args.autostart:
        QTimer.singleShot(500, window.start_run)
    return app.exec()
