"""What the Gradients tab draws: histograms re-binned onto one shared symlog value axis, and layer names grouped
by module and elided in the middle."""

import numpy as np

from app.state.grad_views import elide_middle, layer_ticks, shared_histograms, symlog, value_ticks


def test_histograms_share_one_value_axis():
    # step 1: values in [-1, 1]; step 2: the same shape but 100 times wider. On a shared axis the second column's
    # mass sits further from zero; with each column on its own range (as before) the two would look identical.
    narrow = {"min": -1.0, "max": 1.0, "counts": [0, 0, 10, 10, 0, 0]}
    wide = {"min": -100.0, "max": 100.0, "counts": [0, 0, 10, 10, 0, 0]}
    image, low, high, linthresh = shared_histograms([narrow, wide], rows=64)
    assert image.shape == (2, 64) and image.max() == 1.0
    assert low == symlog(np.array(-100.0), linthresh) and high == -low
    rows = np.arange(64)
    spread = [np.average(np.abs(rows - 31.5), weights=image[c]) for c in range(2)]
    assert spread[1] > spread[0] + 3
    zero_row = (0 - low) / (high - low) * 64
    ticks = value_ticks(low, high, linthresh, rows=64)
    assert (zero_row, "0") in ticks and any(label == "1e2" for _, label in ticks)
    assert any(label == "-1e0" for _, label in ticks)


def test_a_constant_histogram_still_draws():
    image, low, high, _ = shared_histograms([{"min": 0.5, "max": 0.5, "counts": [4, 0]}], rows=8)
    assert high > low and image.sum() == 1.0


def test_layer_names_are_grouped_by_module_and_elided_in_the_middle():
    names = ["conv1.weight", "layer1.0.conv1.weight", "layer1.0.bn1.weight", "features.denseblock4.denselayer16"
             ".conv2.weight", "fc.bias"]
    major, minor = layer_ticks(names, width=24)
    assert [label for _, label in major] == ["conv1 ▸ weight", "layer1 ▸ 0.conv1.weight",
                                             "features ▸ …conv2.weight", "fc ▸ bias"]
    assert minor == [(2.5, "0.bn1.weight")]
    assert all(len(label) <= 24 for _, label in major + minor)
    assert elide_middle("abcdefghij", 5) == "ab…ij" and elide_middle("abc", 5) == "abc"


def test_group_labels_too_close_to_the_previous_one_are_left_out():
    names = ["conv1.weight", "bn1.weight", "bn1.bias", "layer1.0.conv1.weight", "layer1.0.bn1.weight",
             "layer1.0.bn1.bias", "fc.weight", "fc.bias"]
    every = [label for _, label in layer_ticks(names)[0]]
    assert every == ["conv1 ▸ weight", "bn1 ▸ weight", "layer1 ▸ 0.conv1.weight", "fc ▸ weight"]
    spaced = [pos for pos, _ in layer_ticks(names, min_gap=3)[0]]
    assert spaced == [0.5, 3.5, 6.5], "bn1 one row under conv1 would overlap it"


def test_step_ticks_name_the_steps_of_the_columns():
    from app.state.grad_views import step_ticks

    assert step_ticks([10, 20, 30]) == [[(0.5, "10"), (1.5, "20"), (2.5, "30")]]
    assert [label for _, label in step_ticks(list(range(100, 1300, 100)))[0]] == ["100", "300", "500", "700", "900",
                                                                                 "1100"]


def test_a_loss_axis_leaves_out_only_what_would_flatten_the_rest():
    import numpy as np

    from app.state.loss_axis import robust_range

    epochs = np.arange(1.0, 7.0)
    cut = robust_range(epochs, np.array([966.0, 2.0, 1.0, 0.7, 0.5, 0.3]))
    assert cut is not None and cut.left_out == [(1.0, 966.0)] and cut.low < 0.3 and 2.0 < cut.high < 2.5
    assert cut.said() == "1 off the scale" and cut.which() == "966 at epoch 1"
    assert robust_range(epochs, np.array([9.0, 5.0, 2.0, 1.0, 0.7, 0.5])) is None, "a steep fall is not an outlier"
    assert robust_range(epochs[:2], np.array([966.0, 1.0])) is None, "two points: both shown"
    assert robust_range(epochs, np.array([np.nan, 2.0, 1.0, 0.7, 0.5, 0.3])) is None
