"""Everything parallel and mixed-precision, so the training loop has no `if ddp` branches.

`Strategy` owns the device, wrapping (DataParallel / DistributedDataParallel), gradient-sync
suppression during accumulation, metric all-reduce and "am I rank 0". `Precision` owns autocast,
GradScaler, backward, unscale-before-clip and the optimizer step. Native torch.amp replaces Apex AMP.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import importlib.util
import logging
import os
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import nn

from trainer.config import DeviceConfig, RunConfig
from trainer.devices import Facts, auto_precision, device_problems, resolve_backend
from trainer.optim import fill_momentum_buffers

log = logging.getLogger(__name__)


class LaunchError(RuntimeError):
    """A device / parallel setting this machine cannot run; the message says which key and why."""


def fast_gpu_math() -> None:
    """cuDNN picks the fastest convolution algorithms for the (fixed) input shapes; fp32 matmuls and
    convolutions use TF32 tensor cores where the GPU has them (Ampere and newer; 10-bit mantissa inputs)."""
    torch.backends.cudnn.benchmark = True
    torch.backends.cuda.matmul.allow_tf32 = True
    torch.backends.cudnn.allow_tf32 = True


def native_bf16(device: torch.device) -> bool:
    """Whether `device` runs bf16 convolutions and matmuls in hardware (not emulated through fp32)."""
    if device.type == "cuda":
        return torch.cuda.is_bf16_supported(including_emulation=False)
    return torch.cpu._is_avx512_bf16_supported() or torch.cpu._is_amx_tile_supported()


def machine_facts() -> Facts:
    """What this machine offers (the input of every rule in `trainer.devices`); also `main.py probe-devices`."""
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


def choose_precision(amp: str, device: torch.device) -> tuple[str, str]:
    """(fp32 | bf16 | fp16, why): `train.amp` as set, or for `auto` what this device runs natively."""
    if amp != "auto":
        return auto_precision(amp, device.type, {})
    facts = {"bf16_cuda" if device.type == "cuda" else "bf16_cpu": native_bf16(device)}
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else None
    return auto_precision(amp, device.type, facts, name)


@dataclass
class StepResult:
    """What one optimizer step did. Norms are device tensors (no host sync) when they were computed."""

    grad_norms: torch.Tensor | None = None
    total_norm: torch.Tensor | None = None
    nonfinite: torch.Tensor | None = None  # 1.0 when the gradients were not finite (fp32/bf16, norms computed)
    skipped: bool = False  # a non-finite step skipped under train.on_nonfinite: skip (decided on every rank alike)
    first_nonfinite: str | None = None  # the first parameter with a non-finite gradient, when skipped


class Precision:
    """Autocast, loss scaling and the whole optimizer step for one precision: fp32, bf16 or fp16 (+ GradScaler).

    The step (as in Fabric's precision plugins): unscale, gradient norms, clipping, the non-finite policy,
    optimizer step, scaler update. Under fp16 a non-finite gradient is a loss-scale overflow, which is how
    dynamic loss scaling finds its scale: the scaler skips that step and lowers the scale; it is never
    divergence. Under fp32/bf16 it is divergence (stop) or a skipped step (skip), decided from the
    all-reduced flag so every rank takes the same decision.
    """

    def __init__(self, amp: str, strategy: Strategy):
        self.amp = amp
        self.dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(amp)
        device = strategy.device
        self.device_type = device.type
        self.strategy = strategy
        self.scaler = torch.amp.GradScaler(device.type, enabled=amp == "fp16")
        self._buffers_filled = False

    @property
    def scaled(self) -> bool:
        """Whether gradients are loss-scaled (fp16): non-finite ones are then overflows, not divergence."""
        return self.scaler.is_enabled()

    def autocast(self):
        if self.dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(self.device_type, dtype=self.dtype)

    def backward(self, loss: torch.Tensor) -> None:
        self.scaler.scale(loss).backward()

    def step(self, optimizer, monitor, *, clip: float | None, need_norms: bool, on_nonfinite: str,
             inspect: Callable[[StepResult], None] | None = None) -> StepResult:
        """Unscale, norms, clip, non-finite policy, step, update, zero_grad.

        Skip mode checks the gradients every step (a host sync, agreed by all ranks) and skips a non-finite step;
        otherwise `result.nonfinite` is left on the device for the loop's stop decision at the next log step (fp16's
        scaler skips overflowing steps itself). `inspect` sees the final gradients just before the optimizer step
        (statistics, histograms).
        """
        self.strategy.synchronize_grads(optimizer)
        if self.scaled:
            self.scaler.unscale_(optimizer)
        result = StepResult()
        skip = on_nonfinite == "skip"
        if need_norms or clip or skip:
            result.grad_norms = monitor.grad_norms()
            result.total_norm = torch.linalg.vector_norm(result.grad_norms)
            if not self.scaled:
                result.nonfinite = (~torch.isfinite(result.total_norm)).float()
        if skip and result.nonfinite is not None:
            if self.strategy.all_reduce_max(result.nonfinite.reshape(1)).item():  # host sync: skip mode, every step
                result.skipped = True
                result.first_nonfinite = monitor.first_nonfinite()
                optimizer.zero_grad(set_to_none=True)
                return result
        if clip:
            torch.nn.utils.clip_grads_with_norm_(monitor.params, clip, result.total_norm)
        if inspect is not None:
            inspect(result)
        if self.scaled and not self._buffers_filled:  # a skipped first step must not leave garbage momentum
            fill_momentum_buffers(optimizer)
            self._buffers_filled = True
        with self.strategy.grads_synchronized(optimizer):
            self.scaler.step(optimizer)  # fp16: skipped when the unscaled gradients overflowed
        self.scaler.update()
        optimizer.zero_grad(set_to_none=True)
        return result

    def state_dict(self) -> dict:
        return self.scaler.state_dict() if self.scaler.is_enabled() else {}

    def load_state_dict(self, state: dict) -> None:
        if state and self.scaler.is_enabled():
            self.scaler.load_state_dict(state)


class Strategy:
    """Single process on one device (CPU or one GPU); the base of the parallel strategies."""

    rank = 0
    local_rank = 0
    world_size = 1

    def __init__(self, cfg: DeviceConfig):
        self.cfg = cfg
        if cfg.type == "cuda":
            self.device = torch.device("cuda", cfg.gpus[0])
            torch.cuda.set_device(self.device)
        else:
            self.device = torch.device("cpu")

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def description(self) -> str:
        return f"{self.device}"

    def wrap(self, model: nn.Module) -> nn.Module:
        return model.to(self.device)

    @staticmethod
    def unwrap(model: nn.Module) -> nn.Module:
        while isinstance(model, (nn.DataParallel, nn.parallel.DistributedDataParallel)):
            model = model.module
        return model

    def wrap_optimizer(self, optimizer: torch.optim.Optimizer, model: nn.Module,
                       accum_steps: int) -> torch.optim.Optimizer:
        """The optimizer the loop steps (Horovod wraps it to average gradients)."""
        return optimizer

    def broadcast_initial_state(self, model: nn.Module, optimizer: torch.optim.Optimizer) -> None:
        """Make every rank start from rank 0's parameters and optimizer state (DDP does it when wrapping)."""

    def no_sync(self, model: nn.Module, accumulating: bool):
        return contextlib.nullcontext()

    def synchronize_grads(self, optimizer: torch.optim.Optimizer) -> None:
        """Finish averaging gradients before they are read (unscale, norms, clipping)."""

    def grads_synchronized(self, optimizer: torch.optim.Optimizer):
        """Context for the optimizer step once `synchronize_grads` has run (it must not average again)."""
        return contextlib.nullcontext()

    def all_reduce_sum(self, tensor: torch.Tensor) -> torch.Tensor:
        return tensor

    def all_reduce_max(self, tensor: torch.Tensor) -> torch.Tensor:
        return tensor

    def barrier(self) -> None:
        pass

    def shutdown(self) -> None:
        pass

    def sample_gpus(self) -> list[dict]:
        """Memory (and utilisation where NVML is there) of every visible GPU; [] on CPU."""
        if self.device.type != "cuda":
            return []
        gpus = []
        for i in range(torch.cuda.device_count()):
            free, total = torch.cuda.mem_get_info(i)
            try:
                util = torch.cuda.utilization(i)
            except Exception:  # noqa: BLE001 - needs pynvml; report memory alone
                util = None
            gpus.append({"index": i, "memory_used_mb": (total - free) / 2**20, "memory_total_mb": total / 2**20,
                         "utilization": util})
        return gpus


