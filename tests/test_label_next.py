"""The order of the next images to label (trainer.deploy.label_next) and the map's lasso (app.widgets.data_map_view), tested
directly: the most uncertain first, but never two of one tight group; a point is selected when inside the polygon."""

import numpy as np

from app.widgets.data_map_view import inside
from trainer.deploy import label_next
from trainer.deploy.label_next import diverse_uncertain


def test_the_most_uncertain_first_and_no_two_from_one_group():
    rng = np.random.default_rng(0)
    # 30 near-copies of one confusing image (margin 0.01) and 30 other images, each unsure to its own degree
    copies = np.tile(rng.normal(size=(1, 16)), (30, 1)) + 1e-3 * rng.normal(size=(30, 16))
    others = rng.normal(size=(30, 16)) * 5
    embeddings = np.concatenate([copies, others])
    # colour thumbnails (3 x 4 x 4, 0-1): the copies' alike, the others not
    thumbnails = np.concatenate([np.tile(rng.uniform(size=(1, 48)), (30, 1)) + 1e-3 * rng.normal(size=(30, 48)),
                                 rng.uniform(size=(30, 48))])
    margins = np.concatenate([np.full(30, 0.01), np.linspace(0.02, 0.9, 30)])
    probs = np.stack([(1 + margins) / 2, (1 - margins) / 2], axis=1)
    assert np.allclose(label_next.margins(probs), margins)
    order = diverse_uncertain(label_next.margins(probs), embeddings, 5, thumbnails)
    assert len(order) == 5 and sum(i < 30 for i in order) == 1, "one of the near-copies, not five"
    assert order[0] < 30, "the most uncertain comes first"
    assert [round(float(margins[i]), 3) for i in order] == sorted(round(float(margins[i]), 3) for i in order)
    assert max(margins[i] for i in order) <= 0.02 + 0.88 * 24 / 29, "from the 25 most uncertain (one copy) only"


def test_the_lasso_selects_the_points_inside_it():
    points = np.array([[0.5, 0.5], [2.0, 2.0], [0.9, 0.1], [-0.1, 0.5], [1.5, 0.5]])
    triangle_and_square = np.array([[0, 0], [1, 0], [1, 1], [0, 1]])
    assert inside(points, triangle_and_square).tolist() == [True, False, True, False, False]
    l_shape = np.array([[0, 0], [2, 0], [2, 1], [1, 1], [1, 3], [0, 3]])  # not convex
    assert inside(np.array([[1.5, 0.5], [1.5, 2.0], [0.5, 2.5]]), l_shape).tolist() == [True, False, True]
