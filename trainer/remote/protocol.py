"""The remote protocol, declared once: what the agent on a host sends this machine, and where a host's word is checked.

Torch-free. A host is not trusted: everything it sends is validated here before anything is written on this
machine. The agent (trainer/remote/agent.py) builds its frames with `append_frame`/`file_frame`; the mirror
(trainer/remote/mirror.py) reads them with `read_frame` and writes only to `mirror_path`s. Names must be ones the protocol
knows and must resolve inside the mirror folder (no `..`, no absolute path, no link on the way); lines, headers, tar
members and fetched files are bounded; bytes travel as base64, so a log's offsets stay exact whatever its encoding.

`follow` frames, one JSON object per line, keyed by `t`:
    append    {file: one of APPENDED, offset: int >= 0, b64: complete lines from offset}
    truncate  {file: one of APPENDED}                       the file was replaced there: start it again
    file      {file: a WHOLE name, eval/NAME/FILE or slurm.out, b64: its bytes, alive?: bool (status.json)}
    job       {job: int, state: str, reason: str, active: bool}   a SLURM job's state
    beat      {}                                            nothing new; the connection is alive
    gone      {message: str}                                the run directory is not there (deleted on the host)
    end       {}                                            the run has ended and everything was sent

One-shot answers (one JSON object, at most MAX_ANSWER_BYTES), checked here by `listing_answer` and `scan_answer`
before the app's remote folder browser and the Dataset page see them:
    agent ls    {path: str, parent: str, entries: [{name: a folder name, folders: int, images: int}]}
    agent scan  {result: trainer.data.scan.ScanResult's fields, thumbs: [[class name, b64 of a PNG]]}
    auto --plan-only  {config: a run config, choices: [{key, value, why}], probes: [PROBE_FIELDS], planning_s,
                       offer: OFFER_FIELDS or null}
"""

from __future__ import annotations

import base64
import binascii
import dataclasses
import json
import os
import re
import types
import typing
from collections.abc import Iterable
from pathlib import Path
from typing import IO, Any

from trainer.remote.hosts import HostError

PROTOCOL = 2  # 2: bytes as base64 (exact offsets), the `gone` frame
APPENDED = ("events.jsonl", "train.log", "output.log")  # followed by byte offset
WHOLE = ("status.json", "config.yaml", "exclude.yaml", "notes.md", "lr_find.json", "auto.json")  # sent whole when changed
EVAL_DIR = "eval"
EVAL_FILES = ("metrics.json", "predictions.csv")
JOB_OUTPUT = "slurm.out"

# Limits, generous for real runs, small enough that a broken host cannot use up this machine's memory.
MAX_APPEND_BYTES = 4 << 20  # of one append frame's data (the agent sends at most this much at once)
MAX_WHOLE_BYTES = 16 << 20  # of a file sent whole
MAX_FRAME_LINE = 32 << 20  # one frame line: base64 of the largest data, plus its fields
MAX_ANSWER_BYTES = 64 << 20  # a one-shot answer (version, ls, scan with thumbnails, start)
MAX_HEADER_BYTES = 32  # `send`'s size line
MAX_FETCH_BYTES = 64 << 30  # a checkpoint or an export fetched from a host
MAX_IMAGE_BYTES = 256 << 20  # one gallery image in the `pack` tar stream
EVAL_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,99}")
KINDS = ("append", "truncate", "file", "job", "beat", "gone", "end")


class FrameError(HostError):
    """The host said something the protocol does not allow: one line, exit 2; the follower resynchronises."""


# ---- names --------------------------------------------------------------------------------------------
def known_name(name: object) -> bool:
    """Whether `name` is a file the protocol lets a host send into a mirror."""
    if not isinstance(name, str):
        return False
    if name in APPENDED or name in WHOLE or name == JOB_OUTPUT:
        return True
    parts = name.split("/")
    return (len(parts) == 3 and parts[0] == EVAL_DIR and EVAL_NAME.fullmatch(parts[1]) is not None
            and parts[2] in EVAL_FILES)


def fetchable_name(name: object) -> bool:
    """A file `fetch` may bring into a mirror: a checkpoint or an export (a plain relative path, no `..`)."""
    if not isinstance(name, str) or not name or name.startswith(("/", "-")) or "\\" in name or "\x00" in name:
        return False
    parts = name.split("/")
    return parts[0] in ("checkpoints", "exports") and len(parts) >= 2 and all(
        p not in ("", ".", "..") for p in parts)


