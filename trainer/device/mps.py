"""Apple silicon's GPU through PyTorch's MPS backend: whether this machine has one (the one place that asks; the
tests mock `facts`), and the operations MPS lacks, which run on the CPU instead, said once each as run warnings.

Torch is imported inside the functions: `main.py` reads FALLBACK_ENV before anything imports torch.
"""

from __future__ import annotations

import contextlib
import re
import warnings
from collections.abc import Callable, Iterator

# Without it an operation MPS lacks fails the run; with it, PyTorch runs that operation on the CPU and warns. Read
# when torch loads, so `main.py` sets it (on macOS) before any import of torch.
FALLBACK_ENV = "PYTORCH_ENABLE_MPS_FALLBACK"
FALLBACK_WARNING = re.compile(r"The operator '([^']+)' is not currently supported on the MPS backend")


def facts() -> dict:
    """{"mps": whether Apple's GPU can train here, "bf16_mps": whether it runs bf16 (macOS 14 and newer)}."""
    import torch

    available = torch.backends.mps.is_available()
    return {"mps": available, "bf16_mps": available and torch.backends.mps.is_macos_or_newer(14, 0)}


@contextlib.contextmanager
def reporting_fallbacks(report: Callable[[str, str], None]) -> Iterator[None]:
    """PyTorch's warning for each operation MPS runs on the CPU goes to `report(operator, message)`, once per
    operator; every other warning goes where it went."""
    seen: set[str] = set()
    with warnings.catch_warnings():
        shown = warnings.showwarning

        def show(message, category, filename, lineno, file=None, line=None):
            found = FALLBACK_WARNING.search(str(message))
            if found is None:
                shown(message, category, filename, lineno, file, line)
            elif found.group(1) not in seen:
                seen.add(found.group(1))
                report(found.group(1), f"{found.group(1)} is not implemented on Apple's GPU (MPS): it runs on the "
                                       f"CPU, which slows every step that uses it")

        warnings.showwarning = show
        warnings.filterwarnings("always", message=FALLBACK_WARNING.pattern)
        yield
