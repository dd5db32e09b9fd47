"""The code of each export format, one module per family; `trainer.core.catalog.EXPORT_REGISTRY` declares them.

A format NAME's module has `write_NAME(model, path, context)`, `load_NAME(path, meta)` and
`snippets_NAME(name, model_name, classes, (height, width))`, and where it differs from the default, `runtime_NAME()`,
`runs_here_NAME()`, `check_NAME(path, (height, width), classes)` (a file that cannot run here) and `not_measured_NAME()`.
Modules import torch inside their functions, so the model card (torch-free) can ask for a format's snippets.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Any

from trainer.core.catalog import EXPORT_REGISTRY


@dataclass
class WriteContext:
    """What a writer may need besides the network and the path: the reference it is measured against (its
    preprocessing and classes), the run, export's options (int8), and a folder for intermediate files."""

    reference: Any
    run: Any
    options: Any
    work: Any

    @property
    def frame(self):
        """The network's input frame (trainer.data.frame.Frame): the shape of every example input."""
        return self.reference.preprocess.frame


def part(fmt: str, what: str, default=None):
    """The function `WHAT_FMT` of a format's module, or `default` where the module has none."""
    module = importlib.import_module(EXPORT_REGISTRY[fmt].module)
    return getattr(module, f"{what}_{fmt}", default)


def runtime(fmt: str) -> str:
    """What runs a format here, with its version, for the card."""
    return part(fmt, "runtime", torch_runtime)()


def runs_here(fmt: str) -> bool:
    """Whether an export of `fmt` can be run (and so measured) on this machine."""
    return part(fmt, "runs_here", lambda: True)()


def torch_runtime() -> str:
    import torch

    return f"torch {torch.__version__}, CPU, fp32, {torch.get_num_threads()} threads"
