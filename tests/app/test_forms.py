"""The forms hold what the config holds (issue #51): a widget's limits are the config key's, so a valid value is never
rounded or clamped on its way through the forms (0.125 became 0.13, 0.02 became 0.05)."""

from helpers import write_config
from PySide6.QtWidgets import QDoubleSpinBox, QSpinBox

from app.forms import get_path, set_path
from trainer.core.config import RunConfig, key_meta


def test_every_numeric_key_survives_the_forms_unchanged(qtbot, make_window, shapes_dir, tmp_path, monkeypatch):
    monkeypatch.setenv("TRAINDECK_STANDBY", "0")
    window = make_window(write_config(tmp_path, shapes_dir))
    spins = {k: w for k, w in window.binder.widgets.items() if isinstance(w, (QSpinBox, QDoubleSpinBox))}
    assert {"data.val_split", "data.augment.crop_scale_min", "train.epochs", "scheduler.warmup_epochs"} <= set(spins)
    raw = RunConfig().to_dict()
    window.binder.dump(raw)
    values = {"data.val_split": 0.125, "data.augment.crop_scale_min": 0.02, "scheduler.warmup_epochs": 0.25,
              "loss.label_smoothing": 0.005, "data.augment.color_jitter": 0.375}
    for key in spins:  # every other one at the edges the config allows
        meta = key_meta(key)
        values.setdefault(key, meta["le"] if meta["le"] is not None and meta["le"] < 2**31 else
                          meta["ge"] if meta["ge"] is not None else meta["default"])
    for key, value in values.items():
        set_path(raw, key, value)
    window.binder.load(raw)
    out = RunConfig().to_dict()
    window.binder.dump(out)
    changed = {k: (v, get_path(out, k)) for k, v in values.items() if get_path(out, k) != v}
    assert not changed, f"the forms changed valid values: {changed}"
    assert spins["data.val_split"].text() == "0.125", "shown as written"
    val_split = spins["data.val_split"]
    assert (val_split.minimum(), val_split.maximum()) == (0.000001, 0.999999), "the config's bounds: 0 < val_split < 1"
