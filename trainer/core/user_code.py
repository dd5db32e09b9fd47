"""Your own model code (`path/file.py:ClassName`): run only when you trusted that file, at a call, never because a
file being loaded names it. Torch-free (the app grants from the Model page's "Own model file…").

A checkpoint, an export's sidecar, a run folder's config.yaml or a config file may *name* a `.py` file; that name
alone runs nothing. Code runs when you gave it at the call, as Hugging Face's `trust_remote_code` is given:

- on the command line, `--model-code path/net.py:Net` (any command that builds a network), or
- in the app, by choosing the file with **Own model file…**.

Either records the file's absolute path, the class and the SHA-256 of its bytes in your own trust list
(`~/.config/traindeck/trusted-model-code.json`, outside every run folder, so it never travels with one). The same
file with the same bytes then builds in the processes that run for you afterwards (the trainer, its DDP ranks, the
scheduler's runs, predict, Grad-CAM); a file you never trusted, or one whose bytes changed since, is refused in one
line that says how to trust it.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from datetime import datetime, timezone
from pathlib import Path

from trainer.core.errors import ModelError
from trainer.core.files import UserFileError, atomic_write_text, read_user_file

FLAG = "--model-code"
MAX_SOURCE_BYTES = 8 * 2**20  # a model's .py file; anything larger is not one
MAX_ENTRIES = 1_000  # the trust list keeps the most recent grants
MAX_LIST_BYTES = 2**20
CLASS_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def trust_file() -> Path:
    """Where this user's grants are kept (never in a run folder)."""
    from trainer.core.system import user_dir

    return user_dir("config") / "trusted-model-code.json"


def _split(spec: str, key: str) -> tuple[Path, str]:
    path_str, _, cls = spec.rpartition(":")
    if not path_str.endswith(".py") or not CLASS_NAME.fullmatch(cls):
        raise ModelError(f"{key}: {spec!r} is not path/to/file.py:ClassName")
    return Path(os.path.expanduser(path_str)).resolve(), cls


def _source(path: Path, key: str) -> bytes:
    try:
        return read_user_file(path, MAX_SOURCE_BYTES, "model code file")
    except UserFileError as e:
        raise ModelError(f"{key}: {e}") from e


def _read_grants() -> list[dict]:
    path = trust_file()
    if not path.exists():
        return []
    try:
        data = json.loads(read_user_file(path, MAX_LIST_BYTES, "trust list"))
    except (UserFileError, ValueError):
        return []  # a damaged list trusts nothing; the next grant writes a good one
    grants = data.get("trusted") if isinstance(data, dict) else None
    if not isinstance(grants, list):
        return []
    return [g for g in grants if isinstance(g, dict) and all(isinstance(g.get(k), str)
                                                              for k in ("path", "class", "sha256"))]


def grant(spec: str, key: str = FLAG) -> str:
    """Trust `spec` (path/file.py:ClassName) as it is now: its bytes may build a network from now on. Returns the
    spec with the file's absolute path. ModelError when it is not a readable .py file."""
    from trainer.core.system import locked

    path, cls = _split(spec, key)
    digest = hashlib.sha256(_source(path, key)).hexdigest()
    where = trust_file()
    where.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    with locked(where.with_name(where.name + ".lock")):
        grants = [g for g in _read_grants() if (g["path"], g["class"]) != (str(path), cls)]
        grants.append({"path": str(path), "class": cls, "sha256": digest,
                       "since": datetime.now(timezone.utc).isoformat(timespec="seconds")})
        atomic_write_text(where, json.dumps({"version": 1, "trusted": grants[-MAX_ENTRIES:]}, indent=1))
        os.chmod(where, 0o600)
    return f"{path}:{cls}"


def trusted_source(spec: str, key: str = "model.name") -> tuple[Path, str, bytes]:
    """(path, class, the file's bytes) of `spec` when you trusted these bytes; ModelError naming how to trust it
    otherwise. Nothing of the file runs here; the caller runs the bytes returned (not the file read again, which may
    have changed since)."""
    path, cls = _split(spec, key)
    how = (f"if you trust it, give it at the call ({FLAG} {path}:{cls}) or choose it with Own model file… in the "
           f"app")
    if not path.is_file():
        raise ModelError(f"{key}: {path} does not exist")
    source = _source(path, key)
    digest = hashlib.sha256(source).hexdigest()
    mine = [g for g in _read_grants() if (g["path"], g["class"]) == (str(path), cls)]
    if not mine:
        raise ModelError(f"{key}: {path}:{cls} is code, and TrainDeck runs no code that a file names; {how}")
    if mine[-1]["sha256"] != digest:
        raise ModelError(f"{key}: {path} changed since you trusted it ({mine[-1].get('since', '?')}); {how}")
    return path, cls, source
