"""Apple silicon's GPU (device.type mps), on a machine without one: its availability is mocked at the one place that
asks (`trainer.device.mps.facts`); training on the hardware itself is untested (docs/portability.md)."""

import json
import warnings

import pytest
import torch
from helpers import run_here, write_config

from trainer import auto
from trainer.core.config import ConfigError, RunConfig, load_config
from trainer.device import machine, mps
from trainer.device.devices import auto_precision
from trainer.device.precision import choose_precision
from trainer.device.strategy import LaunchError

ON_A_MAC = {"mps": True, "bf16_mps": True}
ON_AN_OLD_MAC = {"mps": True, "bf16_mps": False}
FALLBACK = ("The operator 'aten::{}' is not currently supported on the MPS backend and will fall back to run on the "
            "CPU. This may have performance implications.")


def test_mps_is_refused_where_there_is_none_naming_the_key_before_a_run_exists(shapes_dir, tmp_path):
    assert not torch.backends.mps.is_available()  # this machine: the real answer
    cfg = write_config(tmp_path, shapes_dir)
    result = run_here("train", cfg, "--runs-dir", tmp_path / "runs", "--set", "device.type=mps")
    assert result.returncode == 2
    assert "device.type: mps, but no Apple-silicon GPU (MPS) here" in result.stderr
    assert "Traceback" not in result.stderr and not (tmp_path / "runs").exists()
    probe = json.loads(run_here("probe-devices").stdout)
    assert probe["mps"] is False and "mps" in probe["refused"]
    assert probe["auto_precision"]["mps"][0] == "fp32"


def test_on_a_mac_mps_is_accepted_auto_picks_it_and_bf16_needs_macos_14(shapes_dir, tmp_path, monkeypatch):
    cfg = write_config(tmp_path, shapes_dir)
    monkeypatch.setattr(mps, "facts", lambda: ON_A_MAC)
    machine.check_device(load_config(cfg, ["device.type=mps", "train.amp=bf16"]))  # no refusal
    monkeypatch.setattr(mps, "facts", lambda: ON_AN_OLD_MAC)
    with pytest.raises(LaunchError, match="train.amp: bf16: Apple's GPU runs bf16 from macOS 14"):
        machine.check_device(load_config(cfg, ["device.type=mps", "train.amp=bf16"]))
    machine.check_device(load_config(cfg, ["device.type=mps", "train.amp=fp16"]))
    with pytest.raises(ConfigError, match="device.parallel: ddp needs device.type cpu or cuda"):
        RunConfig.from_dict({"device": {"type": "mps", "parallel": "ddp"}})
    # Auto: an NVIDIA GPU first, else Apple's, else the CPU
    monkeypatch.setattr(mps, "facts", lambda: ON_A_MAC)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    chosen = {}
    device, precision = auto._device_choices(lambda key, value, why: chosen.setdefault(key, (value, why)))
    assert device.type == "mps" and chosen["device.type"][0] == "mps"
    assert precision == "fp32" and precision == auto_precision("auto", "mps", ON_A_MAC)[0]
    assert choose_precision("auto", torch.device("mps")) == auto_precision("auto", "mps", {})
    assert choose_precision("fp16", torch.device("mps"))[0] == "fp16"


def test_each_operation_mps_runs_on_the_cpu_is_reported_once_and_other_warnings_pass(recwarn):
    said = []
    with mps.reporting_fallbacks(lambda op, text: said.append((op, text))):
        for op in ("_linalg_solve_ex.result", "_linalg_solve_ex.result", "upsample_bicubic2d.out"):
            warnings.warn(FALLBACK.format(op), UserWarning, stacklevel=1)
        warnings.warn("something else", UserWarning, stacklevel=1)
    assert [op for op, _ in said] == ["aten::_linalg_solve_ex.result", "aten::upsample_bicubic2d.out"]
    assert "runs on the CPU" in said[0][1]
    assert [str(w.message) for w in recwarn] == ["something else"]
