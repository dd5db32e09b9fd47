"""Starting the desktop app: `python main.py [--config FILE] [--runs-dir DIR] [--autostart]`.

Nothing here imports torch: the window is up before any training code is loaded.
"""

from __future__ import annotations

import argparse
import gc
import importlib
import logging
import os
import sys
from pathlib import Path

STANDBY_DELAY_MS = 3000  # after the window shows: its own start-up jobs first (measured in bench/startup.py)


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python main.py", description="TrainDeck desktop app")
    parser.add_argument("--config", type=Path, help="open with this YAML config loaded")
    parser.add_argument("--runs-dir", type=Path, help="where runs are written and listed (default: the folder "
                        "chosen on the Runs page last time, else runs/ in TrainDeck's data folder)")
    parser.add_argument("--autostart", action="store_true", help="start training right away")
    return parser.parse_args(argv)


# What Qt's xcb platform plugin loads (Debian/Ubuntu package: library). Qt's own message names only the first it
# misses, and not always the right one (libxcb-cursor0 is loaded at run time).
XCB_LIBRARIES = {"libxcb-icccm4": "libxcb-icccm.so.4", "libxcb-keysyms1": "libxcb-keysyms.so.1",
                 "libxcb-cursor0": "libxcb-cursor.so.0", "libxcb-image0": "libxcb-image.so.0",
                 "libxcb-render-util0": "libxcb-render-util.so.0", "libxcb-shape0": "libxcb-shape.so.0",
                 "libxcb-randr0": "libxcb-randr.so.0", "libxcb-xkb1": "libxcb-xkb.so.1",
                 "libxkbcommon-x11-0": "libxkbcommon-x11.so.0", "libegl1": "libEGL.so.1"}


def missing_gui_packages() -> list[str]:
    """The Debian/Ubuntu packages whose libraries Qt's xcb plugin needs and cannot load here (Linux on X11 only)."""
    import ctypes

    if not sys.platform.startswith("linux") or os.environ.get("QT_QPA_PLATFORM", "xcb").split(":")[0] != "xcb":
        return []
    missing = []
    for package, library in XCB_LIBRARIES.items():
        try:
            ctypes.CDLL(library)
        except OSError:
            missing.append(package)
    return missing


def quiet_garbage_collector() -> None:
    """Exempt everything built at start-up (Qt wrappers, pyqtgraph, modules) from Python's cyclic garbage
    collector: a full collection over them took ~80 ms, a visible stall, every time one ran during a run."""
    gc.collect()
    gc.freeze()


def run_app(argv: list[str]) -> int:
    args = parse_args(argv)
    missing = missing_gui_packages()
    if missing:
        print(f"error: the window cannot open: Qt needs libraries this system lacks. Install them with:\n"
              f"  sudo apt-get install {' '.join(missing)}\n(headless use needs none: python main.py --help)",
              file=sys.stderr)
        return 2
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s", datefmt="%H:%M:%S")
    from PySide6.QtCore import QSettings, QTimer
    from PySide6.QtWidgets import QApplication

    from app.jobs.background import run_in_thread
    from app.main_window import MainWindow, app_icon, load_style
    from app.state.runs_folder import SETTING, RunsFolder
    from trainer.data.demo_data import demo_dataset_dir, ensure_demo_dataset
    from trainer.runs.launch import REPO_ROOT

    app = QApplication.instance() or QApplication(sys.argv[:1])
    app.setOrganizationName("TrainDeck")
    app.setApplicationName("TrainDeck")
    app.setWindowIcon(app_icon())
    app.setStyleSheet(load_style())
    demo = demo_dataset_dir()
    writing_demo = not (demo / ".complete").exists()
    settings = QSettings()
    window = MainWindow(settings, RunsFolder.at_start(args.runs_dir, settings.value(SETTING)).path, args.config,
                        hold_scan="Writing the demo dataset…" if writing_demo else None)
    window.show()
    quiet_garbage_collector()
    # pyqtgraph (the plots) is imported off the GUI thread while the user looks at the first page: the window shows
    # without it, and the first chart does not stall the window for its import
    run_in_thread(lambda: importlib.import_module("pyqtgraph"), lambda _: None, lambda _: None, priority=-1)
    if os.environ.get("TRAINDECK_STANDBY", "1") != "0":
        # A trainer that imports torch while the user chooses, so Start is quicker; started once the window's own
        # start-up jobs (device probe, model description) have had the CPU, not in their way.
        QTimer.singleShot(STANDBY_DELAY_MS, lambda: window.isVisible() and window.runs.process.keep_standby(
            str(REPO_ROOT)))

    app.aboutToQuit.connect(window.shutdown)

    def demo_ready(_):
        window.status.state_label.setText("Ready: the demo dataset is selected; press Start")
        window.dataset_page.release()  # scanned once complete: no "only one class folder" from a half-written one
        if args.autostart:
            QTimer.singleShot(500, window.run_actions.start)

    if writing_demo:
        window.status.state_label.setText("Writing the demo dataset…")
        run_in_thread(lambda: ensure_demo_dataset(demo), demo_ready)
    elif args.autostart:
        QTimer.singleShot(500, window.run_actions.start)
    return app.exec()
