"""Issue #70: each command the app runs is declared once (trainer/runs/commands.py), and both `main.py`'s parser
and the command line the app runs come from that declaration."""

import dataclasses

import pytest

from trainer.cli import build_parser
from trainer.runs.commands import DECLARED, Audit, DescribeModel, Export, LrFind, Predict


def subparser(name: str):
    parser = build_parser()
    sub = next(a for a in parser._actions if a.dest == "command")
    return parser, sub.choices[name]


@pytest.mark.parametrize("command", DECLARED, ids=lambda c: c.NAME)
def test_main_py_s_parser_for_a_declared_command_is_its_declaration(command):
    _, parser = subparser(command.NAME)
    dests = {a.dest for a in parser._actions} - {"help", "model_code"}
    assert dests == {f.name for f in dataclasses.fields(command)}, "the CLI has what the declaration has, no more"
    for f in dataclasses.fields(command):
        action = next(a for a in parser._actions if a.dest == f.name)
        if "flag" in f.metadata:
            assert action.option_strings == [f.metadata["flag"]]
        if f.default is not dataclasses.MISSING:
            assert action.default == f.default, f"{command.NAME} {f.name}: the CLI's default is the declaration's"


@pytest.mark.parametrize("request_", [
    LrFind(config="/c.yaml", json=True, start=0.00123456789, end=3e-4, set=["optimizer.lr=0.1"]),
    Audit(run_dir="/runs/r", map=True, json=True, folds=7),
    Export(run_dir="/runs/r", format="onnx_int8", out="/x/m.onnx", calibration="/cal", checkpoint="last"),
    Predict(model="/runs/r", images=["/a.png", "/b dir"], top=3, json=True),
    DescribeModel(name="resnet18", classes=4, weights="DEFAULT"),
    DescribeModel(store=True),
], ids=lambda r: r.NAME)
def test_the_command_line_a_client_runs_parses_back_to_the_same_request(request_):
    """What the app asks is what the command reads: every field through argv() and main.py's parser unchanged
    (a float exactly: 0.00123456789 was cut to 0.00123457 by a hand-written '%.6g')."""
    parser, _ = subparser(request_.NAME)
    args = parser.parse_args(request_.argv())
    assert args.command == request_.NAME
    for f in dataclasses.fields(request_):
        assert getattr(args, f.name) == getattr(request_, f.name), f.name


def test_a_request_names_only_what_the_command_takes():
    with pytest.raises(TypeError):
        LrFind(config="/c.yaml", lr=0.1)  # not an argument of lr-find: refused where it is written
    with pytest.raises(TypeError):
        Export(run_dir="/runs/r")  # --out is required: refused before a process starts


def test_no_command_line_of_a_declared_command_is_written_by_hand():
    """No list in app/ or trainer/ (but the declarations) starts with a declared command's name: its command line
    comes from its declaration."""
    import ast

    from helpers import REPO

    names = {c.NAME for c in DECLARED}
    by_hand = []
    for root in ("app", "trainer"):
        for path in (REPO / root).rglob("*.py"):
            if path.name == "commands.py":
                continue
            for node in ast.walk(ast.parse(path.read_text())):
                if (isinstance(node, ast.List) and node.elts and isinstance(node.elts[0], ast.Constant)
                        and node.elts[0].value in names):
                    by_hand.append(f"{path.relative_to(REPO)}:{node.lineno} [{node.elts[0].value!r}, ...]")
    assert not by_hand, by_hand
