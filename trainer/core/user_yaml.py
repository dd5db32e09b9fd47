"""The one reader of YAML the user writes: config files, `--set` values, the Advanced page, sweep files, manifests.
Torch-free (the app parses with it too).

YAML aliases share one object, so a few hundred bytes ("billion laughs") can stand for billions of values: a
message, a copy or a check that walks the value would take gigabytes and minutes. The document's values are counted
as if every alias were expanded (on the node graph, before anything is built) and refused past a limit; files are
read only when they are regular files of bounded size (`read_user_file`); an error is one line that quotes at most
`SHOWN` characters.
"""

from __future__ import annotations

import os
import reprlib
from typing import Any

import yaml

from trainer.core.errors import InputError
from trainer.core.files import read_user_file

MAX_VALUES = 200_000  # scalars, lists and mappings, every alias expanded (a 100k-image manifest is ~100k)
MAX_NESTING = 100  # levels of lists and mappings (PyYAML builds them recursively)
MAX_CONFIG_BYTES = 1 << 20  # a config, a sweep or a --set value
MAX_MANIFEST_BYTES = 64 << 20  # a manifest lists up to a few hundred thousand images
SHOWN = 200  # characters of a value or a line quoted in a message

_REPR = reprlib.Repr()
_REPR.maxlevel, _REPR.maxlist, _REPR.maxdict, _REPR.maxstring, _REPR.maxother = 3, 6, 6, SHOWN, SHOWN


class YamlError(InputError, ValueError):
    """YAML that cannot be read: invalid, too large, or expanding past MAX_VALUES; one line naming where."""


def shown(value: Any) -> str:
    """A value as a message quotes it: cut short, never expanded (an alias-built value is not walked whole)."""
    text = _REPR.repr(value)
    return text if len(text) <= SHOWN else text[:SHOWN] + "…"


def cut(text: str) -> str:
    """User text quoted in a message: one line, at most SHOWN characters."""
    text = " ".join(str(text).split())
    return text if len(text) <= SHOWN else text[:SHOWN] + "…"


class _BoundedLoader(yaml.SafeLoader):
    """SafeLoader that counts the document's values, aliases expanded, before building any of them."""

    def get_single_data(self):
        node = self.get_single_node()
        if node is None:
            return None
        _check_size(node)
        return self.construct_document(node)


def _check_size(root: yaml.Node) -> None:
    """YamlError when the node graph, its aliases expanded, holds more than MAX_VALUES values or nests deeper than
    MAX_NESTING. Linear in the distinct nodes: each node's expanded count is computed once."""
    counted: dict[int, int] = {}
    visiting: set[int] = set()  # expanded, not counted yet: met again below itself, it contains itself
    stack: list[tuple[yaml.Node, int, bool]] = [(root, 1, False)]
    while stack:
        node, depth, children_done = stack.pop()
        if id(node) in counted:
            continue
        if not children_done:
            if id(node) in visiting:
                raise YamlError("a value that contains itself (a YAML alias inside its own anchor)")
            visiting.add(id(node))
        if depth > MAX_NESTING:
            raise YamlError(f"nested more than {MAX_NESTING} levels deep")
        children = _children(node)
        if children_done or not children:
            total = 1 + sum(counted[id(c)] for c in children)
            if total > MAX_VALUES:
                raise YamlError(f"expands to more than {MAX_VALUES:,} values (YAML aliases repeat what they "
                                f"name); refused")
            counted[id(node)] = total
            continue
        stack.append((node, depth, True))
        stack.extend((c, depth + 1, False) for c in children if id(c) not in counted)


def _children(node: yaml.Node) -> list[yaml.Node]:
    if isinstance(node, yaml.MappingNode):
        return [part for pair in node.value for part in pair]
    if isinstance(node, yaml.SequenceNode):
        return list(node.value)
    return []


def parse_yaml(text: str, where: str) -> Any:
    """The value of YAML `text`; YamlError naming `where` (a file, or `--set KEY`) in one line."""
    try:
        return yaml.load(text, Loader=_BoundedLoader)  # noqa: S506 - a SafeLoader
    except YamlError as e:
        raise YamlError(f"{where}: {e}") from None
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        at = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = getattr(e, "problem", None) or getattr(e, "context", None) or str(e)
        raise YamlError(f"{where}: invalid YAML{at}: {cut(problem)}") from None
    except RecursionError:
        raise YamlError(f"{where}: nested too deeply to read") from None


def read_yaml_file(path: str | os.PathLike, what: str = "YAML file", max_bytes: int = MAX_CONFIG_BYTES) -> Any:
    """The value of the YAML file at `path` (a regular file of at most `max_bytes`); YamlError or UserFileError
    naming it."""
    data = read_user_file(path, max_bytes, what)
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise YamlError(f"{path}: not a text (UTF-8) YAML file: byte {e.start} is {data[e.start:e.start + 1]!r}") \
            from None
    if "\x00" in text:
        raise YamlError(f"{path}: not a text YAML file (it contains NUL bytes)")
    return parse_yaml(text, str(path))
