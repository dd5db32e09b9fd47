"""This machine's facts, read with torch: GPUs, native bf16, distributed backends, Horovod (`main.py probe-devices`).

The rules that turn facts into verdicts are `trainer.device.devices`' (torch-free, shared with the app).
"""

from __future__ import annotations

import importlib.util
import time

import psutil
import torch
import torch.distributed as dist

from trainer.core.config import RunConfig
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
        t = self._me.cpu_times()
        return t.user + t.system + t.children_user + t.children_system

    def share(self) -> float:
        """The others' share of all the cores' time since this was made, 0 to 1."""
        wall0, busy0, mine0 = self._start
        wall = time.perf_counter() - wall0
        others = (self._busy() - busy0) - (self._mine() - mine0)
        return max(0.0, min(1.0, others / max(wall * (psutil.cpu_count() or 1), 1e-6)))
