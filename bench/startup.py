"""Time from `python main.py` to the window shown, and whether torch was loaded by then.

python bench/startup.py [--repeats 5]   (offscreen unless DISPLAY/QT_QPA_PLATFORM say otherwise)
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
PROBE = r"""
import sys, time
t0 = float(sys.argv[1])
from PySide6.QtCore import QObject, QEvent, QTimer
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


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    env = dict(os.environ)
    env.setdefault("QT_QPA_PLATFORM", "offscreen")
    times, torch_loaded = [], []
    for _ in range(args.repeats):
        t0 = time.time()
        out = subprocess.run([sys.executable, "-c", PROBE, str(t0), "/tmp/td-startup-runs"], capture_output=True,
                             text=True, cwd=REPO, env=env, timeout=60)
        line = next(line for line in out.stdout.splitlines() if line.startswith("SHOWN"))
        times.append(float(line.split()[1]))
        torch_loaded.append(line.split()[2] == "True")
    print(json.dumps({"median_s": statistics.median(times), "min_s": min(times), "max_s": max(times),
                      "torch_loaded_at_show": any(torch_loaded)}))


if __name__ == "__main__":
    main()
