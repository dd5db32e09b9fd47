"""What this machine can run, decided from its facts: the one owner of the machine-dependent device rules.

Torch-free. The facts (GPUs, native bf16, distributed backends, Horovod) are gathered by
`machine.machine_facts()` in the trainer, or arrive in the app as the JSON of `main.py probe-devices`;
either way the same functions below turn them into verdicts, so the app never keeps a copy of a rule.
Rules that hold on every machine (dp needs cuda, spawn is single-node, ...) are config cross-checks.
"""

from __future__ import annotations

from typing import Any

from trainer.core.config import RunConfig

# {"gpus": [{"index", "name", "memory_gb"}], "bf16_cuda" (native), "bf16_cuda_supported" (also emulated),
#  "bf16_cpu" (native), "backends": {"gloo": bool, "nccl": bool, "mpi": bool}, "horovod": bool,
#  "mps": bool (Apple silicon's GPU), "bf16_mps": bool}
Facts = dict[str, Any]

HOROVOD_INSTALL = "pip install 'horovod[pytorch]', which needs a compiler and MPI or Gloo"


def auto_precision(amp: str, device_type: str, facts: Facts, device_name: str | None = None) -> tuple[str, str]:
    """(fp32 | bf16 | fp16, why): `train.amp` as set, or for `auto` what the device runs natively."""
    if amp != "auto":
        return {"none": "fp32"}.get(amp, amp), f"train.amp is {amp}"
    if device_type == "mps":  # fp16 autocast runs there too, but its results are what users report problems with
        return "fp32", "auto: fp32 on Apple's GPU (train.amp fp16 runs half precision there)"
    where = device_name or ("this GPU" if device_type == "cuda" else "this CPU")
    if facts.get("bf16_cuda" if device_type == "cuda" else "bf16_cpu"):
        return "bf16", f"auto: {where} runs bf16 natively"
    return "fp32", f"auto: {where} has no native bf16"


def refusals(facts: Facts) -> dict[str, str]:
    """Option -> why this machine cannot run it (device.type cuda or mps, parallel dp, backends, horovod, GPU bf16)."""
    gpus = facts.get("gpus", [])
    out = {}
    if not facts.get("mps"):
        out["mps"] = "no Apple-silicon GPU (MPS) here: it needs a Mac with an M-series chip"
    elif not facts.get("bf16_mps"):
        out["bf16_mps"] = "Apple's GPU runs bf16 from macOS 14; use fp16 or update macOS"
    if not gpus:
        out["cuda"] = "no CUDA GPU is available here"
        out["dp"] = "DataParallel needs CUDA GPUs; none found"
        out["nccl"] = "nccl needs CUDA GPUs"
    elif len(gpus) < 2:
        out["dp"] = "DataParallel needs at least 2 GPUs; 1 found"
    for name, available in facts.get("backends", {}).items():
        if not available:
            out.setdefault(name, f"this PyTorch build has no {name} backend")
    if not facts.get("horovod"):
        out["horovod"] = f"horovod is not installed here ({HOROVOD_INSTALL})"
    if gpus and not facts.get("bf16_cuda_supported"):
        out["bf16_cuda"] = "this GPU does not support bf16; use fp16"
    return out


def device_problems(cfg: RunConfig, facts: Facts) -> list[str]:
    """The settings of `cfg` this machine cannot run, each starting with its key."""
    refused = refusals(facts)
    dev, out = cfg.device, []
    count = len(facts.get("gpus", []))
    if dev.type == "cuda":
        if "cuda" in refused:
            out.append(f"device.type: cuda, but {refused['cuda']}; use cpu")
        else:
            bad = [g for g in dev.gpus if g >= count]
            if bad:
                out.append(f"device.gpus: {bad} do not exist (this machine has {count} GPU(s): 0..{count - 1})")
        if cfg.train.amp == "bf16" and "bf16_cuda" in refused:
            out.append(f"train.amp: bf16: {refused['bf16_cuda']}")
    if dev.type == "mps":
        if "mps" in refused:
            out.append(f"device.type: mps, but {refused['mps']}; use cpu")
        elif cfg.train.amp == "bf16" and "bf16_mps" in refused:
            out.append(f"train.amp: bf16: {refused['bf16_mps']}")
    if dev.parallel == "dp" and "dp" in refused and "cuda" not in refused:
        out.append(f"device.parallel: dp: {refused['dp']}")
    if dev.parallel == "ddp":
        backend = resolve_backend(dev.backend, dev.type)
        if backend in refused:
            out.append(f"device.backend: {backend}: {refused[backend]}")
        if dev.launcher == "horovod" and "horovod" in refused:
            out.append(f"device.launcher: {refused['horovod']}; or use torchrun or spawn")
    return out


def resolve_backend(backend: str, device_type: str) -> str:
    """`device.backend`, with auto = nccl on cuda, gloo on cpu."""
    if backend != "auto":
        return backend
    return "nccl" if device_type == "cuda" else "gloo"
