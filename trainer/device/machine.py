"""This machine's facts, read with torch: GPUs, native bf16, distributed backends, Horovod (`main.py probe-devices`).

The rules that turn facts into verdicts are `trainer.device.devices`' (torch-free, shared with the app).
"""

from __future__ import annotations

import contextlib
import importlib.util
import math
import time

import psutil
import torch
import torch.distributed as dist

from trainer.core import clock
from trainer.core.config import RunConfig
from trainer.device import mps
from trainer.device.devices import Facts, device_problems
from trainer.device.precision import native_bf16
from trainer.device.strategy import LaunchError


def fast_gpu_math() -> None:
    """cuDNN picks the fastest convolution algorithms for the (fixed) input shapes; fp32 matmuls and
    convolutions use TF32 tensor cores where the GPU has them (Ampere and newer; 10-bit mantissa inputs)."""
    torch.backends.cudnn.benchmark = True
    torch.backends.cuda.matmul.allow_tf32 = True
    torch.backends.cudnn.allow_tf32 = True


def machine_facts() -> Facts:
    """What this machine offers (the input of every rule in `trainer.device.devices`); also `main.py probe-devices`."""
    gpus = []
    if torch.cuda.is_available():
        for i in range(torch.cuda.device_count()):
            props = torch.cuda.get_device_properties(i)
            gpus.append({"index": i, "name": props.name, "memory_gb": round(props.total_memory / 2**30, 1)})
    return {
        "gpus": gpus,
        "bf16_cuda": bool(gpus) and native_bf16(torch.device("cuda", 0)),
        "bf16_cuda_supported": bool(gpus) and torch.cuda.is_bf16_supported(),
        "bf16_cpu": native_bf16(torch.device("cpu")),
        "backends": {"gloo": dist.is_gloo_available(), "nccl": dist.is_nccl_available() and bool(gpus),
                     "mpi": dist.is_mpi_available()},
        "horovod": importlib.util.find_spec("horovod") is not None,
        **mps.facts(),
        "torch": torch.__version__,
    }


def check_device(cfg: RunConfig) -> None:
    """Refuse, before anything starts, settings this machine cannot run (the rules: `trainer.device.devices`)."""
    problems = device_problems(cfg, machine_facts())
    if problems:
        raise LaunchError("; ".join(problems))




class OtherLoad:
    """How much of this machine's CPU other programs used from now until `share()`: the machine's busy time less this
    process's own (and its children's), over the wall time of all its cores. Auto reads it around its speed probe: a
    probe on a busy machine reads slow, and the plan says so."""

    def __init__(self):
        self._me = psutil.Process()
        self._start = (time.perf_counter(), self._busy(), self._mine())

    def _busy(self) -> float:
        t = psutil.cpu_times()
        return t.user + t.system + getattr(t, "nice", 0.0) + getattr(t, "irq", 0.0) + getattr(t, "softirq", 0.0)

    def _mine(self) -> float:
        """This process's CPU time, its reaped children's and its live ones' (data-loading workers)."""
        t = self._me.cpu_times()
        live = 0.0
        for child in self._me.children(recursive=True):
            try:
                c = child.cpu_times()
                live += c.user + c.system
            except psutil.Error:
                pass  # gone meanwhile: its time is in children_user once reaped
        return t.user + t.system + t.children_user + t.children_system + live

    def share(self) -> float:
        """The others' share of all the cores' time since this was made, 0 to 1 (a simulated device's own figure)."""
        simulated = clock.other_load()
        if simulated is not None:
            return simulated
        wall0, busy0, mine0 = self._start
        wall = time.perf_counter() - wall0
        others = (self._busy() - busy0) - (self._mine() - mine0)
        return max(0.0, min(1.0, others / max(wall * (psutil.cpu_count() or 1), 1e-6)))


def threads_left(full: int, others: float) -> int:
    """torch threads for a process that may use `full`: as many as the cores less those other programs keep busy
    (`others`, in cores, rounded), at least one."""
    return max(1, min(full, (psutil.cpu_count() or 1) - math.floor(others + 0.5)))


@contextlib.contextmanager
def threads_for(load: OtherLoad):
    """torch's threads fitted (`threads_left`) to the other programs' load measured by `load` since it was made,
    inside the block; as they were after it. Yields the others' cores."""
    full = torch.get_num_threads()
    others = load.share() * (psutil.cpu_count() or 1)
    torch.set_num_threads(threads_left(full, others))
    try:
        yield others
    finally:
        torch.set_num_threads(full)


CPU_THREADS_EVERY_S = 5.0  # how often CpuThreads looks at the other programs' load


class CpuThreads:
    """torch's compute threads of a one-process CPU run, fitted to the cores other programs leave it (device.
    share_cpu). Every parallel operation waits for its slowest thread, so one thread sharing its core with another
    program slows every step of all of them: on 2 cores one spinning process made training 4-8x slower (issue
    #34). Checked every CPU_THREADS_EVERY_S: as many threads as cores less those the others kept busy (rounded), at
    least one and at most the run's own; back up when they are gone."""

    def __init__(self, threads: int, every_s: float = CPU_THREADS_EVERY_S):
        self.full, self.every_s = threads, every_s
        self.fitted = threads  # the count the last check chose
        self._load, self._since = OtherLoad(), time.monotonic()

    def check(self) -> tuple[int, int, float] | None:
        """(threads before, threads now, cores the other programs used) when it changed the thread count."""
        if time.monotonic() - self._since < self.every_s:
            return None
        others = self._load.share() * (psutil.cpu_count() or 1)
        self._load, self._since = OtherLoad(), time.monotonic()
        want = threads_left(self.full, others)
        now = torch.get_num_threads()
        if want == now:
            return None
        torch.set_num_threads(want)
        self.fitted = want
        return now, want, others
