import json
import math
from pathlib import Path

import pytest
import torch
from helpers import run_here, train_here, trusted_model, write_config

from trainer.core.config import ConfigError, ModelConfig, OptimizerConfig, ParamGroupConfig
from trainer.core.events import EVENT_TYPES, read_events
from trainer.model.checkpoint import load_weights_only
from trainer.model.models import apply_init, build_model, create_model
from trainer.train.optim import build_optimizer, build_param_groups


def test_param_groups_get_their_own_lr_and_frozen_groups_stay_put(shapes_dir, tmp_path):
    cfg_path = write_config(tmp_path, shapes_dir, scheduler={"name": "none"}, optimizer={
        "lr": 0.01, "groups": [{"pattern": "fc", "lr": 0.2, "weight_decay": 0.0},
                               {"pattern": "features.0", "freeze": True}]})
    run, code = train_here(cfg_path, tmp_path / "runs")
    assert code == 0
    steps = [e for e in read_events(run.events) if e["event"] == "step"]
    assert steps and all(e["lr"] == [0.2, 0.01] for e in steps)
    start = next(e for e in read_events(run.events) if e["event"] == "run_start")
    assert [g["name"] for g in start["param_groups"]] == ["fc", "default"]

    state = load_weights_only(run.checkpoints / "last.pt")
    # each group's biases and norm weights in a no-decay half (optimizer.norm_weight_decay 0)
    assert [g["lr"] for g in state["optimizer"]["param_groups"]] == [0.2, 0.2, 0.01, 0.01]
    assert [g["weight_decay"] for g in state["optimizer"]["param_groups"]] == [0.0, 0.0, 5e-4, 0.0]
    initial = build_model(ModelConfig(name="small_cnn"), 4, (16, 16), seed=0)[0].state_dict()
    for key in ("features.0.0.weight", "features.0.1.weight", "features.0.1.bias"):
        assert torch.equal(state["model"][key], initial[key]), f"frozen {key} changed"
    assert not torch.equal(state["model"]["fc.weight"], initial["fc.weight"])


@pytest.mark.parametrize("norm_weight_decay", [0.0, None])
def test_norm_weight_decay_spares_norm_weights_and_biases_only(norm_weight_decay):
    model = create_model(ModelConfig(name="resnet18"), 3)
    cfg = OptimizerConfig(name="sgd", lr=0.1, momentum=0.0, weight_decay=0.5, norm_weight_decay=norm_weight_decay)
    optimizer = build_optimizer(build_param_groups(model, cfg), cfg)
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    for p in model.parameters():
        p.grad = torch.zeros_like(p)
    optimizer.step()  # zero gradients: only weight decay moves a parameter, by lr * wd = 5%
    after = dict(model.named_parameters())
    for name in ("bn1.weight", "layer1.0.bn2.bias", "fc.bias"):
        shrink = 1.0 if norm_weight_decay == 0.0 else 0.95
        assert torch.allclose(after[name], before[name] * shrink), name
    for name in ("conv1.weight", "fc.weight"):
        assert torch.allclose(after[name], before[name] * 0.95), name


def test_pattern_matching_nothing_is_an_error():
    model = create_model(ModelConfig(name="small_cnn"), 3)
    with pytest.raises(ConfigError, match=r"optimizer.groups\[1\].pattern: 'layer4\*' matches no parameter, "
                                          r"or only ones an earlier group took \(module names look like: features, fc\)"):
        build_param_groups(model, OptimizerConfig(groups=[ParamGroupConfig(pattern="fc"),
                                                          ParamGroupConfig(pattern="layer4*")]))


def test_group_settings_reach_the_torch_optimizer():
    model = create_model(ModelConfig(name="resnet18"), 5)
    cfg = OptimizerConfig(name="nesterov", lr=0.01, momentum=0.8, norm_weight_decay=None, groups=[
        ParamGroupConfig(pattern="fc", lr=0.5, momentum=0.5), ParamGroupConfig(pattern="layer4.*", weight_decay=0.1)])
    opt = build_optimizer(build_param_groups(model, cfg), cfg)
    fc, layer4, default = opt.param_groups
    assert (fc["lr"], fc["momentum"], fc["nesterov"]) == (0.5, 0.5, True)
    assert len(fc["params"]) == 2 and fc["params"][0] is model.fc.weight
    assert layer4["weight_decay"] == 0.1 and layer4["lr"] == 0.01
    assert sum(p.numel() for p in layer4["params"]) == sum(p.numel() for p in model.layer4.parameters())
    assert default["momentum"] == 0.8
    assert sum(len(g["params"]) for g in opt.param_groups) == len(list(model.parameters()))


