"""Regenerate the key tables of docs/config.md from trainer/core/config.py: `.venv/bin/python docs/config_reference.py`.

The prose after the tables (from "## Parameter groups" on) is kept as written.
"""

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from trainer.core.config import describe_keys  # noqa: E402

DOC = Path(__file__).resolve().parent / "config.md"
HEAD = """# Config reference

A run is described by one YAML file with the sections below. Every key is optional and has the default shown;
unknown keys and wrong types are errors (`python main.py train` exits 2 and names the key path, the value and what
is allowed, e.g. `optimizer.groups[1].lr: must be > 0, got -3`). Relative paths are resolved against the folder of
the config file; the run directory's `config.yaml` holds the fully resolved config.

Override any key on the command line: `python main.py train cfg.yaml --set optimizer.lr=0.1 train.amp=bf16`
(values are parsed as YAML, so `device.gpus=[0,1]` is a list and `model.weights=` is null).

The source of truth is `trainer/core/config.py`; this file's tables are generated from it by `docs/config_reference.py`,
and a test checks that every key appears here.
"""


def main() -> None:
    out, section = [HEAD], None
    for key, tp, default, doc in describe_keys():
        sec = key.split(".")[0]
        if sec != section:
            section = sec
            out += ["", f"## `{sec}`", "", "| key | type | default | meaning |", "|---|---|---|---|"]
        value = json.dumps(default) if not isinstance(default, str) else f'"{default}"'
        out.append(f"| `{key}` | {tp} | `{value}` | {doc} |")
    tail = DOC.read_text().split("\n## Parameter groups", 1)[1]
    DOC.write_text("\n".join(out) + "\n\n## Parameter groups" + tail)


if __name__ == "__main__":
    main()
