"""TorchDynamo loaded when something uses it, not when an eager process merely touches it: a start-up cut for every
trainer process that compiles nothing.

Two places in torch and torchvision load TorchDynamo (and sympy with it) without using it: torchvision 0.29's
`torchvision/ops/roi_align.py` imports `is_compile_supported` from `torch._dynamo.utils` when torchvision loads
(upstream meant it to be lazy: pytorch/vision#8436, "importing dynamo has undesirable side effects for eager mode
only users"), and torch.optim's first step, `zero_grad` and `state_dict` import it to call `graph_break()` and
`disable(fn)`, which do nothing outside a compiled region (and none can run before TorchDynamo is loaded). Each is
about as much again as `import torch` itself (docs/benchmarks.md, "Start-up").

So `torch._dynamo` is first a stand-in (`_StandIn`): it answers those three itself, and anything else asked of it (or
of `torch._dynamo.utils`), any other submodule imported, loads the real TorchDynamo at that moment (`real()`) and
forwards there from then on; the stand-ins leave `sys.modules`, so `torch.compile`, `torch.export` and every later
`import torch._dynamo` get the real one, and a function `disable` wrapped before it loaded runs TorchDynamo's own
`disable` from then on. Torch-free to install; `install()` once per process, before torch is imported.
"""

from __future__ import annotations

import functools
import importlib
import importlib.abc
import importlib.util
import sys
import threading
import types

NAME = "torch._dynamo"
UTILS = "torch._dynamo.utils"

_lock = threading.RLock()
_real: types.ModuleType | None = None
_loading = False  # the real one is being imported: the finder stands aside


def loaded() -> bool:
    """Whether the real TorchDynamo has been loaded in this process."""
    return _real is not None


def real() -> types.ModuleType:
    """The real `torch._dynamo`, imported at the first call (the stand-ins leave `sys.modules`)."""
    global _real, _loading
    with _lock:
        if _real is None:
            stand_ins = {name: sys.modules.pop(name) for name in (UTILS, NAME)
                         if isinstance(sys.modules.get(name), _StandIn)}
            _loading = True
            try:
                module = importlib.import_module(NAME)
            except BaseException:
                sys.modules.update(stand_ins)
                raise
            finally:
                _loading = False
            _real = module
        return _real


class _StandIn(types.ModuleType):
    """`torch._dynamo` or `torch._dynamo.utils` until the real one is needed: what it does not answer itself is the
    real module's (loaded then). Python's own module attributes (`__file__`, ...) are not forwarded: a look through
    `sys.modules` (inspect, pickle) does not load TorchDynamo."""

    def __getattr__(self, name: str):
        if name.startswith("__") and name.endswith("__"):
            raise AttributeError(name)
        real()
        return getattr(importlib.import_module(self.__name__), name)


def graph_break(msg: str = "") -> None:
    """A graph break: nothing to do outside a compiled region, and none runs before TorchDynamo is loaded."""
    if _real is not None:
        _real.graph_break(msg)


def is_compiling() -> bool:
    return _real.is_compiling() if _real is not None else False


def disable(fn=None, recursive: bool = True, **options):
    """TorchDynamo's `disable`: `fn` as it is until TorchDynamo is loaded, TorchDynamo's own wrapper from then on."""
    if _real is not None:
        return _real.disable(fn, recursive, **options)
    if fn is None:
        return functools.partial(disable, recursive=recursive, **options)
    wrapped: list = []

    @functools.wraps(fn)
    def call(*args, **kwargs):
        if _real is None:
            return fn(*args, **kwargs)
        if not wrapped:
            wrapped.append(_real.disable(fn, recursive, **options))
        return wrapped[0](*args, **kwargs)

    return call


def is_compile_supported(device_type) -> bool:
    """torchvision's roi_align asks on its deterministic path only: TorchDynamo's own answer."""
    return real().utils.is_compile_supported(device_type)


_OWN = {NAME: {"graph_break": graph_break, "is_compiling": is_compiling, "disable": disable},
        UTILS: {"is_compile_supported": is_compile_supported}}


class _StandInLoader(importlib.abc.Loader):
    def create_module(self, spec):
        return _StandIn(spec.name)

    def exec_module(self, module) -> None:
        module.__dict__.update(_OWN[module.__name__])


class _AlreadyLoaded(importlib.abc.Loader):
    """A submodule that loading the real package loaded already: the import asked for it gets that module."""

    def create_module(self, spec):
        self.module = sys.modules[spec.name]
        self.spec = self.module.__spec__
        return self.module

    def exec_module(self, module) -> None:
        module.__spec__ = self.spec  # (the import gave it this loader's spec meanwhile)


class _Finder(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if _loading or _real is not None or not (name == NAME or name.startswith(NAME + ".")):
            return None
        standing_in = isinstance(sys.modules.get(NAME), _StandIn)
        if name == NAME or name == UTILS and standing_in:
            return importlib.util.spec_from_loader(name, _StandInLoader(), is_package=name == NAME)
        if not standing_in:
            return None
        real()  # another submodule: the real package now, then that submodule of it
        if name in sys.modules:
            return importlib.util.spec_from_loader(name, _AlreadyLoaded())
        return _on_real_parent(importlib.util.find_spec(name))


class _OnRealParent(importlib.abc.Loader):
    """A submodule imported through the stand-in: also an attribute of the real package, as an import makes it."""

    def __init__(self, loader):
        self.loader = loader

    def create_module(self, spec):
        return self.loader.create_module(spec)

    def exec_module(self, module) -> None:
        module.__loader__ = module.__spec__.loader = self.loader
        self.loader.exec_module(module)
        setattr(sys.modules[NAME], module.__name__.rpartition(".")[2], module)


def _on_real_parent(spec):
    if spec is not None and spec.loader is not None:
        spec.loader = _OnRealParent(spec.loader)
    return spec


def install() -> None:
    """Once per process, before torch is imported (trainer/__init__.py)."""
    if not any(isinstance(finder, _Finder) for finder in sys.meta_path):
        sys.meta_path.insert(0, _Finder())