@pytest.mark.parametrize("scheme", ["xavier_uniform", "xavier_normal", "kaiming_normal", "normal", "constant"])
def test_init_schemes_change_the_weights_as_named(scheme):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Conv2d(16, 64, 3), torch.nn.Linear(256, 128))
    before = [p.clone() for p in model.parameters()]
    apply_init(model, scheme)
    conv, linear = model[0].weight, model[1].weight
    assert not torch.equal(conv, before[0])
    assert torch.all(model[0].bias == 0) and torch.all(model[1].bias == 0)
    fan_in, fan_out = 16 * 9, 64 * 9
    if scheme == "xavier_uniform":
        bound = math.sqrt(6 / (fan_in + fan_out))
        assert conv.abs().max() <= bound and conv.abs().max() > 0.9 * bound
    elif scheme == "xavier_normal":
        assert conv.std().item() == pytest.approx(math.sqrt(2 / (fan_in + fan_out)), rel=0.05)
    elif scheme == "kaiming_normal":
        assert conv.std().item() == pytest.approx(math.sqrt(2 / fan_out), rel=0.05)
    elif scheme == "normal":
        assert linear.std().item() == pytest.approx(0.01, rel=0.05) and abs(linear.mean().item()) < 1e-3
    elif scheme == "constant":
        assert torch.all(conv == 0.01) and torch.all(linear == 0.01)


def test_events_have_every_type_with_documented_fields(shapes_dir, tmp_path):
    data = tmp_path / "data"
    import shutil

    shutil.copytree(shapes_dir, data)
    (data / "circle" / "broken.png").write_bytes(b"")
    cfg_path = write_config(tmp_path, data, train={"epochs": 2}, monitor={"log_every": 2, "histogram_every": 4})
    run, code = train_here(cfg_path, tmp_path / "runs")
    assert code == 0
    events = read_events(run.events)
    assert all(e["v"] == 1 and "time" in e for e in events)
    by_type = {}
    for e in events:
        by_type.setdefault(e["event"], []).append(e)
    start = by_type["run_start"][0]
    assert start["classes"] == ["circle", "cross", "square", "triangle"]
    assert start["train_size"] + start["val_size"] == 120
    assert start["world_size"] == 1 and start["device"] == "cpu" and start["config"]["train"]["epochs"] == 2
    step = by_type["step"][0]
    assert {"step", "epoch", "loss", "lr", "images_per_s", "grad_norm"} <= step.keys()
    assert step["images_per_s"] > 0 and math.isfinite(step["loss"]) and len(step["lr"]) == 1
    stats = by_type["grad_stats"][0]
    assert len(stats["grad_norm"]) == len(start["layers"]) == len(stats["update_ratio"])
    epochs = by_type["epoch"]
    assert [e["epoch"] for e in epochs] == [1, 2]
    ep = epochs[-1]
    assert {"train_loss", "val_loss", "val_acc", "per_class_acc", "confusion"} <= ep.keys()
    assert len(ep["per_class_acc"]) == 4 and sum(map(sum, ep["confusion"])) == start["val_size"]
    assert "val_top5" not in ep, "top-5 only with more than 5 classes"
    assert by_type["checkpoint"][-1]["epoch"] == 2
    warning = by_type["warning"][0]
    assert warning["kind"] == "bad_files" and warning["files"][0]["path"].endswith("broken.png")
    assert "empty file" in warning["files"][0]["reason"]
    assert by_type["run_end"][-1]["status"] == "completed"
    # the others: test_evaluation.py, test_auto.py, tests/remote/test_slurm_runs.py, test_distributed.py
    assert set(by_type) >= set(EVENT_TYPES) - {"error", "system", "test", "export", "replan", "restart"}
    assert json.loads(run.status_file.read_text())["state"] == "completed"
    assert "broken.png" in run.log.read_text()


def test_failed_run_writes_error_event_and_status(shapes_dir, tmp_path):
    name = trusted_model(tmp_path / "net.py", "import torch\nclass Net(torch.nn.Module):\n"
                         "    def __init__(self, num_classes):\n        super().__init__()\n"
                         "        self.fc = torch.nn.Linear(3, num_classes + 1)\n"
                         "    def forward(self, x):\n        return self.fc(x.mean((2, 3)))\n")
    cfg_path = write_config(tmp_path, shapes_dir, model={"name": name})
    run, code = train_here(cfg_path, tmp_path / "runs")
    assert code == 2
    events = read_events(run.events)
    error = next(e for e in events if e["event"] == "error")
    assert "outputs (2, 5) for a batch of 2, expected (2, 4)" in error["message"]
    assert events[-1]["event"] == "run_end" and events[-1]["status"] == "failed"
    assert run.read_status()["state"] == "failed" and "expected (2, 4)" in run.read_status()["message"]


