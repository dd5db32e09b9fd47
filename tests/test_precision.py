"""`train.amp: auto` picks bf16 only where the hardware runs it natively; explicit settings are kept."""

from pathlib import Path

import pytest
import torch

from trainer.device.precision import choose_precision


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

from trainer.core.events import read_events  # noqa: E402
from trainer.device.precision import Precision  # noqa: E402
from trainer.device.strategy import Strategy  # noqa: E402
from trainer.model.checkpoint import load_weights_only  # noqa: E402
from trainer.train.stats import GradMonitor  # noqa: E402


@pytest.mark.slow
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
    from trainer.core.config import DeviceConfig

    model = torch.nn.Linear(4, 2)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    precision = Precision("fp32", OtherRankSaysNonFinite(DeviceConfig()))
    before = model.weight.detach().clone()
    torch.nn.functional.cross_entropy(model(torch.randn(3, 4)), torch.tensor([0, 1, 0])).backward()
    result = precision.step(optimizer, GradMonitor(model), clip=None, need_norms=True, on_nonfinite="skip")
    assert result.skipped
    assert torch.equal(model.weight, before) and model.weight.grad is None


def test_auto_memory_format_is_channels_last_only_where_it_is_faster(monkeypatch):
    from trainer.model.models import SmallCNN, choose_memory_format

    model, cpu, gpu = SmallCNN(4), torch.device("cpu"), torch.device("cuda", 0)
    monkeypatch.setattr(torch.backends.cpu, "get_cpu_capability", lambda: "AVX2")
    assert choose_memory_format("auto", "small_cnn", model, cpu) == torch.contiguous_format
    assert choose_memory_format("auto", "small_cnn", model, gpu) == torch.channels_last
    assert choose_memory_format("channels_last", "small_cnn", model, cpu) == torch.channels_last
    monkeypatch.setattr(torch.backends.cpu, "get_cpu_capability", lambda: "AVX512")
    assert choose_memory_format("auto", "small_cnn", model, cpu) == torch.channels_last
    assert choose_memory_format("auto", "mine.py:Net", model, gpu) == torch.contiguous_format, "your own model"


@pytest.mark.slow  # a residual network in emulated fp16
def test_fp16_resnet_survives_an_overflow_on_its_first_step():
    """The fp16 NaN of issue #22: a resnet (resnet18's blocks, one of each: fp16 convolutions' backward is emulated
    on a CPU, 29 s for resnet18's four steps), fused SGD with momentum, and a first step whose gradients overflow
    (as resnet18's did on real photos at the initial loss scale). Fused SGD created its momentum buffers with
    `empty_like` on that skipped step and never wrote them, so the next step added garbage to the weights. The
    weights must instead follow plain (non-fused) SGD with the same GradScaler, for which the skipped step never
    happened."""
    import copy

    import torchvision

    from trainer.core.config import DeviceConfig, OptimizerConfig
    from trainer.train.optim import build_optimizer

    torch.manual_seed(0)
    net = torchvision.models.resnet.ResNet(torchvision.models.resnet.BasicBlock, [1, 1, 1, 1], num_classes=4)
    reference = copy.deepcopy(net)
    precision = Precision("fp16", Strategy(DeviceConfig()))
    optimizer = build_optimizer([{"params": list(net.parameters())}], OptimizerConfig(lr=0.05, momentum=0.9))
    assert optimizer.defaults["fused"], "the optimizer the trainer builds"
    ref_optimizer = torch.optim.SGD(reference.parameters(), lr=0.05, momentum=0.9, foreach=False,
                                    weight_decay=optimizer.defaults["weight_decay"])
    ref_scaler = torch.amp.GradScaler("cpu")
    monitor = GradMonitor(net)
    x, y = torch.randn(8, 3, 32, 32), torch.tensor([0, 1, 2, 3] * 2)
    applied = 0
    for step in range(4):
        for model, backward in ((net, precision.backward), (reference, lambda loss: ref_scaler.scale(loss).backward())):
            with torch.autocast("cpu", dtype=torch.float16):
                loss = torch.nn.functional.cross_entropy(model(x), y)
            backward(loss)
            if step == 0:  # an overflow: the scaler must skip this step
                model.conv1.weight.grad[0, 0, 0, 0] = float("inf")
        result = precision.step(optimizer, monitor, clip=None, need_norms=True, on_nonfinite="stop")
        ref_scaler.step(ref_optimizer)
        ref_scaler.update()
        ref_optimizer.zero_grad()
        applied += bool(result.total_norm.isfinite())
    assert precision.scaler.get_scale() == ref_scaler.get_scale() < 65536.0, "each overflow halved the scale"
    assert applied >= 2, "later steps were applied"
    for (name, p), q in zip(net.named_parameters(), reference.parameters()):
        assert torch.isfinite(p).all(), name
        torch.testing.assert_close(p, q, atol=1e-4, rtol=1e-3, msg=lambda m, name=name: f"{name}: {m}")