class DataParallelStrategy(Strategy):
    def wrap(self, model: nn.Module) -> nn.Module:
        model = model.to(self.device)
        return nn.DataParallel(model, device_ids=self.cfg.gpus, output_device=self.cfg.gpus[0])

    @property
    def description(self) -> str:
        return f"DataParallel over cuda:{','.join(map(str, self.cfg.gpus))}"


class DistributedStrategy(Strategy):
    """DistributedDataParallel, one process per device; rank and world size from the launcher."""

    def __init__(self, cfg: DeviceConfig, rank: int, world_size: int, local_rank: int, init_method: str,
                 sync_batchnorm: bool):
        self.cfg = cfg
        self.rank, self.world_size, self.local_rank = rank, world_size, local_rank
        self.sync_batchnorm = sync_batchnorm
        if cfg.type == "cuda":
            gpu = cfg.gpus[local_rank % len(cfg.gpus)]
            self.device = torch.device("cuda", gpu)
            torch.cuda.set_device(self.device)
        else:
            self.device = torch.device("cpu")
        backend = resolve_backend(cfg.backend, cfg.type)
        dist.init_process_group(backend, init_method=init_method, rank=rank, world_size=world_size,
                                timeout=dt.timedelta(seconds=cfg.timeout_s))
        log.info("rank %d/%d joined (%s, %s)", rank, world_size, backend, self.device)

    @property
    def description(self) -> str:
        return f"DDP x{self.world_size} ({dist.get_backend()}, {self.device.type})"

    def wrap(self, model: nn.Module) -> nn.Module:
        if self.sync_batchnorm:
            model = nn.SyncBatchNorm.convert_sync_batchnorm(model)
        model = model.to(self.device)
        ids = [self.device.index] if self.device.type == "cuda" else None
        return nn.parallel.DistributedDataParallel(model, device_ids=ids)

    def no_sync(self, model: nn.Module, accumulating: bool):
        return model.no_sync() if accumulating else contextlib.nullcontext()

    def all_reduce_sum(self, tensor: torch.Tensor) -> torch.Tensor:
        dist.all_reduce(tensor, op=dist.ReduceOp.SUM)
        return tensor

    def all_reduce_max(self, tensor: torch.Tensor) -> torch.Tensor:
        dist.all_reduce(tensor, op=dist.ReduceOp.MAX)
        return tensor

    def barrier(self) -> None:
        dist.barrier()

    def shutdown(self) -> None:
        if dist.is_initialized():
            dist.destroy_process_group()


