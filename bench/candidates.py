"""From-scratch networks measured as Auto's candidate before one becomes it (issue #46): Auto on a folder of real
photographs with its from-scratch candidates replaced by one network (`TRAINDECK_AUTO_SCRATCH`), which it plans,
probes at each size, sweeps the learning rate of and trains within the budget like any candidate; Ultralytics'
yolo11n-cls beside it as the reference (its own time budget).

    python bench/candidates.py --minutes 5 --networks default resnet9 small_cnn mobilenet_v3_small \
        bench/candidates_nets.py:ResNet9W24 ultralytics --peers-python /path/to/venv/bin/python

`default` is Auto's own candidates. Results in bench/results/candidates.json.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path

from auto import DATA, run_auto, run_peer
from common import MORE_PHOTOS, REPO, SCIKIT_IMAGE_PHOTOS, SCIKIT_LEARN_PHOTOS, machine, photo_jpegs, photos, save_result


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--minutes", type=float, default=5)
    parser.add_argument("--networks", nargs="+", required=True)
    parser.add_argument("--peers-python", default=sys.executable)
    parser.add_argument("--name", default="candidates")
    parser.add_argument("--data", default="photos12", choices=("photos12", "jpegs"), help="jpegs: colour JPEGs of "
                        "mixed sizes (200x150 to 640x480), train/val/test (issue #68)")
    args = parser.parse_args()
    folder = photo_jpegs(DATA / "photo_jpegs") if args.data == "jpegs" else photos(
        DATA / "auto-photos12", per_class=(400, 60, 100), names=SCIKIT_IMAGE_PHOTOS + SCIKIT_LEARN_PHOTOS + MORE_PHOTOS)
    results = []
    for network in args.networks:
        print(f"{network}, {args.minutes:g} min ...", flush=True)
        with tempfile.TemporaryDirectory(prefix="bench-candidates-") as tmp:
            if network == "ultralytics":
                r = run_peer(args.peers_python, "ultralytics", folder, args.minutes, 96, Path(tmp))
            else:
                os.environ.pop("TRAINDECK_AUTO_SCRATCH", None)
                if network != "default":
                    os.environ["TRAINDECK_AUTO_SCRATCH"] = str(REPO / network) if ".py:" in network else network
                r = run_auto(folder, args.minutes, Path(tmp))
        r["network"] = network
        print("   ", json.dumps(r), flush=True)
        results.append(r)
        save_result(args.name, {"machine": machine(), "minutes": args.minutes, "results": results})
    print(f"\n{machine()}, {args.data}, {args.minutes:g} min")
    print("| network | chosen @ px | epochs | test top-1 best / final | ended |")
    print("|---|---|---|---|---|")
    for r in results:
        if "error" in r:
            print(f"| {r['network']} | failed: {r['error']} |")
            continue
        print(f"| {r['network']} | {r.get('model')} @ {r.get('size')} | {r.get('epochs')} | "
              f"{100 * r['best_acc']:.1f} / {100 * r['final_acc']:.1f} | {r.get('ended') or 'its epochs'} |")


if __name__ == "__main__":
    main()
