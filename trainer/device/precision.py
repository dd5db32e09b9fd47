"""Mixed precision and the optimizer step: autocast, GradScaler, backward, unscale-before-clip, the non-finite
policy. Native torch.amp replaces Apex AMP. The one owner of what `train.amp` runs as (`choose_precision`) and of
the autocast context every forward pass uses, training and inference alike (`autocast`).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from trainer.device.devices import auto_precision

if TYPE_CHECKING:
    from trainer.device.strategy import Strategy

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}


def autocast(precision: str, device_type: str):
    """The autocast context of a precision name (fp32 | bf16 | fp16) on a device type."""
    dtype = DTYPES.get(precision)
    return contextlib.nullcontext() if dtype is None else torch.autocast(device_type, dtype=dtype)


def native_bf16(device: torch.device) -> bool:
    """Whether `device` runs bf16 convolutions and matmuls in hardware (not emulated through fp32)."""
    if device.type == "cuda":
        return torch.cuda.is_bf16_supported(including_emulation=False)
    return torch.cpu._is_avx512_bf16_supported() or torch.cpu._is_amx_tile_supported()


def choose_precision(amp: str, device: torch.device) -> tuple[str, str]:
    """(fp32 | bf16 | fp16, why): `train.amp` as set, or for `auto` what this device runs natively."""
    if amp != "auto" or device.type == "mps":
        return auto_precision(amp, device.type, {})
    facts = {"bf16_cuda" if device.type == "cuda" else "bf16_cpu": native_bf16(device)}
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else None
    return auto_precision(amp, device.type, facts, name)


def fill_momentum_buffers(optimizer: torch.optim.Optimizer) -> None:
    """Give every SGD parameter lacking one a zero momentum buffer (with no dampening, the same first update as
    SGD's own `buf = grad`).

    Needed where a fused SGD step may be skipped before any buffer exists: fused SGD creates its first buffers
    with `torch.empty_like` and a step skipped by the GradScaler (fp16 overflow) never writes them, so the next
    step would add uninitialised memory to the weights (torch 2.14; the fp16 NaN of issue #22). Also where a
    parameter starts training late (gradual unfreezing), because a fused step takes buffers for all of a group's
    parameters or for none."""
    if not isinstance(optimizer, torch.optim.SGD):
        return
    for group in optimizer.param_groups:
        if group.get("momentum"):
            for p in group["params"]:
                state = optimizer.state[p]
                if state.get("momentum_buffer") is None:
                    state["momentum_buffer"] = torch.zeros_like(p, memory_format=torch.preserve_format)


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
        return autocast(self.amp, self.device_type)

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


