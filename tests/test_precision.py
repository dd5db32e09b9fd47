"""`train.amp: auto` picks bf16 only where the hardware runs it natively; explicit settings are kept."""

from pathlib import Path

import pytest
import torch

from trainer.strategy import choose_precision


def cpu_flags() -> set[str]:
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("flags"):
            return set(line.split(":", 1)[1].split())
    return set()


@pytest.mark.parametrize(("avx512_bf16", "amx", "expected"), [(False, False, "fp32"), (True, False, "bf16"),
                                                               (False, True, "bf16")])
def test_auto_on_cpu_follows_its_bf16_instructions(monkeypatch, avx512_bf16, amx, expected):
    monkeypatch.setattr(torch.cpu, "_is_avx512_bf16_supported", lambda: avx512_bf16)
    monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda: amx)
    precision, why = choose_precision("auto", torch.device("cpu"))
    assert precision == expected and why.startswith("auto: this CPU")


@pytest.mark.parametrize(("native", "expected"), [(False, "fp32"), (True, "bf16")])
def test_auto_on_a_gpu_uses_bf16_only_when_native(monkeypatch, native, expected):
    asked = {}

    def is_bf16_supported(including_emulation=True):
        asked["emulation"] = including_emulation
        return native

    monkeypatch.setattr(torch.cuda, "is_bf16_supported", is_bf16_supported)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "Some GPU")
    precision, why = choose_precision("auto", torch.device("cuda", 0))
    assert precision == expected and "Some GPU" in why and asked["emulation"] is False  # emulated bf16 is slow


def test_explicit_settings_win_over_the_hardware(monkeypatch):
    monkeypatch.setattr(torch.cpu, "_is_avx512_bf16_supported", lambda: False)
    monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda: False)
    cpu = torch.device("cpu")
    assert choose_precision("none", cpu)[0] == "fp32"
    assert choose_precision("bf16", cpu)[0] == "bf16"


def test_auto_on_this_machine_matches_its_cpu_flags():
    flags = cpu_flags()
    expected = "bf16" if {"avx512_bf16", "amx_bf16"} & flags else "fp32"
    assert choose_precision("auto", torch.device("cpu"))[0] == expected


# ---- fp16 with a GradScaler, on CPU (torch.autocast("cpu", float16) + torch.amp.GradScaler("cpu")) ----

from helpers import poisoned_model, train_here, write_config  # noqa: E402

from trainer.checkpoint import load_weights_only  # noqa: E402
from trainer.events import read_events  # noqa: E402
from trainer.stats import GradMonitor  # noqa: E402
from trainer.strategy import Precision, Strategy  # noqa: E402


def test_fp16_on_cpu_trains_as_well_as_bf16(shapes_dir, tmp_path):
    cfg = write_config(tmp_path, shapes_dir, train={"epochs": 4}, optimizer={"lr": 0.05})
    best, runs = {}, {}
    for amp in ("fp16", "bf16"):
        run, code = train_here(cfg, tmp_path / amp, [f"train.amp={amp}"])
        assert code == 0, run.tail_log()
        start = next(e for e in read_events(run.events) if e["event"] == "run_start")
        assert start["precision"] == amp
        best[amp], runs[amp] = run.read_status()["best_acc"], run
    assert best["fp16"] >= 0.45 and abs(best["fp16"] - best["bf16"]) <= 0.15, best  # chance is 0.25
    assert load_weights_only(runs["fp16"].checkpoints / "last.pt")["scaler"]["scale"] > 0


@pytest.mark.parametrize("policy", ["stop", "skip"])
def test_fp16_overflows_are_loss_scaling_not_divergence(shapes_dir, tmp_path, policy):
    """An overflowing fp16 gradient (here on steps 2 and 4, both log steps) makes the scaler skip that step and
    halve its scale: the run completes in either policy, and in skip mode the scaler still updates every step."""
    model = poisoned_model(tmp_path, "inf", (2, 4))
    cfg = write_config(tmp_path, shapes_dir, model={"name": model},
                       train={"epochs": 2, "amp": "fp16", "on_nonfinite": policy}, monitor={"log_every": 2})
    run, code = train_here(cfg, tmp_path / "runs")
    assert code == 0, run.tail_log()
    assert run.read_status()["state"] == "completed"
    scale = load_weights_only(run.checkpoints / "last.pt")["scaler"]["scale"]
    assert scale == 65536.0 / 4, "each overflow halved the loss scale once"
    assert not [e for e in read_events(run.events) if e["event"] == "error"]


class OtherRankSaysNonFinite(Strategy):
    """A one-process strategy whose all-reduce brings in another rank's non-finite flag."""

    def all_reduce_max(self, tensor):
        return torch.ones_like(tensor)


def test_the_skip_decision_is_the_all_reduced_one():
    """Local gradients are finite, another rank's are not: this rank skips too, and does not step."""
    from trainer.config import DeviceConfig

    model = torch.nn.Linear(4, 2)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    precision = Precision("fp32", OtherRankSaysNonFinite(DeviceConfig()))
    before = model.weight.detach().clone()
    torch.nn.functional.cross_entropy(model(torch.randn(3, 4)), torch.tensor([0, 1, 0])).backward()
    result = precision.step(optimizer, GradMonitor(model), clip=None, need_norms=True, on_nonfinite="skip")
    assert result.skipped
    assert torch.equal(model.weight, before) and model.weight.grad is None


def test_auto_memory_format_is_channels_last_only_where_it_is_faster(monkeypatch):
    from trainer.models import SmallCNN, choose_memory_format

    model, cpu, gpu = SmallCNN(4), torch.device("cpu"), torch.device("cuda", 0)
    monkeypatch.setattr(torch.backends.cpu, "get_cpu_capability", lambda: "AVX2")
    assert choose_memory_format("auto", "small_cnn", model, cpu) == torch.contiguous_format
    assert choose_memory_format("auto", "small_cnn", model, gpu) == torch.channels_last
    assert choose_memory_format("channels_last", "small_cnn", model, cpu) == torch.channels_last
    monkeypatch.setattr(torch.backends.cpu, "get_cpu_capability", lambda: "AVX512")
    assert choose_memory_format("auto", "small_cnn", model, cpu) == torch.channels_last
    assert choose_memory_format("auto", "mine.py:Net", model, gpu) == torch.contiguous_format, "your own model"
