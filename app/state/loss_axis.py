"""A loss axis that one outlier does not flatten (issue #71: an epoch-1 validation loss of 966 made every later epoch's
0.3-2 a flat line at the bottom of Loss per epoch). Qt-free: the chart asks, and says on itself what it left out."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

OUTLIER_FACTOR = 10.0  # a loss more than this many times the median of the chart's losses is drawn off the scale
MIN_POINTS = 3  # fewer points than this: every one is shown
MARGIN = 0.1  # room above and below the losses kept in view, as a share of their span


@dataclass
class Cut:
    low: float
    high: float
    left_out: list[tuple[float, float]]  # (epoch, loss) of each point above `high`

    def said(self) -> str:
        """What the chart's title says: how many losses it does not show."""
        return f"{len(self.left_out)} off the scale"

    def which(self) -> str:
        """Which they are (the chart's tooltip)."""
        return ", ".join(f"{loss:.3g} at epoch {epoch:g}" for epoch, loss in self.left_out)


def robust_range(x: np.ndarray, y: np.ndarray) -> Cut | None:
    """The range that shows every loss but those more than OUTLIER_FACTOR times the median; None when none is."""
    keep = np.isfinite(x) & np.isfinite(y)
    x, y = x[keep], y[keep]
    if len(y) < MIN_POINTS:
        return None
    median = float(np.median(np.abs(y)))
    far = y > OUTLIER_FACTOR * max(median, 1e-12)
    if not far.any() or far.all():
        return None
    near = y[~far]
    span = max(float(near.max() - near.min()), abs(float(near.max())) * 0.1, 1e-12)
    return Cut(low=float(near.min()) - MARGIN * span, high=float(near.max()) + MARGIN * span,
               left_out=[(float(a), float(b)) for a, b in zip(x[far], y[far])])
