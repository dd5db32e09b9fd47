"""Ultralytics' classifier training as its users run it: YOLO("yolo11n-cls.yaml") from scratch, train(time=hours)
(its own time budget: after the first epoch it re-plans the epochs and the schedule to fit), for bench/auto.py.
Scored on test/ with its best.pt (chosen on val/) and last.pt."""

import csv
import os

os.environ.setdefault("YOLO_OFFLINE", "1")

from peer_common import Clock, parse_args, write  # noqa: E402
from ultralytics import YOLO  # noqa: E402


def main() -> None:
    args = parse_args()
    clock = Clock()
    model = YOLO("yolo11n-cls.yaml")
    model.train(data=args.data, epochs=1000, time=args.minutes / 60, imgsz=args.size, batch=64, device="cpu",
                workers=2, pretrained=False, amp=False, plots=False, project=args.work, name="run", exist_ok=True,
                verbose=False, seed=0)
    train_s = clock.elapsed()
    weights = os.path.join(args.work, "run", "weights")
    scores = {}
    for which in ("best", "last"):
        metrics = YOLO(os.path.join(weights, f"{which}.pt")).val(data=args.data, split="test", imgsz=args.size,
                                                                  batch=64, device="cpu", plots=False, verbose=False)
        scores[which] = float(metrics.top1)
    with open(os.path.join(args.work, "run", "results.csv")) as f:
        rows = list(csv.DictReader(f))
    write(args.out, best_acc=scores["best"], final_acc=scores["last"], epochs=len(rows), train_s=train_s,
          model="yolo11n-cls", size=args.size,
          epoch_end_s=[round(float(r["time"]), 1) for r in rows if r.get("time")])  # its own clock, from its start


if __name__ == "__main__":
    main()