def check_device(cfg: RunConfig) -> None:
    """Refuse, before anything starts, settings this machine cannot run (the rules: `trainer.devices`)."""
    problems = device_problems(cfg, machine_facts())
    if problems:
        raise LaunchError("; ".join(problems))


class HorovodStrategy(Strategy):
    """Horovod (the seeds' fifth form): `hvd.init`, ranks from horovodrun, `hvd.DistributedOptimizer` averaging
    gradients, rank 0's parameters and optimizer state broadcast before the first step."""

    def __init__(self, cfg: DeviceConfig):
        import horovod.torch as hvd

        self.hvd = hvd
        self.cfg = cfg
        hvd.init()
        self.rank, self.world_size, self.local_rank = hvd.rank(), hvd.size(), hvd.local_rank()
        if cfg.type == "cuda":
            self.device = torch.device("cuda", cfg.gpus[self.local_rank % len(cfg.gpus)])
            torch.cuda.set_device(self.device)
        else:
            self.device = torch.device("cpu")
        log.info("rank %d/%d joined (horovod, %s)", self.rank, self.world_size, self.device)

    @property
    def description(self) -> str:
        return f"Horovod x{self.world_size} ({self.device.type})"

    def wrap_optimizer(self, optimizer, model, accum_steps):
        return self.hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters(),
                                             backward_passes_per_step=accum_steps)

    def broadcast_initial_state(self, model, optimizer) -> None:
        self.hvd.broadcast_parameters(model.state_dict(), root_rank=0)
        self.hvd.broadcast_optimizer_state(optimizer, root_rank=0)

    def synchronize_grads(self, optimizer) -> None:
        optimizer.synchronize()

    def grads_synchronized(self, optimizer):
        return optimizer.skip_synchronize()

    def all_reduce_sum(self, tensor: torch.Tensor) -> torch.Tensor:
        return self.hvd.allreduce(tensor, op=self.hvd.Sum)

    def all_reduce_max(self, tensor: torch.Tensor) -> torch.Tensor:
        return self.hvd.allreduce(tensor, op=self.hvd.Max)

    def barrier(self) -> None:
        self.hvd.barrier()

    def shutdown(self) -> None:
        self.hvd.shutdown()


def make_strategy(cfg: RunConfig) -> Strategy:
    """The strategy for this process, from the config and (for ddp) the launcher's environment."""
    dev = cfg.device
    if dev.parallel == "dp":
        return DataParallelStrategy(dev)
    if dev.parallel == "ddp" and dev.launcher == "horovod":
        return HorovodStrategy(dev)
    if dev.parallel == "ddp":
        rank = int(os.environ["RANK"])
        world = int(os.environ["WORLD_SIZE"])
        local = int(os.environ.get("LOCAL_RANK", rank))
        init = os.environ.get("TRAINDECK_INIT_METHOD", "env://")
        return DistributedStrategy(dev, rank, world, local, init, cfg.train.sync_batchnorm)
    return Strategy(dev)
