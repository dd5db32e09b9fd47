"""A moving average of the network's weights (`train.ema`): what is validated, checkpointed as the model and
exported, while the optimizer goes on training the network itself.

As timm's ModelEmaV3 and torchvision's ExponentialMovingAverage (use_buffers=True): after each optimizer step every
floating parameter and buffer (BatchNorm statistics included) moves towards the network's by (1 - decay); integer
buffers are copied. The decay warms up as min(decay, (1 + step) / (10 + step)) (timm's warm-up), so a short run
averages its own recent weights, not the initial ones.
"""

from __future__ import annotations

import copy

import torch
from torch import nn


def warmed_decay(decay: float, step: int) -> float:
    return min(decay, (1 + step) / (10 + step))


class WeightAverage:
    """The average of `net`'s weights; `module` is a network of its own, always in eval mode."""

    def __init__(self, net: nn.Module, decay: float):
        self.decay = decay
        self.module = copy.deepcopy(net).eval()
        for p in self.module.parameters():
            p.requires_grad_(False)
        # the same tensors for the whole run (loading a checkpoint copies into them), so paired once
        pairs = list(zip(self.module.state_dict(keep_vars=True).values(), net.state_dict(keep_vars=True).values()))
        self._avg = [a for a, _ in pairs if a.is_floating_point()]
        self._new = [b.detach() for a, b in pairs if a.is_floating_point()]
        self._copies = [(a, b) for a, b in pairs if not a.is_floating_point()]

    @torch.no_grad()
    def reset(self) -> None:
        """Start the average at the network's weights as they are now (a fresh run, once every rank has them)."""
        for a, b in zip(self._avg, self._new):
            a.copy_(b)
        for a, b in self._copies:
            a.copy_(b)

    @torch.no_grad()
    def update(self, step: int) -> None:
        """Average in the network's weights after optimizer step `step` (1-based)."""
        torch._foreach_lerp_(self._avg, self._new, 1.0 - warmed_decay(self.decay, step))
        for a, b in self._copies:
            a.copy_(b)
