"""Growable numpy buffers for curves: amortised O(1) appends, views for plotting, bounded memory.

Qt-free. Long histories are decimated in place once `max_points` is reached: each run of four points
keeps its lowest and highest, so a million-step run costs a fixed amount of memory, plotting stays fast,
and a one-step spike (or dip) is never decimated away.
"""

from __future__ import annotations

import numpy as np


def minmax_indices(y: np.ndarray, bucket: int) -> np.ndarray:
    """Indices, in order, of the lowest and highest value of each run of `bucket` points (NaNs only when a
    whole run is NaN), plus the incomplete run at the end kept whole; the first and last point always."""
    full = len(y) // bucket * bucket
    runs = y[:full].reshape(-1, bucket)
    nan = np.isnan(runs)
    low = np.argmin(np.where(nan, np.inf, runs), axis=1)
    high = np.argmax(np.where(nan, -np.inf, runs), axis=1)
    high = np.where(high == low, bucket - 1 - low, high)  # a flat run: keep two distinct points
    base = np.arange(len(runs)) * bucket
    pairs = np.sort(np.stack([base + low, base + high], axis=1), axis=1).ravel()
    index = np.concatenate([pairs, np.arange(full, len(y))])
    if len(index) and index[0] != 0:
        index = np.concatenate([[0], index])
    if len(index) and index[-1] != len(y) - 1:
        index = np.concatenate([index, [len(y) - 1]])
    return index


class Series:
    """x/y float64 pairs."""

    def __init__(self, capacity: int = 1024, max_points: int = 20_000):
        self._x = np.empty(capacity)
        self._y = np.empty(capacity)
        self._n = 0
        self.max_points = max_points
        self.version = 0  # bumped on every change, so views redraw only when needed
        self.decimations = 0  # how many times the history was thinned; `kept` = old indices kept the last time
        self.kept = np.empty(0, dtype=np.int64)
        self.before_decimating: list = []  # callables run just before thinning (derived views catch up first)

    def __len__(self) -> int:
        return self._n

    def append(self, x: float, y: float | None) -> None:
        if self._n == len(self._x):
            if self._n >= self.max_points:
                self._decimate()
            else:
                self._x = np.resize(self._x, 2 * len(self._x))
                self._y = np.resize(self._y, 2 * len(self._y))
        self._x[self._n] = x
        self._y[self._n] = np.nan if y is None else y
        self._n += 1
        self.version += 1

    def _decimate(self) -> None:
        """Halve the history: of each four points keep the lowest and the highest (in step order)."""
        for catch_up in self.before_decimating:
            catch_up()
        kept = minmax_indices(self._y[: self._n], 4)
        self._x[: len(kept)] = self._x[kept]
        self._y[: len(kept)] = self._y[kept]
        self._n = len(kept)
        self.kept = kept
        self.decimations += 1

    def display_index(self, max_points: int = 4000) -> np.ndarray | slice:
        """Which points to draw: all when few, else each bucket's lowest and highest (first and last always).

        Plots are given these rather than letting the plot library thin them by the visible range: its thinned
        data changed the autoranged view, which changed the thinning, in an endless repaint loop.
        """
        if self._n <= max_points:
            return slice(0, self._n)
        return minmax_indices(self._y[: self._n], -(-self._n // (max_points // 2)))

    @property
    def x(self) -> np.ndarray:
        return self._x[: self._n]

    @property
    def y(self) -> np.ndarray:
        return self._y[: self._n]

    def clear(self) -> None:
        self.truncate(-np.inf)

    def truncate(self, last_x: float) -> None:
        """Drop the points after `last_x` (a resumed run's superseded steps): derived views see a thinning that kept
        the points before."""
        n = int(np.searchsorted(self._x[: self._n], last_x, side="right"))
        if n == self._n:
            return
        self._n = n
        self.version += 1
        self.decimations += 1
        self.kept = np.arange(n, dtype=np.int64)


class Matrix:
    """Columns of a fixed row count (layers x steps), for the gradient heatmap; decimates like Series."""

    def __init__(self, rows: int, capacity: int = 256, max_columns: int = 4096):
        self._data = np.full((rows, capacity), np.nan, dtype=np.float32)
        self._steps = np.empty(capacity)
        self._n = 0
        self.max_columns = max_columns
        self.version = 0

    @property
    def rows(self) -> int:
        return self._data.shape[0]

    def __len__(self) -> int:
        return self._n

    def append(self, step: float, column: list[float | None]) -> None:
        if self._n == self._data.shape[1]:
            if self._n >= self.max_columns:
                half = self._n // 2
                self._data[:, :half] = self._data[:, : 2 * half: 2]
                self._steps[:half] = self._steps[: 2 * half: 2]
                self._n = half
            else:
                grown = np.full((self.rows, 2 * self._n), np.nan, dtype=np.float32)
                grown[:, : self._n] = self._data
                self._data = grown
                self._steps = np.resize(self._steps, 2 * self._n)
        self._data[:, self._n] = np.array([np.nan if v is None else v for v in column], dtype=np.float32)
        self._steps[self._n] = step
        self._n += 1
        self.version += 1

    def truncate(self, last_step: float) -> None:
        """Drop the columns after `last_step`."""
        n = int(np.searchsorted(self._steps[: self._n], last_step, side="right"))
        if n != self._n:
            self._n = n
            self.version += 1

    @property
    def data(self) -> np.ndarray:
        return self._data[:, : self._n]

    @property
    def steps(self) -> np.ndarray:
        return self._steps[: self._n]


class Smoothed:
    """A TensorBoard-style exponential moving average of a Series, extended incrementally.

    Only the points appended since the last call are processed (a Python loop over a few points per
    redraw). When the series is decimated, the smoothed values are thinned the same way and the average
    runs on over every raw point; the whole series is recomputed only when the weight changes.
    """

    def __init__(self, series: Series, weight: float = 0.6):
        self.series = series
        self.weight = weight
        self._out = np.empty(0)
        self._done = 0
        self._acc = self._norm = 0.0
        self._decimations = series.decimations
        series.before_decimating.append(self.values)  # smooth every point before any is thinned away

    def set_weight(self, weight: float) -> None:
        if weight != self.weight:
            self.weight = weight
            self._done = 0

    def values(self) -> np.ndarray:
        y = self.series.y
        if self.series.decimations != self._decimations:
            once = self.series.decimations == self._decimations + 1
            self._decimations = self.series.decimations
            if once and self._done:  # keep the smoothed values of the points kept; the average runs on
                done = self.series.kept[self.series.kept < self._done]
                self._out[: len(done)] = self._out[done]
                self._done = len(done)
            else:
                self._done = 0
        if self.weight <= 0:
            return y
        if self._done == 0:
            self._acc = self._norm = 0.0
            self._out = np.empty(max(16, 2 * len(y)))
        if len(self._out) < len(y):
            self._out = np.resize(self._out, 2 * len(y))
        w, acc, norm = self.weight, self._acc, self._norm
        for i in range(self._done, len(y)):
            v = y[i]
            if v == v:  # not NaN
                acc = w * acc + (1 - w) * v
                norm = w * norm + (1 - w)
            self._out[i] = acc / norm if norm else np.nan
        self._acc, self._norm, self._done = acc, norm, len(y)
        return self._out[: len(y)]
