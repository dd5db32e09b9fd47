"""Network programs for PyTorch consumers: `exported_program` (torch.export, the default) and `torchscript`
(deprecated, still written and loaded for the programs people have)."""

from __future__ import annotations

import inspect
import logging
import warnings
from pathlib import Path

MAX_BATCH = 4096  # the exported program's dynamic batch dimension


def _example(context):
    import torch

    return torch.zeros(2, 3, *context.frame.shape)


def write_exported_program(model, path: Path, context) -> None:
    import torch

    batch = torch.export.Dim("batch", min=1, max=MAX_BATCH)
    arg = next(iter(inspect.signature(model.forward).parameters), "x")
    program = torch.export.export(model, (_example(context),),
                                  dynamic_shapes={"x": {0: batch}} if arg == "x" else ({0: batch},))
    torch.export.save(program, path)


def load_exported_program(path: Path, meta: dict):
    import torch

    from trainer.deploy.formats.container import check_program

    check_program(path)  # nothing in it that torch.export.load would unpickle in full
    quiet = logging.getLogger("torch.export")
    level = quiet.level
    quiet.setLevel(logging.ERROR)  # it logs its own traceback for a damaged file before raising
    try:
        return torch.export.load(str(path)).module()
    finally:
        quiet.setLevel(level)


def snippets_exported_program(name: str, model_name: str, classes: int, shape: tuple[int, int]) -> dict[str, str]:
    return {"PyTorch (Python)": f'import torch\nmodel = torch.export.load("{name}").module()\n'
                                "logits = model(x)  # x: float32 torch tensor"}


def write_torchscript(model, path: Path, context) -> None:  # deprecated: torch warns on each call
    import torch

    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", category=FutureWarning, module="torch.jit")
        torch.jit.save(torch.jit.trace(model, _example(context)), str(path))


def load_torchscript(path: Path, meta: dict):
    import torch

    from trainer.deploy.formats.container import check_torchscript

    check_torchscript(path)  # its pickles name only TorchScript's own classes and tensors

    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", category=FutureWarning, module="torch.jit")
        return torch.jit.load(str(path))


def snippets_torchscript(name: str, model_name: str, classes: int, shape: tuple[int, int]) -> dict[str, str]:
    return {"PyTorch (Python)": f'import torch\nmodel = torch.jit.load("{name}")\nlogits = model(x)',
            "LibTorch (C++)": f'auto model = torch::jit::load("{name}");\n'
                              "std::vector<torch::jit::IValue> inputs{x};\n"
                              "auto logits = model.forward(inputs).toTensor();"}
