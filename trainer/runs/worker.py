"""Entry point of one training process: `python -m trainer.runs.worker RUN_DIR [--resume]`.

Started by `main.py train` (in-process for single-device runs), by torchrun or by mp.spawn.
"""

import argparse
import sys

from trainer.core.system import hold_preempt_signal, ignore_preempt_signal

hold_preempt_signal()  # before torch is imported: SLURM's warning meanwhile is kept for the run (and ends nothing)

from trainer.train.engine import run_worker  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m trainer.runs.worker")
    parser.add_argument("run_dir")
    parser.add_argument("--resume", action="store_true")
    args = parser.parse_args(argv)
    try:
        return run_worker(args.run_dir, args.resume)
    finally:
        ignore_preempt_signal()  # the rank is done: a warning now ends nothing (nor the interpreter's exit)


if __name__ == "__main__":
    sys.exit(main())
