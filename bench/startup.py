"""Start-up: from `python main.py` to the window shown (and whether torch was loaded by then), and from pressing
Start to the first training step plotted on the dashboard, with what the trainer reported in between.

Start is pressed in four launches per repeat: as soon as the window allows it ("at once", before the app's standby
trainer has finished its imports) and after --think seconds (a user choosing settings first; by then the standby is
ready and the run is handed to it), each with the standby trainer and without it (TRAINDECK_STANDBY=0: a fresh
trainer process at Start, as before).

python bench/startup.py [--repeats 5] [--think 12]   (offscreen unless DISPLAY/QT_QPA_PLATFORM say otherwise)
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

from common import machine, save_result, scratch

REPO = Path(__file__).resolve().parent.parent
SHOWN = r"""
import sys, time
t0 = float(sys.argv[1])
from PySide6.QtCore import QTimer
from PySide6.QtWidgets import QApplication
import app.main_window as mw
original_show = mw.MainWindow.show
def show(self):
    original_show(self)
    QApplication.processEvents()
    print("SHOWN", time.time() - t0, "torch" in sys.modules, flush=True)
    QTimer.singleShot(0, QApplication.instance().quit)
mw.MainWindow.show = show
sys.argv = ["main.py", "--runs-dir", sys.argv[2]]
import main
main.main()
"""

# Press Start (as soon as the window allows it, but not before THINK seconds) and time the first plotted step; the
# trainer is stopped after.
FIRST_STEP = r"""
import json, sys, time
launched, think = time.time(), float(sys.argv[2])
from PySide6.QtCore import QTimer
from PySide6.QtWidgets import QApplication
import app.window.run_actions as ra
marks = {}
original_start = ra.RunActions.start
def start_run(self):
    if not self.window.start_action.isEnabled() or time.time() < launched + think:
        QTimer.singleShot(50, lambda: start_run(self))
        return
    marks["start"] = time.time()
    original_start(self)
    model = self.runs.model
    model.preparing.connect(lambda e: marks.setdefault("first_prepare", time.time()))
    model.runStarted.connect(lambda e: marks.setdefault("run_start", time.time()))
    def check():
        x, _ = self.window.dashboard.curves.raw_loss.getData()
        if x is not None and len(x):
            marks["plotted"] = time.time()
            print("MARKS", json.dumps({k: v - marks["start"] for k, v in marks.items()}), flush=True)
            self.runs.stop()
            QTimer.singleShot(3000, QApplication.instance().quit)
        else:
            QTimer.singleShot(10, check)
    check()
ra.RunActions.start = start_run
sys.argv = ["main.py", "--runs-dir", sys.argv[1], "--autostart"]
import main
main.main()
"""


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--think", type=float, default=12.0, help="seconds before Start in the second launch")
    args = parser.parse_args()
    env = dict(os.environ)
    env.setdefault("QT_QPA_PLATFORM", "offscreen")
    runs = str(scratch("td-startup-runs-"))
    times, torch_loaded = [], []
    variants = {(think, standby): [] for think in (0, args.think) for standby in ("1", "0")}
    for _ in range(args.repeats):
        t0 = time.time()
        out = subprocess.run([sys.executable, "-c", SHOWN, str(t0), runs], capture_output=True, text=True, cwd=REPO,
                             env=env, timeout=60)
        line = next(line for line in out.stdout.splitlines() if line.startswith("SHOWN"))
        times.append(float(line.split()[1]))
        torch_loaded.append(line.split()[2] == "True")
        for (think, standby), marks in variants.items():
            out = subprocess.run([sys.executable, "-c", FIRST_STEP, runs, str(think)], capture_output=True, text=True,
                                 cwd=REPO, env=dict(env, TRAINDECK_STANDBY=standby), timeout=180)
            line = next((line for line in out.stdout.splitlines() if line.startswith("MARKS")), None)
            if line is None:
                raise SystemExit(f"the launch (think {think} s, standby {standby}) plotted no step:\n{out.stderr[-3000:]}")
            marks.append(json.loads(line.split(" ", 1)[1]))
        print(json.dumps({"shown_s": times[-1], **{f"think {k[0]:g} s, standby {k[1]}": v[-1]
                                                   for k, v in variants.items()}}), flush=True)
    result = {"shown_s": times, "torch_loaded_at_show": any(torch_loaded), "think_s": args.think,
              "after_start": {f"think {k[0]:g} s, standby {k[1]}": v for k, v in variants.items()},
              "machine": machine(), "display": env["QT_QPA_PLATFORM"] if "DISPLAY" not in env else env["DISPLAY"]}
    save_result("startup", result)
    print(f"\nmachine: {result['machine']}")
    print(f"window shown: median {statistics.median(times):.2f} s ({min(times):.2f}–{max(times):.2f}); "
          f"torch loaded by then: {any(torch_loaded)}")
    for (think, standby), marks in variants.items():
        label = (f"Start {'at once' if not think else f'after {think:g} s'}, "
                 f"{'standby trainer' if standby == '1' else 'fresh trainer (TRAINDECK_STANDBY=0)'}")
        # a mark a launch missed (run_start arriving before its signal was connected) is left out of its median
        keys = dict.fromkeys(k for f in marks for k in f)
        med = {k: statistics.median(f[k] for f in marks if k in f) for k in keys}
        spread = {k: (min(f[k] for f in marks if k in f), max(f[k] for f in marks if k in f)) for k in keys}
        print(f"{label} (medians): " + ", ".join(f"{k} {v:.2f} s ({spread[k][0]:.2f}–{spread[k][1]:.2f})"
                                                  for k, v in med.items()))


if __name__ == "__main__":
    main()
