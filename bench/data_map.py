"""The map of the images at 20,000 points (issue #35): is it smooth? The Results tab's map widget (app.widgets.data_map_view)
in a 1280x720 window, offscreen: the time to show the points, and for each of 100 hovers (a mouse move over a random
point) the time until the widget has repainted (the hover's lookup, its text, a synchronous repaint).

    QT_QPA_PLATFORM=offscreen python bench/data_map.py --points 20000

The points: 20 clusters of 1,000 in two dimensions (what a projection of 20 classes looks like), each with a class
and a finding, as map.csv would hold them.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

import numpy as np
from common import REPO, machine, save_result

sys.path.insert(0, str(REPO))
os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")


def rows_like_a_map(points: int, seed: int = 0) -> list[dict]:
    rng = np.random.default_rng(seed)
    centres = rng.uniform(-50, 50, size=(20, 2))
    findings = ["", "", "", "", "", "", "", "label issue", "outlier", "copy"]
    return [{"path": f"/data/{i % 20}/{i:06d}.png", "split": "train", "label": str(i % 20), "suggested": str(i % 20),
             "x": float(centres[i % 20, 0] + rng.normal(0, 3)), "y": float(centres[i % 20, 1] + rng.normal(0, 3)),
             "finding": findings[i % 10]} for i in range(points)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--points", type=int, default=20000)
    parser.add_argument("--hovers", type=int, default=100)
    args = parser.parse_args()
    from PySide6.QtCore import QPointF
    from PySide6.QtWidgets import QApplication

    from app.widgets.data_map_view import DataMap

    app = QApplication([])
    view = DataMap()
    view.resize(1280, 720)
    view.show()
    app.processEvents()
    rows = rows_like_a_map(args.points)
    start = time.perf_counter()
    view.show_rows(rows, "bench")
    view.repaint()
    app.processEvents()
    shown_ms = 1000 * (time.perf_counter() - start)
    recolour = []
    for by in (1, 2, 0):
        start = time.perf_counter()
        view.colour_by.setCurrentIndex(by)
        view.repaint()
        recolour.append(1000 * (time.perf_counter() - start))
    rng = np.random.default_rng(1)
    hovers = []
    for i in rng.integers(0, len(rows), args.hovers):
        scene = view.box.mapViewToScene(QPointF(rows[i]["x"], rows[i]["y"]))
        start = time.perf_counter()
        points = view.scatter.pointsAt(view.scatter.mapFromScene(scene))
        view._hover(view.scatter, points, None)
        view.repaint()
        app.processEvents()
        hovers.append(1000 * (time.perf_counter() - start))
    result = {"points": args.points, "shown_ms": shown_ms, "recolour_ms": recolour,
              "hover_median_ms": statistics.median(hovers), "hover_max_ms": max(hovers),
              "hover_p95_ms": float(np.percentile(hovers, 95)), "machine": machine()}
    save_result("data_map", result)
    print(f"{args.points} points: shown in {shown_ms:.0f} ms; recoloured in {', '.join(f'{t:.0f}' for t in recolour)} "
          f"ms; hover to repaint: median {result['hover_median_ms']:.1f} ms, 95th percentile "
          f"{result['hover_p95_ms']:.1f} ms, max {result['hover_max_ms']:.1f} ms ({args.hovers} hovers)")
    print(machine())


if __name__ == "__main__":
    main()
