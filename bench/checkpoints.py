"""Checkpoints every epoch against none: the epoch time (wall time between consecutive `epoch` events, so it
includes the save) with a checkpoint written every epoch in the background (now), written synchronously (before),
and not written at all, side by side, interleaved. The last two patch the loop's save in the benchmark's process
only (TrainDeck itself always checkpoints).

python bench/checkpoints.py [--repeats 3] [--epochs 5] [--model resnet18]
"""

import argparse
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from common import REPO, bench_config, bench_datasets, machine, save_result

from trainer.events import read_events  # noqa: E402 - after common puts the repo on the path

VARIANTS = {"every epoch, background writer": "",
            "every epoch, synchronous write": "functools.partial(original, writer=None)",
            "no checkpoints": "lambda folder, state, **k: folder / 'not-written.pt'"}
RUNNER = """
import functools, sys
sys.path.insert(0, sys.argv[1])
import trainer.loop
from trainer import cli
original = trainer.loop.save_checkpoint
if sys.argv[2]:
    trainer.loop.save_checkpoint = eval(sys.argv[2])
sys.exit(cli.main(["train", sys.argv[3], "--run-dir", sys.argv[4], "--set", "checkpoint.every_epochs=1"]))
"""


def epoch_gaps(run_dir: Path) -> list[float]:
    """Seconds between consecutive epoch events, the first epoch (warm-up) and the last (final save) left out."""
    times = [e["time"] for e in read_events(run_dir / "events.jsonl") if e["event"] == "epoch"]
    gaps = [b - a for a, b in zip(times, times[1:])]
    return gaps[:-1] if len(gaps) > 2 else gaps


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--epochs", type=int, default=5)
    parser.add_argument("--model", default="resnet18")
    args = parser.parse_args()
    data, size = bench_datasets()["small PNG @32px"]
    tmp = Path(tempfile.mkdtemp())
    config = bench_config(tmp / "cfg.yaml", data, size, args.model, 64, args.epochs)
    results: dict[str, list[float]] = {name: [] for name in VARIANTS}
    sizes = {}
    for r in range(args.repeats):
        for i, (name, patch) in enumerate(VARIANTS.items()):  # interleaved
            run_dir = tmp / f"{r}-{i}"
            done = subprocess.run([sys.executable, "-c", RUNNER, str(REPO), patch, str(config), str(run_dir)],
                                  capture_output=True, text=True, cwd=REPO)
            if done.returncode != 0:
                raise RuntimeError(done.stderr[-3000:])
            results[name].append(statistics.median(epoch_gaps(run_dir)))
            sizes[name] = max((p.stat().st_size for p in (run_dir / "checkpoints").glob("ckpt-*.pt")), default=0)
    medians = {name: statistics.median(v) for name, v in results.items()}
    base = medians["no checkpoints"]
    ratio = medians["every epoch, background writer"] / base
    lines = [f"{args.model}, small PNG @32px, batch 64, {args.epochs} epochs, {args.repeats} interleaved repeats; "
             f"checkpoint {sizes['every epoch, background writer'] / 1e6:.0f} MB; {machine()}"]
    for name, values in results.items():
        lines.append(f"  {name:32s} epoch {medians[name]:.3f} s (per repeat: {', '.join(f'{v:.3f}' for v in values)})")
    lines.append(f"  epoch time, background writer / no checkpoints: {ratio:.3f}; synchronous / no checkpoints: "
                 f"{medians['every epoch, synchronous write'] / base:.3f}")
    text = "\n".join(lines)
    print(text)
    save_result("checkpoints", {"results": results, "medians": medians, "ratio": ratio, "summary": text,
                                "checkpoint_bytes": sizes})
    return 0


if __name__ == "__main__":
    sys.exit(main())
