"""What a model file is, read from its own bytes, and the check that a torch.export program holds no pickle.

A model file is data (docs/reliability.md): its format is recognised from the file, never taken from its name or its
`.json` sidecar alone, and a loader that could fall back to full unpickling is given only what the safe loader
takes. torch 2.14's `torch.export.load` retries a member that `torch.load(weights_only=True)` refuses with
`weights_only=False` (`_export/serde/serialize.py::deserialize_torch_artifact`), and unpickles weights and constants
marked `use_pickle`, custom objects and opaque objects in full (`export/pt2_archive/_package.py`): `check_program`
refuses each of those before torch sees the file.
"""

from __future__ import annotations

import io
import json
import struct
import zipfile
from pathlib import Path

from trainer.core.errors import InputError

# container -> what it is called in a message
CONTAINERS = {"pt2": "torch.export program (.pt2)", "torchscript": "TorchScript archive",
              "torch_save": "torch.save file", "safetensors": "safetensors file", "onnx": "ONNX model",
              "executorch": "ExecuTorch program (.pte)", "mlpackage": "Core ML package",
              "tflite": "LiteRT (TensorFlow Lite) model"}
MAX_MEMBER_BYTES = 1 << 31  # a program member read whole to be checked (weights are not read, only pickles)
UNSAFE_CONSTANT_PREFIXES = ("custom_obj", "opaque_obj")  # constants torch.export.load unpickles in full


class UnsafeModelFile(InputError, ValueError):
    """A model file refused before loading: it is not what its sidecar says, or loading it would unpickle."""


def recognise(path: Path) -> str | None:
    """The container of a model file from its bytes (a key of CONTAINERS), or None for none of them."""
    path = Path(path)
    if path.is_dir():
        return "mlpackage" if (path / "Manifest.json").is_file() else None
    if not path.is_file():  # a FIFO or a device is nothing to read
        return None
    with open(path, "rb") as f:
        head = f.read(16)
    if head.startswith(b"PK\x03\x04"):
        try:
            with zipfile.ZipFile(path) as archive:
                names = archive.namelist()
        except zipfile.BadZipFile:
            return None
        if any(n.endswith("/archive_format") or n == "archive_format" for n in names):
            return "pt2"
        if any("/code/" in n or n.endswith("constants.pkl") for n in names):
            return "torchscript"
        return "torch_save" if any(n.endswith("data.pkl") for n in names) else None
    if len(head) >= 8 and head[4:8] == b"ET12":  # a flatbuffer with ExecuTorch's file identifier
        return "executorch"
    if len(head) >= 8 and head[4:8] == b"TFL3":  # a flatbuffer with TensorFlow Lite's file identifier
        return "tflite"
    if _is_safetensors(path, head):
        return "safetensors"
    if head[:1] == b"\x08":  # a protobuf ModelProto starts with field 1, ir_version (a varint)
        return "onnx"
    return None


def _is_safetensors(path: Path, head: bytes) -> bool:
    """An 8-byte little-endian header length, then that many bytes of JSON."""
    if len(head) < 9 or head[8:9] != b"{":
        return False
    (length,) = struct.unpack("<Q", head[:8])
    if length > path.stat().st_size - 8:
        return False
    with open(path, "rb") as f:
        f.seek(8)
        try:
            return isinstance(json.loads(f.read(min(length, 100 << 20))), dict)
        except ValueError:
            return False


def check_format_file(path: Path, fmt: str, sidecar: Path) -> None:
    """Refuse a file whose bytes are not what its sidecar's format `fmt` writes: the format's container, or for a
    format without one, what its module's `recognise_FMT(path)` accepts."""
    from trainer.core.catalog import EXPORT_REGISTRY
    from trainer.deploy import formats

    container = EXPORT_REGISTRY[fmt].container
    if container is not None:
        check_container(path, fmt, container, sidecar)
        return
    recognised = formats.part(fmt, "recognise")
    if recognised is None or not recognised(path):
        raise UnsafeModelFile(f"{path}: refused: the file is not a {fmt} file, as {sidecar.name} says it is")


