"""One export format, one place (issue #33): a format declared in this module alone, with its writer, loader and load
snippet, is offered by the CLI, accepted by the config check and listed by the Export dialog, and it exports, loads
back and is measured like the built-in ones."""

import json

import numpy as np
import pytest
from helpers import train_here, write_config

from trainer.core.catalog import (
    DEPRECATED_EXPORT_FORMATS,
    EXPORT_CONVERTERS,
    EXPORT_DESCRIPTIONS,
    EXPORT_FORMATS,
    EXPORT_REGISTRY,
    ExportFormat,
    register_export_format,
)

NAME = "npz_weights"


# ---- the format: these five functions and the registry entry below are all of it ---------------------------------
def write_npz_weights(model, path, context) -> None:
    with open(path, "wb") as f:  # np.savez would add .npz to a name without it
        np.savez(f, **{k: v.detach().cpu().numpy() for k, v in model.state_dict().items()})


def load_npz_weights(path, meta):
    import torch

    from trainer.core.config import ModelConfig
    from trainer.model.models import create_model

    model = create_model(ModelConfig(name=meta["model_name"]), len(meta["classes"])).eval()
    with np.load(path) as arrays:
        model.load_state_dict({k: torch.from_numpy(arrays[k]) for k in arrays.files})
    return model


def recognise_npz_weights(path) -> bool:  # a file's format is read from its bytes: an archive of .npy arrays
    import zipfile

    return zipfile.is_zipfile(path) and all(n.endswith(".npy") for n in zipfile.ZipFile(path).namelist())


def snippets_npz_weights(name, model_name, classes, size):
    return {"NumPy (Python)": f'import numpy\nweights = dict(numpy.load("{name}"))'}


@pytest.fixture
def npz_format():
    register_export_format(ExportFormat(NAME, ".npz", "the weights as a NumPy archive", __name__, graph=False))
    yield NAME
    for table in (EXPORT_REGISTRY, EXPORT_FORMATS, EXPORT_DESCRIPTIONS, EXPORT_CONVERTERS, DEPRECATED_EXPORT_FORMATS):
        table.pop(NAME, None)


def test_a_format_declared_in_one_module_is_offered_checked_exported_and_measured(npz_format, shapes_dir, tmp_path,
                                                                                   capsys):
    from trainer import cli
    from trainer.core.config import ConfigError, RunConfig

    # the config's check takes it (and still refuses what is not a format)
    assert RunConfig.from_dict({"export": {"formats": [NAME]}}).export.formats == [NAME]
    with pytest.raises(ConfigError, match="export.formats"):
        RunConfig.from_dict({"export": {"formats": ["npz_weight"]}})
    # the CLI offers it, and an export in it is written, loaded back, measured and carded
    run, code = train_here(write_config(tmp_path, shapes_dir, train={"epochs": 1}), tmp_path / "runs")
    assert code == 0
    out = tmp_path / "model.npz"
    assert cli.main(["export", str(run.path), "--format", NAME, "--out", str(out)]) == 0, capsys.readouterr().err
    card = json.loads((tmp_path / "model.npz.json").read_text())
    assert card["format"] == NAME and card["metrics"]["agreement"] == 1.0 and card["speed"]["batch1_ms"] > 0
    assert card["load"] == snippets_npz_weights("model.npz", card["model_name"], 0, 0)
    assert "NumPy (Python)" in (tmp_path / "model.npz.md").read_text()


def test_the_export_dialog_lists_a_registered_format(npz_format, qtbot, tmp_path):
    from app.dialogs.export_dialog import ExportDialog

    dialog = ExportDialog(str(tmp_path))
    qtbot.addWidget(dialog)
    offered = [dialog.format.itemData(i) for i in range(dialog.format.count())]
    assert NAME in offered and offered[0] == "exported_program"
    dialog.format.setCurrentIndex(offered.index(NAME))
    assert dialog.out.text().endswith("model.npz") and "NumPy archive" in dialog.about.text()


def test_the_checkpoint_and_an_export_are_timed_by_one_harness_alternately():
    """Issue #69: a card's two latencies (the export's, the checkpoint's) come from one harness: the same images,
    batch, warm-up and threads, their runs alternated, so a machine that gets busy part-way slows both alike. Timed
    here with an injected clock: each call of one model takes 2 ms, of the other 6 ms, and the clock jumps by 50 ms
    half-way (another program starting) during a single call of each."""
    from types import SimpleNamespace

    import torch

    from trainer.deploy import export_measure as measure

    now, calls = [0.0], []

    def model(name: str, ms: float):
        def net(x):
            calls.append((name, x.shape[0]))
            now[0] += ms / 1000 + (0.05 if len(calls) == 40 else 0.0)
            return x
        return SimpleNamespace(net=net, preprocess=SimpleNamespace(to_input=lambda images: images.float()))

    images = torch.zeros(measure.LARGE_BATCH, 3, 8, 8, dtype=torch.uint8)
    timed = measure.speeds({"export": model("export", 2), "checkpoint": model("checkpoint", 6)}, images,
                           clock=lambda: now[0])
    assert timed["export"]["batch1_ms"] == pytest.approx(2) and timed["checkpoint"]["batch1_ms"] == pytest.approx(6)
    assert timed["export"]["images_per_s"] == pytest.approx(32 / 0.002)
    assert timed["export"]["harness"] == timed["checkpoint"]["harness"] == {
        "batch": 32, "warm_up": [3, 1], "threads": torch.get_num_threads(), "alternated": True}
    timed_calls = [c for c in calls[6:] if c[1] == 1]  # after each model's 3 warm-up calls
    assert [n for n, _ in timed_calls[:6]] == ["export", "checkpoint"] * 3, "alternated, not one after the other"
    assert timed["export"]["batch1_runs"] == timed["checkpoint"]["batch1_runs"] == measure.LATENCY_RUNS
