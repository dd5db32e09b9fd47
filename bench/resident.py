"""Click to answer for the app's quick questions: the resident worker (warm: torch imported, asked over its pipe) side
by side with one `main.py` process per question (what the app did before), on the same questions in alternation.

Questions: describe-model resnet18 (the Model page), grad-cam of one image (Results), predict of one image (Try it),
on a small_cnn run trained here for one epoch; and the learning-rate finder's first point (the Optimizer page's Find…:
from the question to the first "lr-find: point" line, which the app draws), on the same small_cnn config.

python bench/resident.py [--repeats 5]
"""

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

from common import machine, save_result, scratch

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
from trainer.core.events import LR_POINT  # noqa: E402


class Worker:
    """`main.py resident`, spoken to as the app's client does: one JSON line a question, one a reply."""

    def __init__(self):
        self.process = subprocess.Popen([sys.executable, str(REPO / "main.py"), "resident"], stdin=subprocess.PIPE,
                                        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        assert json.loads(self.process.stdout.readline())["ready"]
        self.next = 1

    def ask(self, argv: list[str], first_point: bool = False) -> float:
        """Seconds to the answer (`first_point`: to the first learning-rate point streamed; the answer is waited for)."""
        start = time.perf_counter()
        self.process.stdin.write(json.dumps({"id": self.next, "argv": argv, "cwd": str(REPO)}) + "\n")
        self.process.stdin.flush()
        seconds = None
        while "progress" in (reply := json.loads(self.process.stdout.readline())):
            if first_point and seconds is None and reply["progress"].startswith(LR_POINT):
                seconds = time.perf_counter() - start
        seconds = seconds if seconds is not None else time.perf_counter() - start
        assert reply["id"] == self.next and reply["code"] == 0, reply["stderr"][-500:]
        self.next += 1
        return seconds

    def close(self) -> None:
        self.process.stdin.close()
        self.process.wait(30)


def one_process(argv: list[str], first_point: bool = False) -> float:
    start = time.perf_counter()
    if not first_point:
        subprocess.run([sys.executable, str(REPO / "main.py"), *argv], check=True, capture_output=True, cwd=REPO)
        return time.perf_counter() - start
    process = subprocess.Popen([sys.executable, str(REPO / "main.py"), *argv], stdout=subprocess.DEVNULL,
                               stderr=subprocess.PIPE, text=True, cwd=REPO)
    seconds = None
    for line in process.stderr:
        if seconds is None and line.startswith(LR_POINT):
            seconds = time.perf_counter() - start
    assert process.wait() == 0 and seconds is not None
    return seconds


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    from trainer.data.demo_data import write_demo_dataset

    tmp = scratch("resident")
    data = write_demo_dataset(tmp / "shapes", per_class=40, size=32, seed=0)
    config = tmp / "cfg.yaml"
    config.write_text(f"data: {{train_dir: {data}, image_size: 32, num_workers: 0}}\nmodel: {{name: small_cnn}}\n"
                      f"train: {{epochs: 1}}\n")
    run = tmp / "run"
    subprocess.run([sys.executable, str(REPO / "main.py"), "train", str(config), "--run-dir", str(run)], check=True,
                   capture_output=True)
    image = str(next(data.rglob("*.png")))
    questions = {"describe-model resnet18": ["describe-model", "resnet18"],
                 "grad-cam": ["grad-cam", str(run), image, "--out", str(tmp / "cam.png")],
                 "predict (Try it)": ["predict", str(run), image, "--json", "--top", "5"],
                 "lr-find, first point": ["lr-find", str(config), "--json", "--steps", "20"]}
    worker = Worker()
    rows = {}
    for name, argv in questions.items():
        point = argv[0] == "lr-find"
        worker.ask(argv, point)  # the first answer of each kind builds what it caches (the model, the checkpoint read)
        warm, cold = [], []
        for _ in range(args.repeats):  # alternated, so a busy moment of the machine falls on both alike
            warm.append(worker.ask(argv, point))
            cold.append(one_process(argv, point))
        rows[name] = {"resident_s": statistics.median(warm), "process_s": statistics.median(cold),
                      "ratio": statistics.median(cold) / statistics.median(warm)}
        print(f"{name:24s} resident {rows[name]['resident_s']:6.2f} s   one process {rows[name]['process_s']:6.2f} s"
              f"   x{rows[name]['ratio']:.1f}", flush=True)
    worker.close()
    save_result("resident", {"machine": machine(), "repeats": args.repeats, "rows": rows})
    return 0


if __name__ == "__main__":
    sys.exit(main())
