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
