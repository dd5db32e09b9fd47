"""The trainer's clock: what train.budget, train.replan, the first-epoch checks and Auto's probe read. Torch-free.

On a real run it is the wall clock. With `TRAINDECK_SIMULATED_DEVICE` set (the tests, a benchmark of the planning
alone) it is a simulated one: it stands still while the process works and moves only by what the work would cost on
the device described there, so every decision made from time (the epochs planned and re-planned, where the budget
ends a run, the annealing, which network Auto's probe finds fits) is the same on any machine, busy or quiet. The
events' `time` fields are on the same clock, so a test reads the trainer's own decisions from its events.

The description is JSON:

    {"s_per_mpixel": {"small_cnn": 2.0, "resnet18": 20.0, "*": 5.0},   # a training image's seconds per megapixel
     "eval_share": 0.3,      # a validation image costs this share of a training one
     "other_load": 0.0,      # the share of the CPU other programs use (what Auto's probe reads)
     "startup_s": 0.0,       # a process's own start (imports, the model built)
     "sigterm_at_s": 5.0}    # a stop (SIGTERM to this process) when the clock has gone this far: Stop pressed at a
                             # point of the run's own time, not of the machine's

A probe made slow on purpose (`TRAINDECK_PROBE_BUSY_S`) is charged to the clock instead of slept.
"""

from __future__ import annotations

import json
import os
import signal
import time

SIMULATED_ENV = "TRAINDECK_SIMULATED_DEVICE"


class SimulatedDevice:
    """The costs of `TRAINDECK_SIMULATED_DEVICE`, and the clock that sums them."""

    def __init__(self, spec: dict):
        rates = spec.get("s_per_mpixel") or {}
        self.rates = {str(k): float(v) for k, v in rates.items()}
        self.eval_share = float(spec.get("eval_share", 0.3))
        self.other_load = float(spec.get("other_load", 0.0))
        self.start = self.now = time.time() + float(spec.get("startup_s", 0.0))
        self.sigterm_at = spec.get("sigterm_at_s")

    def advance(self, seconds: float) -> None:
        self.now += seconds
        if self.sigterm_at is not None and self.now - self.start >= float(self.sigterm_at):
            self.sigterm_at = None  # once
            os.kill(os.getpid(), signal.SIGTERM)

    def image_s(self, model: str, pixels: int) -> float:
        rate = self.rates.get(model, self.rates.get("*", 1.0))
        return rate * pixels / 1e6


_simulated: tuple[str, SimulatedDevice] | None = None


def simulated() -> SimulatedDevice | None:
    """The simulated device of this process's environment, or None on a real run (read when the variable changes, so
    one test process can run tests with and without it)."""
    global _simulated
    text = os.environ.get(SIMULATED_ENV)
    if not text:
        return None
    if _simulated is None or _simulated[0] != text:
        try:
            spec = json.loads(text)
        except ValueError as e:
            raise ValueError(f"{SIMULATED_ENV}: not JSON ({e})") from e
        _simulated = (text, SimulatedDevice(spec if isinstance(spec, dict) else {}))
    return _simulated[1]


def now() -> float:
    """Seconds since the epoch: the wall clock, or the simulated device's."""
    device = simulated()
    return device.now if device is not None else time.time()


_command_start: float | None = None  # main.py's first line, when this process is a command of main.py


def mark_command_start(wall_time: float) -> None:
    """main.py, first thing: a command's budget (`main.py auto --minutes`) counts from here, the imports included."""
    global _command_start
    _command_start = wall_time


def command_started() -> float:
    """When this command started: main.py's first line on a real run, or now for a command run inside a process
    doing other work (a test calling the command line, the resident worker). The simulated clock starts now."""
    if simulated() is None and _command_start is not None:
        return min(_command_start, time.time())
    return now()


def charge_images(model: str, images: int, height: int, width: int, evaluating: bool = False) -> None:
    """What `images` training (or validation) images of `model` at height x width cost the simulated device; nothing
    on a real run, whose clock moves by itself."""
    device = simulated()
    if device is not None:
        share = device.eval_share if evaluating else 1.0
        device.advance(images * device.image_s(model, height * width) * share)


def charge_seconds(seconds: float) -> bool:
    """Move the simulated clock by `seconds` of other work (a probe made slow on purpose); False on a real run."""
    device = simulated()
    if device is None:
        return False
    device.advance(seconds)
    return True


def other_load() -> float | None:
    """The simulated share of the CPU other programs use, or None on a real run (measure it)."""
    device = simulated()
    return device.other_load if device is not None else None
