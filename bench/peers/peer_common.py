"""Shared by the peer adapters of bench/auto.py (run in the peers' own environment, without TrainDeck)."""

import argparse
import json
import time
from pathlib import Path


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    parser.add_argument("--data", required=True, help="a folder with train/ val/ test/")
    parser.add_argument("--minutes", type=float, required=True)
    parser.add_argument("--size", type=int, required=True)
    parser.add_argument("--work", required=True)
    parser.add_argument("--out", required=True)
    return parser.parse_args()


def epochs_for(budget_s: float, epoch_s: float, spent_s: float = 0.0) -> int:
    """The epochs a user would pick after timing one: 90% of what is left of the budget."""
    return max(1, int((budget_s - spent_s) * 0.9 // epoch_s))


def write(out: str, **result) -> None:
    Path(out).write_text(json.dumps(result))


class Clock:
    def __init__(self):
        self.start = time.time()

    def elapsed(self) -> float:
        return time.time() - self.start
