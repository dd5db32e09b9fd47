"""torchvision without torch.compile's machinery until something compiles: a start-up cut for every trainer process.

torchvision 0.29's `torchvision/ops/roi_align.py` imports `is_compile_supported` from `torch._dynamo.utils` at load
time, and every `import torchvision` loads it (the package imports its ops). That pulls in TorchDynamo and sympy: as
much again as `import torch` itself, paid by each `main.py` process that never compiles anything (upstream meant it
to be lazy: pytorch/vision#8436, "importing dynamo has undesirable side effects for eager mode only users"). While
that one module loads, a stand-in `torch._dynamo.utils` offers it an `is_compile_supported` that imports the real one
when first called; nothing else changes, and `torch.compile`, `torch.export` and the rest load the real TorchDynamo
as before. Where the module's imports differ (another torchvision), the stand-in is not used. Torch-free to install.
"""

from __future__ import annotations

import importlib.abc
import importlib.util
import sys
import types

TARGET = "torchvision.ops.roi_align"
STAND_INS = ("torch._dynamo", "torch._dynamo.utils")


def is_compile_supported(device_type):
    """TorchDynamo's own answer, imported at the first call (roi_align asks only on its deterministic path)."""
    from torch._dynamo.utils import is_compile_supported as real

    return real(device_type)


class _Loader(importlib.abc.Loader):
    def __init__(self, real: importlib.abc.Loader):
        self.real = real

    def create_module(self, spec):
        return self.real.create_module(spec)

    def exec_module(self, module) -> None:
        if any(name in sys.modules for name in STAND_INS):  # the real one is loaded already: nothing to save
            self.real.exec_module(module)
            return
        package, utils = types.ModuleType(STAND_INS[0]), types.ModuleType(STAND_INS[1])
        package.__path__ = []  # a package, so that its submodule can be named
        utils.is_compile_supported = is_compile_supported
        package.utils = utils
        sys.modules.update(dict(zip(STAND_INS, (package, utils))))
        try:
            self.real.exec_module(module)
        except Exception:  # noqa: BLE001 - another torchvision wanting more of TorchDynamo: load it the usual way
            _remove(package, utils)
            self.real.exec_module(module)
        finally:
            _remove(package, utils)


def _remove(*stand_ins) -> None:
    for name, stand_in in zip(STAND_INS, stand_ins):
        if sys.modules.get(name) is stand_in:
            del sys.modules[name]
    torch = sys.modules.get("torch")
    if torch is not None and getattr(torch, "__dict__", {}).get("_dynamo") is stand_ins[0]:
        del torch._dynamo


class _Finder(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name != TARGET:
            return None
        sys.meta_path.remove(self)
        try:
            spec = importlib.util.find_spec(name)
        finally:
            sys.meta_path.insert(0, self)
        if spec is not None and spec.loader is not None:
            spec.loader = _Loader(spec.loader)
        return spec


def install() -> None:
    """Once per process, before torchvision is imported (trainer/__init__.py)."""
    if not any(isinstance(finder, _Finder) for finder in sys.meta_path):
        sys.meta_path.insert(0, _Finder())