def inside(root: Path, name: str) -> Path:
    """root/name, refused unless it stays inside `root` with no link on the way (a link placed in the mirror could
    point anywhere)."""
    root = Path(root)
    if not isinstance(name, str) or not name or os.path.isabs(name) or "\x00" in name:
        raise FrameError(f"{name!r}: not a name inside the run directory")
    path = root
    for part in name.split("/"):
        if part in ("", ".", ".."):
            raise FrameError(f"{name!r}: not a name inside the run directory")
        path = path / part
        if path.is_symlink():
            raise FrameError(f"{name!r}: {path} is a link; a host's file is never written through one")
    resolved_root = root.resolve()
    if resolved_root not in path.resolve().parents:
        raise FrameError(f"{name!r}: resolves outside {root}")
    return path


def mirror_path(root: Path, name: object) -> Path:
    """Where a frame's file goes in the mirror `root`: a known name, inside it; else FrameError."""
    if not known_name(name):
        raise FrameError(f"{str(name)[:120]!r}: not a file the protocol sends")
    return inside(root, name)


# ---- frames -------------------------------------------------------------------------------------------
def encode(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def append_frame(name: str, offset: int, data: bytes) -> dict:
    return {"t": "append", "file": name, "offset": offset, "b64": encode(data)}


def file_frame(name: str, data: bytes, **extra) -> dict:
    return {"t": "file", "file": name, "b64": encode(data), **extra}


def _decode(frame: dict, limit: int) -> bytes:
    return decode(frame.get("b64"), limit, f"{frame['t']} frame")


def decode(text: object, limit: int, what: str) -> bytes:
    """Base64 from a host, at most `limit` bytes decoded; FrameError naming `what` otherwise."""
    if not isinstance(text, str) or len(text) > 4 * (limit // 3 + 1):
        raise FrameError(f"{what}: no data, or more than {limit} bytes")
    try:
        return base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError):
        raise FrameError(f"{what}: its data is not base64") from None


def check_frame(frame: object) -> dict:
    """A frame as the protocol allows it, with its data decoded to bytes (`data`); FrameError otherwise."""
    if not isinstance(frame, dict):
        raise FrameError(f"a frame that is not an object: {str(frame)[:80]!r}")
    kind = frame.get("t")
    if kind not in KINDS:
        raise FrameError(f"a frame of unknown kind {str(kind)[:40]!r}")
    if kind == "append":
        if frame.get("file") not in APPENDED:
            raise FrameError(f"append frame for {str(frame.get('file'))[:120]!r}: not an appended file")
        offset = frame.get("offset")
        if not isinstance(offset, int) or isinstance(offset, bool) or offset < 0:
            raise FrameError(f"append frame for {frame['file']}: offset {str(offset)[:40]!r} is not a byte count")
        return {**frame, "data": _decode(frame, MAX_APPEND_BYTES)}
    if kind == "truncate":
        if frame.get("file") not in APPENDED:
            raise FrameError(f"truncate frame for {str(frame.get('file'))[:120]!r}: not an appended file")
        return frame
    if kind == "file":
        if not known_name(frame.get("file")):
            raise FrameError(f"file frame for {str(frame.get('file'))[:120]!r}: not a file the protocol sends")
        if "alive" in frame and not isinstance(frame["alive"], bool):
            raise FrameError("file frame: `alive` is not true or false")
        return {**frame, "data": _decode(frame, MAX_WHOLE_BYTES)}
    if kind == "job":
        if not isinstance(frame.get("job"), int) or not isinstance(frame.get("state"), str) \
                or not isinstance(frame.get("active"), bool) or not isinstance(frame.get("reason", ""), str):
            raise FrameError("job frame: needs job (a number), state (text), active (true or false)")
        return frame
    if kind == "gone" and not isinstance(frame.get("message", ""), str):
        raise FrameError("gone frame: its message is not text")
    return frame


def read_frame(line: bytes) -> dict:
    """One line of the follow stream, parsed and checked."""
    if len(line) > MAX_FRAME_LINE:
        raise FrameError(f"a frame line of more than {MAX_FRAME_LINE >> 20} MB")
    try:
        frame = json.loads(line)
    except (json.JSONDecodeError, UnicodeDecodeError):
        raise FrameError(f"a line that is not a frame: {line[:80]!r}") from None
    return check_frame(frame)


def read_line(stream: IO[bytes], limit: int, what: str) -> bytes:
    """One line of at most `limit` bytes (its newline included); FrameError when the host sends a longer one (the
    rest is not read into memory)."""
    line = stream.readline(limit + 1)
    if len(line) > limit:
        raise FrameError(f"{what}: a line longer than {limit} bytes")
    return line


def read_answer(stream: IO[bytes], what: str) -> bytes:
    """A one-shot answer (JSON), at most MAX_ANSWER_BYTES."""
    data = stream.read(MAX_ANSWER_BYTES + 1)
    if len(data) > MAX_ANSWER_BYTES:
        raise FrameError(f"{what}: an answer of more than {MAX_ANSWER_BYTES >> 20} MB")
    return data


def parse_answer(data: bytes, what: str) -> dict | list:
    """A one-shot answer: one JSON object (or list). A shell that prints a banner (`echo Welcome` in an rc file) puts
    text before it: said as such, with the text."""
    if len(data) > MAX_ANSWER_BYTES:
        raise FrameError(f"{what}: an answer of more than {MAX_ANSWER_BYTES >> 20} MB")
    text = data.decode("utf-8", "replace").strip()
    try:
        answer = json.loads(text)
    except json.JSONDecodeError:
        lines = text.splitlines()
        try:
            answer = json.loads(lines[-1]) if len(lines) > 1 else None
        except json.JSONDecodeError:
            answer = None
        if answer is not None:
            banner = " / ".join(line.strip() for line in lines[:-1] if line.strip())[:200]
            raise FrameError(f"{what}: the host's shell printed something before TrainDeck's answer ({banner!r}); "
                             f"make its rc file quiet for non-interactive shells (e.g. `[ -z \"$PS1\" ] && return` "
                             f"at the top of ~/.bashrc)") from None
        raise FrameError(f"{what}: an answer that is not JSON: {text[:200]!r}") from None
    if not isinstance(answer, (dict, list)):
        raise FrameError(f"{what}: an answer that is not an object: {text[:80]!r}")
    return answer


def parse_size_header(line: bytes, what: str) -> int:
    """`send`'s first line: the file's size in bytes, within MAX_FETCH_BYTES."""
    text = line.strip()
    if not text.isdigit() or len(text) > 20 or int(text) > MAX_FETCH_BYTES:
        raise FrameError(f"{what}: the host's size line is not a size ({line[:40]!r})")
    return int(text)


# ---- one-shot answers ----------------------------------------------------------------------------------------------
MAX_LISTING_ENTRIES = 1000  # the agent lists at most this many folders
MAX_THUMB_BYTES = 1 << 20  # one PNG thumbnail


def typed(value: Any, hint: Any, what: str) -> Any:
    """`value` (decoded JSON) checked against a type hint: str, int, float, bool, dict, dict[...], list[...], tuple[...], an
    optional (X | None) or object (anything); tuples come back as tuples. FrameError naming `what` and the item."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if hint is object:
        return value
    if origin in (typing.Union, types.UnionType):
        for option in args:
            try:
                return typed(value, option, what)
            except FrameError:
                continue
        raise FrameError(f"{what}: expected {' or '.join(getattr(a, '__name__', str(a)) for a in args)}, "
                         f"got {str(value)[:80]!r}")
    if hint is type(None):
        if value is not None:
            raise FrameError(f"{what}: expected null, got {str(value)[:80]!r}")
        return None
    if origin is list:
        if not isinstance(value, list):
            raise FrameError(f"{what}: expected a list, got {type(value).__name__}")
        return [typed(v, args[0], f"{what}[{i}]") for i, v in enumerate(value)]
    if origin is dict:
        if not isinstance(value, dict):
            raise FrameError(f"{what}: expected an object, got {type(value).__name__}")
        return {typed(k, args[0], f"{what} key"): typed(v, args[1], f"{what}[{k!r:.40}]") for k, v in value.items()}
    if origin is tuple and len(args) == 2 and args[1] is Ellipsis:  # tuple[X, ...]: any length
        if not isinstance(value, list):
            raise FrameError(f"{what}: expected a list, got {type(value).__name__}")
        return tuple(typed(v, args[0], f"{what}[{i}]") for i, v in enumerate(value))
    if origin is tuple:
        if not isinstance(value, list) or len(value) != len(args):
            raise FrameError(f"{what}: expected a list of {len(args)}, got {str(value)[:80]!r}")
        return tuple(typed(v, a, f"{what}[{i}]") for i, (v, a) in enumerate(zip(value, args)))
    ok = isinstance(value, (int, float)) if hint is float else isinstance(value, hint)
    if not ok or (hint in (int, float) and isinstance(value, bool)):
        raise FrameError(f"{what}: expected {hint.__name__}, got {str(value)[:80]!r}")
    return value


def _fields(answer: Any, hints: dict[str, Any], what: str, required: Iterable[str] | None = None) -> dict:
    """`answer` checked as an object of `hints`' fields: none unknown, the `required` ones (all, by default) there."""
    if not isinstance(answer, dict):
        raise FrameError(f"{what}: expected an object, got {type(answer).__name__}")
    unknown = sorted(set(answer) - set(hints))
    if unknown:
        raise FrameError(f"{what}: unknown field {str(unknown[0])[:80]!r}")
    missing = [k for k in (hints if required is None else required) if k not in answer]
    if missing:
        raise FrameError(f"{what}: no {missing[0]}")
    return {k: typed(v, hints[k], f"{what}.{k}") for k, v in answer.items()}


def folder_name(name: str, what: str, kind: str = "folder") -> str:
    """One folder's (file's) name as a host gives it: never a path, so the browser's next path stays under the
    listed one."""
    if not name or name in (".", "..") or "/" in name or "\0" in name or not name.isprintable():
        raise FrameError(f"{what}: not a {kind} name: {name[:80]!r}")
    return name


def listing_answer(answer: Any, what: str) -> dict:
    """`agent ls`'s answer, checked: {path, parent, entries: [{name, folders, images}], files: [CSV file names]}
    (`files` from hosts of 2026-12-03 on)."""
    checked = _fields(answer, {"path": str, "parent": str, "entries": list, "files": list[str]}, what,
                      required=("path", "parent", "entries"))
    entries = checked["entries"]
    if len(entries) > MAX_LISTING_ENTRIES:
        raise FrameError(f"{what}: more than {MAX_LISTING_ENTRIES} folders listed")
    checked["files"] = checked.get("files", [])
    if len(checked["files"]) > MAX_LISTING_ENTRIES:
        raise FrameError(f"{what}: more than {MAX_LISTING_ENTRIES} files listed")
    for i, name in enumerate(checked["files"]):
        folder_name(name, f"{what}.files[{i}]", "file")
    checked["entries"] = [_fields(e, {"name": str, "folders": int, "images": int}, f"{what}.entries[{i}]")
                          for i, e in enumerate(entries)]
    for i, e in enumerate(checked["entries"]):
        folder_name(e["name"], f"{what}.entries[{i}].name")
    return checked


def scan_answer(answer: Any, what: str) -> dict:
    """`agent scan`'s answer, checked and decoded: {result: a ScanResult, thumbs: [(class, PNG bytes)]}."""
    from trainer.data.scan import ScanResult

    checked = _fields(answer, {"result": dict, "thumbs": list[tuple[str, str]]}, what)
    needed = [f.name for f in dataclasses.fields(ScanResult)
              if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING]
    result = _fields(checked["result"], typing.get_type_hints(ScanResult), f"{what}.result", required=needed)
    classes = len(result.get("classes", []))
    for i, (_, label) in enumerate(result.get("samples", [])):  # one label per image, or 0/1 of every label
        if not (label in range(classes) if isinstance(label, int) else len(label) == classes and set(label) <= {0, 1}):
            raise FrameError(f"{what}.result.samples[{i}]: not a label of the {classes} classes: {str(label)[:80]}")
    thumbs = [(name, decode(data, MAX_THUMB_BYTES, f"{what}.thumbs[{i}]"))
              for i, (name, data) in enumerate(checked["thumbs"])]
    return {"result": ScanResult(**result), "thumbs": thumbs}


def read_scan(text: str, what: str) -> tuple[Any, list[tuple[str, bytes]]]:
    """The ScanResult and the thumbnails (class name, PNG bytes) of `main.py agent scan --host`'s output."""
    answer = scan_answer(parse_answer(text.encode("utf-8"), what), what)
    return answer["result"], answer["thumbs"]


# `auto --plan-only`'s probes: trainer.auto.Measured's fields (a test keeps the two the same; this module stays torch-free)
PROBE_FIELDS = {"model": str, "weights": str | None, "size": int, "batch": int, "train_images_per_s": float,
                "eval_images_per_s": float, "epoch_s": float, "epochs": int, "how": str, "finish_s": float}
PLAN_FIELDS = {"config": dict, "choices": list, "probes": list, "planning_s": float, "offer": dict | None}
OFFER_FIELDS = {"model": str, "weights": str, "file": str, "url": str, "megabytes": float | None, "why": str}
CHOICE_FIELDS = {"key": str, "value": object, "why": str}


def plan_answer(answer: Any, what: str) -> dict:
    """Auto's plan made on a host (`auto --plan-only` there), checked: its fields and their types. The config in it is
    then checked as any config is (RunConfig.from_dict) by the caller."""
    checked = _fields(answer, PLAN_FIELDS, what)
    checked["choices"] = [_fields(c, CHOICE_FIELDS, f"{what}.choices[{i}]") for i, c in enumerate(checked["choices"])]
    checked["probes"] = [_fields(p, PROBE_FIELDS, f"{what}.probes[{i}]") for i, p in enumerate(checked["probes"])]
    if checked.get("offer") is not None:
        checked["offer"] = _fields(checked["offer"], OFFER_FIELDS, f"{what}.offer")
    return checked
