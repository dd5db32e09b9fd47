"""Per-layer gradient statistics computed on the device, moved to the host only at log steps.

Everything here is built from foreach/fused ops over the list of trainable tensors; nothing in this
module runs unless the loop asks for it (monitor.grad_stats, clipping or skip-on-non-finite), and nothing here
copies to the host except `histogram` and `first_nonfinite`.
"""

from __future__ import annotations

import torch
from torch import nn

# The per-layer rows of a `grad_stats` event, in the order `GradMonitor.layer_table` stacks them.
LAYER_STATS = ("grad_norm", "weight_norm", "update_ratio", "zero_frac")


class GradMonitor:
    """Per-parameter-tensor statistics for the trainable parameters of one (unwrapped) model.

    Each statistic is one foreach kernel over all layers (no Python loop over tensors), and none of them reads
    anything back to the host: the loop copies them out together with the loss, once per log step.
    """

    def __init__(self, model: nn.Module):
        named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
        self.names = [n for n, _ in named]
        self.params = [p for _, p in named]
        self._before: list[torch.Tensor] | None = None  # the weights before the step (a buffer reused every time)
        self._before_taken = False
        self._numel: torch.Tensor | None = None

    def _grads(self) -> list[torch.Tensor]:
        return [p.grad if p.grad is not None else torch.zeros((), device=p.device) for p in self.params]

    def grad_norms(self) -> torch.Tensor:
        """(L,) L2 norm of each tensor's gradient, on the device, no host sync."""
        return torch.stack(torch._foreach_norm(self._grads())).float()

    def snapshot_weights(self) -> None:
        """Remember the weights before the optimizer step, for the update-to-weight ratio."""
        weights = [p.detach() for p in self.params]
        if self._before is None:
            self._before = [torch.empty_like(w) for w in weights]
        torch._foreach_copy_(self._before, weights)
        self._before_taken = True

    def zero_fractions(self) -> torch.Tensor:
        """(L,) fraction of exactly-zero gradient entries per tensor (call before zero_grad)."""
        nonzero = torch.stack(torch._foreach_norm(self._grads(), 0)).float()  # the L0 "norm" counts non-zero entries
        if self._numel is None:  # once: a missing gradient counts as all zeros (0 non-zero of numel)
            self._numel = torch.tensor([p.numel() for p in self.params], dtype=torch.float32, device=nonzero.device)
        return 1 - nonzero / self._numel

    def layer_table(self, grad_norms: torch.Tensor, zero_frac: torch.Tensor) -> torch.Tensor:
        """After the optimizer step: a (4, L) device tensor with the rows of `LAYER_STATS` (grad norm, weight norm,
        update/weight ratio, zero-gradient fraction); no host sync."""
        weights = [p.detach() for p in self.params]
        weight_norms = torch.stack(torch._foreach_norm(weights)).float()
        if self._before_taken:
            torch._foreach_sub_(self._before, weights)  # the buffer now holds minus the update
            update = torch.stack(torch._foreach_norm(self._before)).float() / weight_norms.clamp_min(1e-12)
        else:
            update = torch.zeros_like(weight_norms)
        self._before_taken = False
        return torch.stack([grad_norms, weight_norms, update, zero_frac])

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
