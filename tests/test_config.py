import pytest
import yaml
from helpers import run_here, write_config

from trainer.core.config import ConfigError, RunConfig, describe_keys, load_config, save_config


def test_round_trip_keeps_every_key(tmp_path):
    cfg = RunConfig.from_dict({"optimizer": {"groups": [{"pattern": "fc", "lr": 0.1}]}, "train": {"amp": "bf16"}})
    path = tmp_path / "c.yaml"
    save_config(cfg, path)
    again = load_config(path)
    assert again.to_dict() == cfg.resolve_paths(tmp_path).to_dict()
    assert again.optimizer.groups[0].lr == 0.1
    assert again.train.amp == "bf16"


@pytest.mark.parametrize("raw, message", [
    ({"optimizer": {"groups": [{"pattern": "fc", "lr": -3}]}}, "optimizer.groups[0].lr: must be > 0, got -3"),
    ({"optimizer": {"name": "sgdd"}}, "optimizer.name: must be one of sgd, nesterov"),
    ({"data": {"batch_size": 0}}, "data.batch_size: must be >= 1, got 0"),
    ({"data": {"image_size": 4096}}, "data.image_size: must be <= 1024, got 4096"),
    ({"data": {"batch_size": "big"}}, "data.batch_size: must be an integer, got 'big'"),
    ({"data": {"batchsize": 3}}, "data.batchsize: unknown key"),
    ({"trian": {}}, "trian: unknown key"),
    ({"train": {"amp": "fp8"}}, "train.amp: must be one of auto, none, bf16, fp16; got 'fp8'"),
    ({"train": {"epochs": True}}, "train.epochs: must be an integer, got True"),
    ({"data": {"mean": [0.5, 0.5]}}, "data.mean: must be auto or have 3 values"),
    ({"data": {"std": [0.5, 0, 0.5]}}, "data.std: must be auto or have 3 values > 0"),
    ({"optimizer": {"groups": [{"pattern": ""}]}}, "optimizer.groups[0].pattern: must not be empty"),
    ({"optimizer": {"groups": "fc"}}, "optimizer.groups: must be a list of a mapping, got 'fc'"),
    ({"device": {"parallel": "dp"}}, "device.parallel: dp (DataParallel) needs device.type cuda"),
    ({"device": {"parallel": "ddp", "backend": "nccl"}}, "device.backend: nccl needs device.type cuda"),
    ({"device": {"nnodes": 2, "node_rank": 2, "master_port": 1234}}, "device.node_rank: must be < device.nnodes"),
    ({"device": {"nnodes": 2}}, "device.master_port: multi-node runs need a fixed port"),
    ({"train": {"seed": 2**63}}, "train.seed: must be <= 4294967295, got 9223372036854775808"),
    ({"optimizer": {"weight_decay": float("inf")}}, "optimizer.weight_decay: must be a finite number, got inf"),
    ({"optimizer": {"lr": "3e-4x"}}, "optimizer.lr: must be a number, got '3e-4x'"),
    ({"device": {"parallel": "ddp", "launcher": "horovod", "nnodes": 2, "master_port": 1234}},
     "device.launcher: horovod runs start on one machine here"),
    ({"data": {"val_split": 1.0}}, "data.val_split: must be < 1, got 1.0"),
    ("just a string", "config: must be a mapping"),
])
def test_invalid_values_name_key_and_value(raw, message):
    with pytest.raises(ConfigError) as err:
        RunConfig.from_dict(raw)
    assert message in str(err.value)


def test_all_problems_reported_at_once():
    with pytest.raises(ConfigError) as err:
        RunConfig.from_dict({"data": {"batch_size": -1, "image_size": 2}, "bogus": 1})
    assert len(err.value.problems) == 3


def test_overrides_parse_yaml_values(tmp_path):
    path = write_config(tmp_path, tmp_path)
    cfg = load_config(path, ["optimizer.lr=0.3", "train.amp=bf16", "device.gpus=[0, 1]", "model.weights="])
    assert cfg.optimizer.lr == 0.3 and cfg.train.amp == "bf16" and cfg.device.gpus == [0, 1]
    assert cfg.model.weights is None
    with pytest.raises(ConfigError, match="optimizer.lr: must be > 0, got -1"):
        load_config(path, ["optimizer.lr=-1"])
    with pytest.raises(ConfigError, match="expected key.path=value"):
        load_config(path, ["optimizer.lr"])


