"""Screenshots of every page of the real app, with a real (short) run in the dashboard.

Usage: QT_QPA_PLATFORM=offscreen .venv/bin/python docs/screenshots.py [OUT_DIR] [--size WxH]
(default docs/images at 1280x720, a laptop screen; `docs/images/1024x700 --size 1024x700` for the smallest one the
window is made for)
"""

import atexit
import os
import shutil
import sys
import tempfile
from pathlib import Path

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from PySide6.QtCore import QSettings, QTimer  # noqa: E402
from PySide6.QtWidgets import QApplication  # noqa: E402


def main() -> int:
    args = [a for a in sys.argv[1:] if not a.startswith("--size")]
    size = next((a.split("=", 1)[1] for a in sys.argv[1:] if a.startswith("--size=")), None)
    if "--size" in sys.argv:
        size = sys.argv[sys.argv.index("--size") + 1]
        args = [a for a in args if a != size]
    width, height = (int(v) for v in (size or "1280x720").split("x"))
    out = Path(args[0] if args else REPO / "docs" / "images")
    out.mkdir(parents=True, exist_ok=True)
    from app.main_window import PAGES, MainWindow, load_style
    from trainer.data.demo_data import demo_dataset_dir, ensure_demo_dataset

    ensure_demo_dataset(demo_dataset_dir())
    app = QApplication([])
    app.setStyleSheet(load_style())
    tmp = Path(tempfile.mkdtemp(prefix="traindeck-screenshots-"))
    atexit.register(shutil.rmtree, tmp, ignore_errors=True)
    window = MainWindow(QSettings(str(tmp / "s.ini"), QSettings.Format.IniFormat), tmp / "runs")
    window.resize(width, height)
    window.show()
    window.optimizer_page.groups.add_group({"pattern": "fc", "lr": 0.1})
    steps = iter([])

    def shoot(name: str, page: str) -> None:
        window.nav.setCurrentRow(PAGES.index(page))
        QTimer.singleShot(400, lambda: window.grab().save(str(out / f"{name}.png")))

    def wait_ready():
        if window.start_action.isEnabled():
            window.run_actions.start()
            QTimer.singleShot(100, wait_done)
        else:
            QTimer.singleShot(200, wait_ready)

    def wait_done():
        if window.run_model.state in ("completed", "failed", "stopped"):
            run_steps()
        else:
            QTimer.singleShot(300, wait_done)

    def run_steps():
        nonlocal steps
        steps = iter([("dataset", "Dataset"), ("model", "Model"), ("optimizer", "Optimizer"), ("device", "Device"),
                      ("advanced", "Advanced"), ("dashboard", "Training"), ("gradients", "Training"), ("results", "Training"),
                      ("lr_finder", "Optimizer"), ("resumed", "Training"),
                      ("store", "Model"), ("recipes", "Optimizer"), ("try_it", "Training"), ("export", "Runs"),
                      ("sweep", "Runs"),
                      ("queue", "Queue"), ("runs", "Runs"), ("auto", "Dataset")])
        next_shot()

    def choose_resnet18() -> None:
        page = window.model_page
        page.filter.setText("res")
        row = next(r for r in range(page.proxy.rowCount()) if page.proxy.index(r, 0).data() == "resnet18")
        page.table_view.selectRow(row)
        page.choose_from_store("resnet18")

    def when(ready, then) -> None:
        if ready():
            then()
        else:
            QTimer.singleShot(200, lambda: when(ready, then))

    def next_shot():
        try:
            name, page = next(steps)
        except StopIteration:
            QTimer.singleShot(600, app.quit)
            return
        tabs = {"dashboard": 0, "gradients": 1, "results": 2}
        if name == "sweep":  # a small grid through the queue: the runs table then has something to compare
            dialog = window.run_actions.open_sweep_dialog()
            dialog.name.setText("demo-lr")
            dialog.grid.item(0, 1).setText("0.02, 0.2")
            dialog.add_grid_row("train.epochs", "3")
            dialog.add_grid_row("model.name", "small_cnn")  # the form holds resnet18 by now: too slow for a shot
            dialog.add_grid_row("model.weights", "null")
            dialog.queued.connect(lambda _: QTimer.singleShot(300, lambda: (dialog.grab().save(str(out / "sweep.png")),
                                                                           dialog.close(), next_shot())))
            dialog.submit()
            return
        if name == "queue":  # while the sweep's runs go through the queue
            window.nav.setCurrentRow(PAGES.index(page))
            when(lambda: any(r["state"] == "running" for r in window.queue_page.rows),
                 lambda: (shoot(name, page), QTimer.singleShot(700, next_shot)))
            return
        if name == "runs":
            def runs_ready():
                window.runs_page.refresh()
                return len(window.runs_page.rows) >= 3 and all(r["status"] == "completed"
                                                                for r in window.runs_page.rows)

            def show_runs():
                window.nav.setCurrentRow(PAGES.index(page))
                window.runs_page.views.setCurrentIndex(1)
                window.runs_page.views.scatter_x.setCurrentText("optimizer.lr")
                shoot(name, page)
                QTimer.singleShot(700, next_shot)
            when(runs_ready, show_runs)
            return
        if name == "auto":  # Auto's plan for the demo data, its choices on the Dataset page (the run it starts is stopped)
            window.dataset_page.auto.minutes.setValue(0.5)
            when(lambda: not window.runs.running,
                 lambda: window.planning.auto_plan(0.5))
            when(lambda: not window.dataset_page.auto.choices.isHidden(),
                 lambda: (shoot(name, page), QTimer.singleShot(800, window.runs.stop),
                          QTimer.singleShot(1500, next_shot)))
            return
        if name in tabs:
            window.dashboard.tabs.setCurrentIndex(tabs[name])
        if name == "model":  # the store is read when the page is first shown
            window.nav.setCurrentRow(PAGES.index(page))
            when(lambda: window.model_page.store is not None,
                 lambda: (shoot(name, page), QTimer.singleShot(700, next_shot)))
            return
        if name == "store":
            when(lambda: window.model_page.store is not None, choose_resnet18)
            when(lambda: window.model_page.parameters[:1] == [("conv1.weight", 9408)],
                 lambda: (shoot(name, page), QTimer.singleShot(700, next_shot)))
            return
        if name == "lr_finder":  # the sweep's curve on the demo run's settings, its suggestion marked
            window.nav.setCurrentRow(PAGES.index(page))
            window.planning.find_lr()
            when(lambda: window.planning.lr_dialog is not None and window.planning.lr_dialog.result is not None,
                 lambda: QTimer.singleShot(300, lambda: (window.planning.lr_dialog.grab().save(str(out / "lr_finder.png")),
                                                         window.planning.lr_dialog.done(0),
                                                         QTimer.singleShot(300, next_shot))))
            return
        if name == "resumed":  # a run stopped after its third epoch and resumed: one set of curves, to its end
            window.nav.setCurrentRow(PAGES.index(page))
            window.dashboard.tabs.setCurrentIndex(0)  # the curves on show while they grow, as a user watches them
            window.run_actions.start()
            when(lambda: window.run_model is not None and len(window.run_model.val_loss) >= 3 and window.runs.running,
                 window.runs.stop)
            when(lambda: window.run_model is not None and window.run_model.state == "stopped"
                 and not window.runs.running and window.resume_action.isEnabled(),
                 window.resume_action.trigger)
            when(lambda: window.run_model is not None and window.run_model.state == "completed"
                 and window.run_model.segments > 1,
                 lambda: (window.dashboard.tabs.setCurrentIndex(0), shoot(name, page),
                          QTimer.singleShot(700, next_shot)))
            return
        if name == "results":  # the errors, one selected, with its Grad-CAM overlay
            results = window.dashboard.results
            window.dashboard.tabs.setCurrentIndex(tabs[name])
            window.nav.setCurrentRow(PAGES.index(page))

            def select_and_explain():
                if not results.gallery.count():  # nothing wrong: show the first class's images instead
                    first = results.evaluation.classes[0]
                    results.show_cell(first, first)
                results.gallery.setCurrentRow(0)
                results.image.cam_button.click()
            when(lambda: results.evaluation is not None, select_and_explain)
            when(lambda: "Grad-CAM for" in results.image.preview.toolTip(),
                 lambda: (shoot(name, page), QTimer.singleShot(700, next_shot)))
            return
        if name == "try_it":
            dialog = window.run_actions.try_it()
            dialog.resize(900, 560)
            images = sorted(demo_dataset_dir().glob("*/*.png"))[::97][:8]
            dialog.classify([str(p) for p in images] + [str(REPO / "README.md")])
            when(lambda: dialog.results and all(not dialog.table.item(r, 0).icon().isNull()
                                                for r, x in enumerate(dialog.results) if not x["error"]),
                 lambda: QTimer.singleShot(300, lambda: (dialog.grab().save(str(out / "try_it.png")), dialog.close(),
                                                         QTimer.singleShot(300, next_shot))))
            return
        if name == "export":  # the demo run as ONNX, then int8 and ExecuTorch: measured side by side
            from app.dialogs.export_dialog import ExportDialog

            dialog = ExportDialog(str(window.run_model.run.path), window)
            dialog.resize(min(900, width - 40), 500)
            dialog.show()
            formats = iter(["onnx", "onnx_int8", "executorch"])

            def export_next():
                fmt = next(formats, None)
                if fmt is None:
                    dialog.table.selectRow(1)
                    QTimer.singleShot(300, lambda: (dialog.grab().save(str(out / "export.png")), dialog.close(),
                                                    QTimer.singleShot(300, next_shot)))
                    return
                dialog.format.setCurrentIndex(dialog.format.findData(fmt))
                dialog.export()
                when(lambda: dialog.job is None, export_next)
            export_next()
            return
        if name == "recipes":
            window.optimizer_page.groups.set_groups([])
            window.optimizer_page.recipe_buttons["fine_tune"].click()
        shoot(name, page)
        QTimer.singleShot(700, next_shot)

    QTimer.singleShot(500, wait_ready)
    app.exec()
    window.shutdown()
    import os
    import signal

    from trainer.runs.queue import live_schedulers

    for pid in live_schedulers(tmp / "runs"):  # the sweep's scheduler outlives the window, as it should: end it
        os.kill(pid, signal.SIGTERM)
    print(f"screenshots in {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
