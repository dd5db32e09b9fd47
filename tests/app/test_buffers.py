"""Curve buffers: bounded memory for any run length, without losing what a user looks for in a long curve."""

import numpy as np

from app.state.buffers import Series, Smoothed


def test_a_long_history_is_bounded_and_keeps_spikes_and_dips():
    s = Series(max_points=1000)
    for i in range(100_000):
        y = 1.0
        if i == 31_337:
            y = 50.0  # one diverging step
        elif i == 77_777:
            y = -3.0  # one dip
        s.append(i, y)
    assert len(s) <= 1000 and s.decimations > 0
    assert s.y.max() == 50.0 and s.y.min() == -3.0
    assert 31_337 in s.x and 77_777 in s.x
    assert np.all(np.diff(s.x) > 0)  # still in step order
    assert s.x[-1] == 99_999  # the newest point is always there


def test_missing_values_survive_as_gaps_without_hiding_real_ones():
    s = Series(capacity=64, max_points=1000)  # thinned as it grows (four times here): the gap survives the thinning
    for i in range(3000):
        s.append(i, None if 400 <= i < 500 else float(i))  # 100 steps without a value: a gap in the curve
    assert s.decimations >= 3 and len(s) <= 2000
    gap = s.x[np.isnan(s.y)]
    assert len(gap) > 0 and 400 <= gap.min() and gap.max() < 500, "the gap is still drawn, where it was"
    real = s.y[np.isfinite(s.y)]
    assert real.max() >= 2990 and not np.isnan(s.y[s.x < 400]).any(), "and no real value is hidden by it"


def test_smoothing_continues_across_decimation_like_over_the_raw_stream():
    s = Series(max_points=512)
    smooth = Smoothed(s, weight=0.9)
    rng = np.random.default_rng(0)
    raw = rng.normal(1.0, 0.5, 5000)
    reference, acc, norm = {}, 0.0, 0.0
    for i, v in enumerate(raw):
        s.append(i, v)
        acc, norm = 0.9 * acc + 0.1 * v, 0.9 * norm + 0.1
        reference[i] = acc / norm
        if i % 7 == 0:
            smooth.values()  # the dashboard reads it every redraw, while points keep coming
    values = smooth.values()
    assert len(values) == len(s) and s.decimations >= 3
    expected = np.array([reference[int(x)] for x in s.x])
    assert np.allclose(values, expected, atol=1e-9)


def test_what_is_drawn_is_thinned_but_keeps_ends_and_extremes():
    s = Series(max_points=100_000)
    for i in range(30_000):
        s.append(i, 50.0 if i == 12_345 else float(i % 7))
    shown = s.display_index(max_points=4000)
    x, y = s.x[shown], s.y[shown]
    assert len(x) <= 4002 and x[0] == 0 and x[-1] == 29_999  # the view's range is the data's range
    assert 12_345 in x and y.max() == 50.0 and y.min() == 0.0
    assert np.all(np.diff(x) > 0)
    few = Series()
    few.append(1, 2.0)
    assert list(few.x[few.display_index()]) == [1]

