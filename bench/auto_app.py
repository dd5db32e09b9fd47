"""The Dataset page's Auto, clicked as a user would (issue #68): the real window (offscreen), a folder of colour JPEGs
(train/val/test), a budget, one click; the seconds from the click to the run's end (its test set and ONNX export
done), and what the plan table shows (every candidate with its epochs).

    python bench/auto_app.py --minutes 2 [--busy 6]

The run's own files give the answer: its run_end event's time, against the click's.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from auto import DATA, Hog  # noqa: E402
from common import machine, photo_jpegs, save_result  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--minutes", type=float, default=2.0)
    parser.add_argument("--busy", type=int, default=0, help="spinning processes through the whole of it")
    parser.add_argument("--name", default="auto_app")
    args = parser.parse_args()
    from PySide6.QtCore import QSettings
    from PySide6.QtWidgets import QApplication

    from app.main_window import MainWindow

    folder = photo_jpegs(DATA / "photo_jpegs")
    app = QApplication.instance() or QApplication([])
    with tempfile.TemporaryDirectory(prefix="bench-auto-app-") as tmp:
        settings = QSettings(str(Path(tmp) / "settings.ini"), QSettings.Format.IniFormat)
        window = MainWindow(settings, Path(tmp) / "runs", None)
        window.show()
        window.binder.widgets["data.train_dir"].setText(str(folder))
        panel = window.dataset_page.auto

        def wait(condition, seconds: float) -> bool:
            deadline = time.time() + seconds
            while not condition() and time.time() < deadline:
                app.processEvents()
                time.sleep(0.02)
            return condition()

        assert wait(lambda: window.dataset_page.scan_result is not None and panel.button.isEnabled(), 120)
        panel.minutes.setValue(args.minutes)
        hog = Hog(args.busy)
        hog.start()
        try:
            clicked = time.time()
            panel.button.click()
            assert wait(lambda: window.run_model is not None and window.run_model.run is not None, 600), \
                panel.status.text()
            run = window.run_model.run
            ended = wait(lambda: window.run_model.ended, 60 * args.minutes * 4)
            seen = time.time()
        finally:
            hog.stop()
        events = [json.loads(line) for line in run.events.open()]
        end = next(e for e in reversed(events) if e["event"] == "run_end")
        rows = [tuple(panel.choices.item(i, j).text() for j in range(3)) for i in range(panel.choices.rowCount())]
        candidates = [r for r in rows if r[0].startswith("candidate")]
        test = next((e for e in events if e["event"] == "test"), {})
        result = {"minutes": args.minutes, "busy": args.busy, "ended": ended, "click_to_run_end_s": end["time"] - clicked,
                  "click_to_seen_s": seen - clicked, "test_acc": test.get("accuracy"),
                  "exported": any(e["event"] == "export" for e in events), "candidates": candidates,
                  "model": next(r[1] for r in rows if r[0] == "model.name"),
                  "size": next(r[1] for r in rows if r[0] == "data.image_size")}
        window.process.stop()
        window._leave_running = True
        window.close()
    print(json.dumps(result, indent=1))
    save_result(args.name, {"machine": machine(), "result": result})
    print(f"{machine()}; {args.busy} spinning processes; click to run_end {result['click_to_run_end_s']:.1f} s of "
          f"{60 * args.minutes:.0f} s ({result['click_to_run_end_s'] / (60 * args.minutes):.3f}x); "
          f"{len(candidates)} candidates in the plan table; test {result['test_acc']}")


if __name__ == "__main__":
    main()
