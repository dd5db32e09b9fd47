"""What the Gradients tab draws, worked out without Qt: histograms over time on one shared symlog value axis (as
TensorBoard draws its distributions), and layer names for the heatmap's axis, grouped by module and elided in the
middle.
"""

from __future__ import annotations

import numpy as np

ROWS = 96  # value-axis resolution of the histograms-over-time image


def elide_middle(text: str, width: int) -> str:
    """`text` shortened to `width` characters by cutting its middle ("features.den…conv2.weight")."""
    if len(text) <= width:
        return text
    head = (width - 1) // 2
    return text[:head] + "…" + text[len(text) - (width - 1 - head):]


def layer_ticks(names: list[str], width: int = 30, min_gap: float = 1.0) -> list[list[tuple[float, str]]]:
    """pyqtgraph ticks for the heatmap's layer axis (row i centred at i + 0.5): the module group (the name's first
    part) where a group starts, as major ticks, and every layer's name within its group, elided, as minor ticks
    (pyqtgraph leaves out the minor labels that would overlap). Major labels closer than `min_gap` rows to the
    previous one are left out too (resnet18's conv1 and bn1 start one row apart: their labels overlapped)."""
    major, minor = [], []
    previous, last_major = None, -float("inf")
    for i, name in enumerate(names):
        group, _, rest = name.partition(".")
        if group != previous:
            if i - last_major >= min_gap:
                major.append((i + 0.5, elide_middle(f"{group} ▸ {rest}" if rest else group, width)))
                last_major = i
            previous = group
        else:
            minor.append((i + 0.5, elide_middle(rest or name, width)))
    return [major, minor]


def step_ticks(steps, labels: int = 6) -> list[list[tuple[float, str]]]:
    """Ticks for an image whose columns are logged steps: about `labels` of them, each the step it shows (the
    heatmap and the histograms read alike: steps, not the column index)."""
    every = max(1, len(steps) // labels)
    return [[(i + 0.5, str(int(step))) for i, step in enumerate(steps) if i % every == 0]]


def symlog(v: np.ndarray, linthresh: float) -> np.ndarray:
    """Linear within ±linthresh, logarithmic beyond: small and large values, of either sign, on one axis."""
    return np.sign(v) * np.log10(1 + np.abs(v) / linthresh)


def inverse_symlog(y: np.ndarray, linthresh: float) -> np.ndarray:
    return np.sign(y) * linthresh * (10 ** np.abs(y) - 1)


def shared_histograms(series: list[dict], rows: int = ROWS) -> tuple[np.ndarray, float, float, float]:
    """Histogram events (each with its own min, max and equal-width counts) re-binned onto one symlog value axis.

    Returns (image with one column per event and one row per value bin, each column scaled to its own peak;
    axis low and high in symlog units; the linear threshold). A bin's count lands in the row of its centre.
    """
    lows = np.array([h["min"] for h in series], dtype=float)
    highs = np.array([h["max"] for h in series], dtype=float)
    scale = max(np.abs(lows).max(), np.abs(highs).max(), 1e-12)
    linthresh = scale * 1e-3  # three decades of detail below the largest magnitude seen
    low, high = symlog(lows.min(), linthresh), symlog(highs.max(), linthresh)
    if high - low < 1e-9:
        low, high = low - 0.5, high + 0.5
    image = np.zeros((len(series), rows))
    for col, h in enumerate(series):
        counts = np.asarray(h["counts"], dtype=float)
        edges = np.linspace(h["min"], h["max"], len(counts) + 1)
        centres = symlog((edges[:-1] + edges[1:]) / 2, linthresh)
        target = np.clip(((centres - low) / (high - low) * rows).astype(int), 0, rows - 1)
        np.add.at(image[col], target, counts)
        peak = image[col].max()
        if peak > 0:
            image[col] /= peak
    return image, float(low), float(high), float(linthresh)


def value_ticks(low: float, high: float, linthresh: float, rows: int = ROWS) -> list[tuple[float, str]]:
    """Ticks for the shared value axis (in row units): 0 and the powers of ten, of either sign, in range, the
    largest first, none closer than a tenth of the axis to another (labels never overlap)."""
    candidates = []
    if low <= 0 <= high:
        candidates.append(((0 - low) / (high - low) * rows, "0"))
    top = int(np.ceil(np.log10(max(abs(inverse_symlog(np.array([low, high]), linthresh)).max(), 1e-30))))
    for k in range(top - 4, top + 1):
        for v in (-(10.0 ** k), 10.0 ** k):
            y = float(symlog(np.array(v), linthresh))
            if low <= y <= high:
                candidates.append(((y - low) / (high - low) * rows,
                                   f"{v:.0e}".replace("e-0", "e-").replace("e+0", "e")))
    kept: list[tuple[float, str]] = []
    for row, label in candidates[:1] + sorted(candidates[1:], key=lambda t: -abs(float(t[1]))):
        if all(abs(row - r) >= rows / 10 for r, _ in kept):
            kept.append((row, label))
    return sorted(kept)
