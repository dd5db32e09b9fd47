"""Stand-in for `horovod.torch` (see the package docstring)."""

import contextlib
import os

import torch
import torch.distributed as dist

Average, Sum, Max = "Average", "Sum", "Max"


def _record(what: str) -> None:
    path = os.environ.get("HOROVOD_STANDIN_LOG")
    if path:
        with open(path, "a") as f:
            f.write(f"{os.environ.get('HOROVOD_RANK', '?')} {what}\n")


def init() -> None:
    dist.init_process_group("gloo", init_method="env://", rank=int(os.environ["HOROVOD_RANK"]),
                            world_size=int(os.environ["HOROVOD_SIZE"]))
    _record("init")


def rank() -> int:
    return dist.get_rank()


def size() -> int:
    return dist.get_world_size()


def local_rank() -> int:
    return int(os.environ["HOROVOD_LOCAL_RANK"])


def allreduce(tensor, op=Average, name=None):
    out = tensor.detach().clone()
    dist.all_reduce(out, op=dist.ReduceOp.MAX if op == Max else dist.ReduceOp.SUM)
    return out / size() if op == Average else out


def broadcast_parameters(params, root_rank: int) -> None:
    items = params.items() if isinstance(params, dict) else params
    for _, tensor in items:
        dist.broadcast(tensor.data if hasattr(tensor, "data") else tensor, root_rank)
    _record("broadcast_parameters")


def broadcast_optimizer_state(optimizer, root_rank: int) -> None:
    for state in optimizer.state.values():
        for value in state.values():
            if torch.is_tensor(value):
                dist.broadcast(value, root_rank)
    _record("broadcast_optimizer_state")


def barrier() -> None:
    dist.barrier()


def shutdown() -> None:
    if dist.is_initialized():
        dist.destroy_process_group()


def DistributedOptimizer(optimizer, named_parameters=None, backward_passes_per_step=1, **kwargs):  # noqa: N802
    """Averages every gradient over the ranks in `synchronize()`, which `step()` calls unless skipped."""
    base = optimizer.__class__

    class _DistributedOptimizer(base):
        def synchronize(self):
            for group in self.param_groups:
                for p in group["params"]:
                    if p.grad is not None:
                        dist.all_reduce(p.grad, op=dist.ReduceOp.SUM)
                        p.grad /= size()
            self._synchronized = True

        @contextlib.contextmanager
        def skip_synchronize(self):
            self._skip_sync = True
            try:
                yield
            finally:
                self._skip_sync = False

        def step(self, closure=None):
            if not self._skip_sync:
                self.synchronize()
            return super().step(closure)

    optimizer.__class__ = _DistributedOptimizer
    optimizer._skip_sync = False
    _record(f"DistributedOptimizer backward_passes_per_step={backward_passes_per_step}")
    return optimizer