def test_best_and_last_checkpoints_are_written_and_load_safely(shapes_dir, tmp_path):
    cfg_path = write_config(tmp_path, shapes_dir, train={"epochs": 3}, checkpoint={"keep_last": 2})
    run, code = train_here(cfg_path, tmp_path / "runs")
    assert code == 0
    last = load_weights_only(run.checkpoints / "last.pt")
    best = load_weights_only(run.checkpoints / "best.pt")
    assert last["epoch"] == 3 and last["classes"] == ["circle", "cross", "square", "triangle"]
    epochs = [e for e in read_events(run.events) if e["event"] == "epoch"]
    best_epoch = max(epochs, key=lambda e: e["val_acc"])
    assert best["best_acc"] == pytest.approx(best_epoch["val_acc"])
    numbered = sorted(p.name for p in run.checkpoints.glob("ckpt-*.pt"))
    assert len(numbered) == 2 and numbered[-1].startswith("ckpt-e0003")
    assert not list(run.checkpoints.glob(".*")), "no temporary files left"
    model = create_model(ModelConfig(name="small_cnn"), 4)
    model.load_state_dict(last["model"])  # plain keys, no wrapper prefixes


def test_print_in_user_model_does_not_corrupt_events(shapes_dir, tmp_path):

    name = trusted_model(tmp_path / "noisy.py", "import torch\nclass Noisy(torch.nn.Module):\n"
                         "    def __init__(self, num_classes=2):\n        super().__init__()\n"
                         "        self.fc = torch.nn.Linear(3, num_classes)\n"
                         "    def forward(self, x):\n        print('{\"event\": broken', flush=True)\n"
                         "        return self.fc(x.mean((2, 3)))\n", "Noisy")
    cfg_path = write_config(tmp_path, shapes_dir, model={"name": name}, train={"epochs": 1})
    result = run_here("train", cfg_path, "--runs-dir", tmp_path / "runs")
    assert result.returncode == 0, result.stderr
    assert '{"event": broken' in result.stdout
    run_dir = next((tmp_path / "runs").iterdir())
    lines = (run_dir / "events.jsonl").read_text().splitlines()
    assert all(json.loads(line)["event"] for line in lines)


def test_every_event_type_is_declared_once_and_documented():
    """EVENT_TYPES is the contract: docs/events.md has a section for each (replan was emitted and not declared), and
    the writer refuses an event outside it."""
    import re
    import tempfile

    from trainer.core.events import EventWriter

    docs = (Path(__file__).resolve().parent.parent / "docs" / "events.md").read_text(encoding="utf-8")
    assert set(re.findall(r"^### `(\w+)`", docs, re.M)) == set(EVENT_TYPES)
    with tempfile.TemporaryDirectory() as folder:
        writer = EventWriter(Path(folder) / "events.jsonl")
        with pytest.raises(ValueError, match="'replanned' is not one of EVENT_TYPES"):
            writer.emit("replanned")
        writer.close()


def test_the_built_in_resnet10t_is_timms_network_without_timm():
    """model.name resnet10t (built in, for every install): timm's resnet10t tensor for tensor (the same shapes, the
    same parameters, the same operations per image), each block starting as the identity."""
    timm = pytest.importorskip("timm")
    from torch.utils.flop_counter import FlopCounterMode

    ours = create_model(ModelConfig(name="resnet10t"), 5)
    theirs = timm.create_model("resnet10t", num_classes=5)
    shapes = lambda net: sorted(tuple(p.shape) for p in net.state_dict().values() if p.dim())  # noqa: E731
    assert shapes(ours) == shapes(theirs)
    assert sum(p.numel() for p in ours.parameters()) == sum(p.numel() for p in theirs.parameters())

    def flops(net):
        with FlopCounterMode(display=False) as counter, torch.no_grad():
            net.eval()(torch.zeros(1, 3, 64, 64))
        return counter.get_total_flops()

    assert flops(ours) == flops(theirs)
    zeroed = [m for m in ours.modules() if isinstance(m, torch.nn.BatchNorm2d) and not m.weight.any()]
    assert len(zeroed) == 4, "each block's last BatchNorm starts at zero"
