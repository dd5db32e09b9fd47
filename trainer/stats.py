"""Per-layer gradient statistics computed on the device, moved to the host only at log steps.

Everything here is built from foreach/fused ops over the list of trainable tensors; nothing in this
module runs unless the loop asks for it (monitor.grad_stats, clipping or skip-on-non-finite).
"""

from __future__ import annotations

import torch
from torch import nn


class GradMonitor:
    """Per-parameter-tensor statistics for the trainable parameters of one (unwrapped) model."""

    def __init__(self, model: nn.Module):
        named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
        self.names = [n for n, _ in named]
        self.params = [p for _, p in named]
        self._before: list[torch.Tensor] | None = None

    def _grads(self) -> list[torch.Tensor]:
        return [p.grad if p.grad is not None else torch.zeros((), device=p.device) for p in self.params]

    def grad_norms(self) -> torch.Tensor:
        """(L,) L2 norm of each tensor's gradient, on the device, no host sync."""
        return torch.stack(torch._foreach_norm(self._grads())).float()

    def snapshot_weights(self) -> None:
        """Remember the weights before the optimizer step, for the update-to-weight ratio."""
        self._before = [p.detach().clone() for p in self.params]

    def zero_fractions(self) -> torch.Tensor:
        """(L,) fraction of exactly-zero gradient entries per tensor (call before zero_grad)."""
        return torch.stack([(g == 0).float().mean() for g in self._grads()])

    def layer_stats(self, grad_norms: torch.Tensor, zero_frac: torch.Tensor) -> dict[str, list[float]]:
        """After the optimizer step: grad norm, weight norm, update/weight ratio, zero-gradient fraction.

        One device-to-host copy for all layers.
        """
        weights = [p.detach() for p in self.params]
        weight_norms = torch.stack(torch._foreach_norm(weights)).float()
        if self._before is not None:
            deltas = torch._foreach_sub(weights, self._before)
            update = torch.stack(torch._foreach_norm(deltas)).float() / weight_norms.clamp_min(1e-12)
        else:
            update = torch.zeros_like(weight_norms)
        self._before = None
        table = torch.stack([grad_norms, weight_norms, update, zero_frac]).cpu().tolist()
        return {"grad_norm": table[0], "weight_norm": table[1], "update_ratio": table[2], "zero_frac": table[3]}

    def first_nonfinite(self) -> str | None:
        """Name of the first parameter (in model order) whose gradient is NaN or infinite."""
        for name, g in zip(self.names, self._grads()):
            if not torch.isfinite(g).all():
                return name
        return None


def global_norm(grad_norms: torch.Tensor) -> torch.Tensor:
    """The global L2 norm from per-tensor norms (what clip_grad_norm_ computes)."""
    return torch.linalg.vector_norm(grad_norms)


def histogram(t: torch.Tensor, bins: int) -> dict:
    """A fixed-bin histogram computed on the device; one small host copy."""
    t = t.detach().float().flatten()
    lo, hi = torch.aminmax(t)
    counts = torch.histc(t, bins=bins, min=0.0, max=0.0)  # min=max=0: the tensor's own range
    values = torch.cat([torch.stack([lo, hi]), counts]).cpu().tolist()
    return {"min": values[0], "max": values[1], "counts": [int(c) for c in values[2:]]}


class AnomalyWatch:
    """Loss spikes and exploding/vanishing gradients, judged on values already on the host at log steps."""

    def __init__(self, spike_factor: float, explode: float, vanish: float):
        self.spike_factor, self.explode, self.vanish = spike_factor, explode, vanish
        self.mean: float | None = None

    def check(self, step: int, loss: float, grad_norm: float | None) -> list[dict]:
        found = []
        if self.mean is not None and loss > self.spike_factor * self.mean:
            found.append({"kind": "loss_spike", "step": step, "value": loss,
                          "message": f"loss spike at step {step}: {loss:.4g} is over {self.spike_factor:g}x "
                                     f"its running mean {self.mean:.4g}"})
        self.mean = loss if self.mean is None else 0.9 * self.mean + 0.1 * loss
        if grad_norm is not None and grad_norm > self.explode:
            found.append({"kind": "exploding_gradients", "step": step, "value": grad_norm,
                          "message": f"exploding gradients at step {step}: global norm {grad_norm:.3g} > {self.explode:g}"})
        if grad_norm is not None and grad_norm < self.vanish:
            found.append({"kind": "vanishing_gradients", "step": step, "value": grad_norm,
                          "message": f"vanishing gradients at step {step}: global norm {grad_norm:.3g} < {self.vanish:g}"})
        return found
