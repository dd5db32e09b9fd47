"""The learning-rate finder's chart (issue #71: its axis read "(x0.001)" and its tick labels ran together mid-sweep)."""

import numpy as np

from app.dialogs.lr_find_dialog import LrFindDialog


def test_the_lr_axis_labels_whole_decades_that_stay_put_while_the_sweep_goes(qtbot):
    dialog = LrFindDialog(lambda lr: None)
    qtbot.addWidget(dialog)
    dialog.show()
    views = []
    for i, lr in enumerate(np.geomspace(1e-7, 10, 100)[:60]):  # mid-sweep: 1e-7 to about 3e-3
        dialog.add_point(float(lr), 0.002 + 1e-5 * i)  # small losses: pyqtgraph's prefix said "(x0.001)"
        views.append(tuple(dialog.plot.getViewBox().viewRange()[0]))
    assert len(set(views)) <= 5, "the view changes only when the sweep enters another decade"
    low, high = views[-1]
    assert (low, high) == (-7, -2)
    axis = dialog.plot.getAxis("bottom")
    labelled = axis.tickValues(low, high, axis.width() or 600)[0][1]
    assert len(labelled) == 6 and all(float(v).is_integer() for v in labelled), "one label a decade"
    assert "x0.001" not in dialog.plot.getAxis("left").labelString()
    assert "x0.001" not in axis.labelString()
