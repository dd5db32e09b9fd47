"""Everything parallel, so the training loop has no `if ddp` branches.

`Strategy` owns the device, wrapping (DataParallel / DistributedDataParallel / Horovod), gradient-sync
suppression during accumulation, metric all-reduce and "am I rank 0". Mixed precision and the optimizer step are
`trainer.device.precision`'s; the machine's facts are `trainer.device.machine`'s.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import logging
import os

import torch
import torch.distributed as dist
from torch import nn

from trainer.core.config import DeviceConfig, RunConfig
from trainer.core.errors import InputError
from trainer.device.devices import resolve_backend

log = logging.getLogger(__name__)


class LaunchError(InputError, RuntimeError):
    """A device / parallel setting this machine cannot run; the message says which key and why."""


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
            self.device = torch.device(cfg.type)  # cpu, or mps: Apple's GPU

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

    def share_buffers(self, model: nn.Module) -> None:
        """Give every rank rank 0's buffers (BatchNorm's running statistics), which the checkpoint holds: each rank
        updated its own on its last batches, so without this the ranks would validate slightly different networks."""

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

    def leave_together(self) -> None:
        """End the collective part of a run on every rank at once: each waits for the others, then tears the group
        down. A rank that tore its group down while another still used it could abort at exit (gloo, seen once in
        CI: "terminate called without an active exception"); rank 0's finishing work needs no other rank."""
        self.barrier()
        self.shutdown()

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
        timeout = dt.timedelta(seconds=cfg.timeout_s)
        restart = int(os.environ.get("TORCHELASTIC_RESTART_COUNT") or 0)
        if restart and init_method == "env://":
            # torchrun keeps one store across its restarts of the ranks (device.max_restarts): the last group's
            # addresses are still in it, and a rank that read one before its peer wrote the new one connected to a
            # process that is gone (gloo: "Connection refused"). Each restart keeps its own keys.
            store, rank, world_size = next(dist.rendezvous(init_method, rank, world_size, timeout=timeout))
            dist.init_process_group(backend, store=dist.PrefixStore(f"traindeck/restart_{restart}", store),
                                    rank=rank, world_size=world_size, timeout=timeout)
        else:
            dist.init_process_group(backend, init_method=init_method, rank=rank, world_size=world_size,
                                    timeout=timeout)
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

    def share_buffers(self, model: nn.Module) -> None:
        for buffer in model.buffers():
            dist.broadcast(buffer, src=0)

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

    def share_buffers(self, model) -> None:
        buffers = dict(model.named_buffers())
        if buffers:
            self.hvd.broadcast_parameters(buffers, root_rank=0)

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
