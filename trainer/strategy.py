"""Everything parallel and mixed-precision, so the training loop has no `if ddp` branches.

`Strategy` owns the device, wrapping (DataParallel / DistributedDataParallel), gradient-sync
suppression during accumulation, metric all-reduce and "am I rank 0". `Precision` owns autocast,
GradScaler, backward, unscale-before-clip and the optimizer step. Native torch.amp replaces Apex AMP.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import logging
import os

import torch
import torch.distributed as dist
from torch import nn

from trainer.config import DeviceConfig, RunConfig

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


def choose_precision(amp: str, device: torch.device) -> tuple[str, str]:
    """(fp32 | bf16 | fp16, why): `train.amp` as set, or for `auto` what this device runs natively."""
    if amp != "auto":
        return {"none": "fp32"}.get(amp, amp), f"train.amp is {amp}"
    where = torch.cuda.get_device_name(device) if device.type == "cuda" else "this CPU"
    if native_bf16(device):
        return "bf16", f"auto: {where} runs bf16 natively"
    return "fp32", f"auto: {where} has no native bf16"


class Precision:
    """Autocast, loss scaling and the optimizer step for one precision: none (fp32), bf16 or fp16."""

    def __init__(self, amp: str, device: torch.device):
        self.amp = amp
        self.dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(amp)
        self.device_type = device.type
        self.scaler = torch.amp.GradScaler(device.type, enabled=amp == "fp16")

    def autocast(self):
        if self.dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(self.device_type, dtype=self.dtype)

    def backward(self, loss: torch.Tensor) -> None:
        self.scaler.scale(loss).backward()

    def unscale(self, optimizer) -> None:
        """Before clipping or reading gradients: make them true gradients again (fp16)."""
        if self.scaler.is_enabled():
            self.scaler.unscale_(optimizer)

    def step(self, optimizer) -> None:
        self.scaler.step(optimizer)
        self.scaler.update()

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

    def no_sync(self, model: nn.Module, accumulating: bool):
        return contextlib.nullcontext()

    def all_reduce_sum(self, tensor: torch.Tensor) -> torch.Tensor:
        return tensor

    def all_reduce_max(self, tensor: torch.Tensor) -> torch.Tensor:
        return tensor

    def barrier(self) -> None:
        pass

    def shutdown(self) -> None:
        pass


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
        backend = resolve_backend(cfg)
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


def resolve_backend(cfg: DeviceConfig) -> str:
    if cfg.backend != "auto":
        return cfg.backend
    return "nccl" if cfg.type == "cuda" else "gloo"


def check_device(cfg: RunConfig) -> None:
    """Refuse, before anything starts, settings this machine cannot run."""
    dev = cfg.device
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            raise LaunchError("device.type: cuda, but no CUDA GPU is available here; use cpu")
        count = torch.cuda.device_count()
        bad = [g for g in dev.gpus if g >= count]
        if bad:
            raise LaunchError(f"device.gpus: {bad} do not exist (this machine has {count} GPU(s): 0..{count - 1})")
        if dev.parallel == "dp" and len(dev.gpus) > count:
            raise LaunchError(f"device.gpus: dp asks for {len(dev.gpus)} GPUs, this machine has {count}")
    if cfg.train.amp == "bf16" and dev.type == "cuda" and not torch.cuda.is_bf16_supported():
        raise LaunchError("train.amp: bf16 is not supported by this GPU; use fp16")
    if dev.parallel == "ddp":
        backend = resolve_backend(dev)
        available = {"gloo": dist.is_gloo_available, "nccl": dist.is_nccl_available, "mpi": dist.is_mpi_available}
        if not available[backend]():
            raise LaunchError(f"device.backend: {backend} is not available in this PyTorch build")
        if dev.launcher == "horovod":
            try:
                import horovod.torch  # noqa: F401
            except ImportError as e:
                raise LaunchError("device.launcher: horovod is not installed (pip install 'horovod[pytorch]', "
                                  "which needs a compiler and MPI or Gloo); use torchrun or spawn") from e
            raise LaunchError("device.launcher: horovod runs are not supported yet; use torchrun or spawn")


def make_strategy(cfg: RunConfig) -> Strategy:
    """The strategy for this process, from the config and (for ddp) the launcher's environment."""
    dev = cfg.device
    if dev.parallel == "dp":
        return DataParallelStrategy(dev)
    if dev.parallel == "ddp":
        rank = int(os.environ["RANK"])
        world = int(os.environ["WORLD_SIZE"])
        local = int(os.environ.get("LOCAL_RANK", rank))
        init = os.environ.get("TRAINDECK_INIT_METHOD", "env://")
        return DistributedStrategy(dev, rank, world, local, init, cfg.train.sync_batchnorm)
    return Strategy(dev)
