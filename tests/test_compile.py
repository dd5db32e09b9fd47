"""`train.compile`: the model is torch.compiled in place, so checkpoints and exports look exactly as without it."""

import pytest
from helpers import run_here, write_config

from trainer.core.events import read_events
from trainer.model.checkpoint import load_weights_only
from trainer.model.models import SmallCNN


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_a_compiled_run_trains_and_checkpoints_the_plain_model(shapes_dir, tmp_path):
    cfg = write_config(tmp_path, shapes_dir, train={"epochs": 1, "compile": True}, data={"batch_size": 32})
    result = run_here("train", cfg, "--run-dir", tmp_path / "run", timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    events = read_events(tmp_path / "run" / "events.jsonl")
    start = next(e for e in events if e["event"] == "run_start")
    assert start["compiled"] is True
    assert [e for e in events if e["event"] == "epoch"][-1]["train_loss"] > 0
    state = load_weights_only(tmp_path / "run" / "checkpoints" / "last.pt")
    assert not any("_orig_mod" in k for k in state["model"])
    SmallCNN(4).load_state_dict(state["model"])  # loads into the plain class: same keys, same shapes


def test_compile_with_dataparallel_is_refused_by_name(shapes_dir, tmp_path):
    cfg = write_config(tmp_path, shapes_dir, train={"compile": True}, device={"parallel": "dp"})
    result = run_here("train", cfg)
    assert result.returncode == 2 and "train.compile" in result.stderr and "dp" in result.stderr