def check_container(path: Path, fmt: str, container: str, sidecar: Path) -> None:
    """Refuse a file whose bytes are not the container its sidecar's format is written in."""
    found = recognise(path)
    if found is None:
        raise UnsafeModelFile(f"{path}: cannot load the {fmt} model, the file looks damaged or truncated (it is not "
                              f"a {CONTAINERS[container]})")
    if found != container:
        what = CONTAINERS.get(found, "not a model file TrainDeck knows")
        raise UnsafeModelFile(f"{path}: refused: the file is a {what}, but {sidecar.name} says {fmt} "
                              f"(a {CONTAINERS[container]}); a model file's format is read from the file itself")


def check_program(path: Path) -> None:
    """Refuse a torch.export program any part of which `torch.export.load` would unpickle in full: every pickled
    member must be what `torch.load(weights_only=True)` takes (so its fallback never runs), and no weight or
    constant may be marked for pickling or be a custom or opaque object."""
    import torch

    with zipfile.ZipFile(path) as archive:
        for info in archive.infolist():
            name = info.filename
            if name.endswith("_config.json"):
                _check_payload_config(path, name, archive.read(info))
                continue
            if not (name.endswith((".pt", ".pkl")) or _starts_with(archive, info, b"PK\x03\x04")):
                continue  # raw tensor bytes and JSON: torch reads them as data
            if info.file_size > MAX_MEMBER_BYTES:
                raise UnsafeModelFile(f"{path}: refused: its member {name} is {info.file_size} bytes")
            try:
                torch.load(io.BytesIO(archive.read(info)), weights_only=True)
            except Exception as e:  # noqa: BLE001 - whatever the safe loader refuses, torch would unpickle in full
                raise UnsafeModelFile(f"{path}: refused: its member {name} is not plain tensors (loading it would "
                                      "unpickle it, which can run code)") from e


# what TorchScript's own pickles name: its classes, tensors and storages, ordered dicts, its type tags
TORCHSCRIPT_GLOBALS = ("__torch__.", "collections OrderedDict", "torch._utils ", "torch.jit._pickle ", "torch ")


def check_torchscript(path: Path) -> None:
    """Refuse a TorchScript archive whose pickles name anything but TorchScript's own classes, tensors and
    containers (its unpickler builds only those, but a file is data: a pickle naming `builtins open` or a protocol-4
    import is refused before torch.jit.load reads it)."""
    import pickletools

    with zipfile.ZipFile(path) as archive:
        for info in archive.infolist():
            if not info.filename.endswith((".pkl", ".debug_pkl")):
                continue
            try:
                ops = list(pickletools.genops(archive.read(info)))
            except ValueError as e:  # not a pickle at all
                raise UnsafeModelFile(f"{path}: refused: its member {info.filename} is not a pickle ({e})") from None
            for op, arg, _ in ops:
                if op.name in ("STACK_GLOBAL", "INST", "OBJ") or (
                        op.name == "GLOBAL" and not str(arg).startswith(TORCHSCRIPT_GLOBALS)):
                    raise UnsafeModelFile(f"{path}: refused: its member {info.filename} names {arg or op.name!s:.80} "
                                          "(loading it could run code)")


def _starts_with(archive: zipfile.ZipFile, info: zipfile.ZipInfo, magic: bytes) -> bool:
    with archive.open(info) as member:
        return member.read(len(magic)) == magic


def _check_payload_config(path: Path, name: str, raw: bytes) -> None:
    try:
        entries = (json.loads(raw) or {}).get("config") or {}
    except (ValueError, AttributeError) as e:
        raise UnsafeModelFile(f"{path}: refused: its member {name} is not valid JSON") from e
    for key, meta in entries.items():
        meta = meta if isinstance(meta, dict) else {}
        if meta.get("use_pickle") or str(meta.get("path_name", "")).startswith(UNSAFE_CONSTANT_PREFIXES):
            raise UnsafeModelFile(f"{path}: refused: {key!s:.80} in {name} is a pickled object (loading it would "
                                  "unpickle it, which can run code)")