def test_relative_paths_resolve_against_the_config_file(tmp_path):
    (tmp_path / "sub").mkdir()
    path = tmp_path / "sub" / "c.yaml"
    path.write_text(yaml.safe_dump({"data": {"train_dir": "../images"}, "model": {"name": "nets/m.py:Net"}}))
    cfg = load_config(path)
    assert cfg.data.train_dir == str(tmp_path / "images")
    assert cfg.model.name == f"{tmp_path / 'sub' / 'nets' / 'm.py'}:Net"


def test_invalid_yaml_names_file_and_line(tmp_path):
    path = tmp_path / "bad.yaml"
    path.write_text("data:\n  batch_size: [1, 2\n")
    with pytest.raises(ConfigError) as err:
        load_config(path)
    assert str(path) in str(err.value) and "line" in str(err.value)


def test_every_key_is_documented():
    doc = (__import__("pathlib").Path(__file__).parent.parent / "docs" / "config.md").read_text()
    for key, _, _, description in describe_keys():
        assert description, key
        assert f"`{key}`" in doc, f"{key} missing from docs/config.md"


def test_cli_exits_2_with_the_key_path(tmp_path):
    path = write_config(tmp_path, tmp_path, optimizer={"lr": -3})
    result = run_here("train", path, "--runs-dir", tmp_path / "runs")
    assert result.returncode == 2
    assert "optimizer.lr: must be > 0, got -3" in result.stderr
    assert not (tmp_path / "runs").exists(), "no run directory for a config that never started"


FLOAT_KEYS = [path for path, kind, _, _ in describe_keys() if kind in ("a number", "a number or null")]


@pytest.mark.parametrize("key", FLOAT_KEYS)
@pytest.mark.parametrize(("text", "value"), [("1e-3", 1e-3), ("3E-4", 3e-4), (".5", 0.5), ("1_000", 1000.0),
                                             ("1.0e12", 1e12), ("1e12", 1e12), ("-2.5e-1", -0.25)])
def test_every_float_key_reads_the_notations_users_write(tmp_path, key, text, value):
    """YAML 1.1 leaves 3e-4 and friends as strings; the config reads them as numbers, in files and in --set."""
    section, name = key.rsplit(".", 1)
    path = tmp_path / "c.yaml"
    path.write_text(f"{section.replace('.', ': {')}: {{{name}: {text}}}" + "}" * section.count(".") + "\n")
    for cfg in (lambda: load_config(path), lambda: load_config(tmp_path / "empty.yaml", [f"{key}={text}"])):
        (tmp_path / "empty.yaml").write_text("")
        try:
            got = cfg()
        except ConfigError as e:  # only a range check may refuse the value, never its notation
            assert all("must be a number" not in p for p in e.problems), e.problems
            continue
        obj = got
        for part in key.split("."):
            obj = getattr(obj, part)
        assert obj == pytest.approx(value)


def test_every_set_option_counts_not_only_the_last():
    """`--set a=1 --set b=2` as a user writes it: both apply (argparse's default kept only the last --set)."""
    from trainer.cli import build_parser

    for command in (["train", "c.yaml"], ["auto", "folder", "--minutes", "1"]):
        args = build_parser().parse_args(command + ["--set", "train.epochs=3", "--set", "train.amp=none",
                                                    "data.batch_size=8"])
        assert args.set == ["train.epochs=3", "train.amp=none", "data.batch_size=8"], command


def test_every_parallel_mode_the_device_page_offers_is_a_config_the_trainer_takes():
    from trainer.core.catalog import PARALLEL_MODES
    from trainer.core.config import key_choices

    assert {p for _, p, _ in PARALLEL_MODES} == set(key_choices("device.parallel"))
    assert {launcher for _, _, launcher in PARALLEL_MODES} == set(key_choices("device.launcher"))
    for label, parallel, launcher in PARALLEL_MODES:  # (dp asks for CUDA, which is this machine's to say)
        device = {"parallel": parallel, "launcher": launcher, **({"type": "cuda"} if parallel == "dp" else {})}
        problems = []
        try:
            RunConfig.from_dict({"device": device})
        except ConfigError as e:
            problems = [p for p in e.problems if "parallel" in p.split(":")[0] or "launcher" in p.split(":")[0]]
        assert not problems, (label, problems)
