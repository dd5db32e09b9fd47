"""The dataset manifest (`data.exclude`): images left out of training, given another class, or added to training
from elsewhere (labelled from a pool), without touching the user's files.

A small YAML file, written by the app's Results tab and labelling view (or by hand):

    exclude:            # images the scan skips
      - cats/blurry_001.jpg
    relabel:            # images the scan files under another class
      dogs/0042.jpg: cats
    add:                # images outside the folder, trained on under this class (main.py label)
      ../pool/img_0007.jpg: dogs

Paths are stored relative to the manifest's own folder (absolute when on another drive) and matched by their real
path, so a manifest keeps working when the project folder moves with it. Torch-free: the app reads and writes it.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from trainer.core.files import UserFileError, atomic_write_text
from trainer.core.system import locked
from trainer.core.user_yaml import MAX_MANIFEST_BYTES, YamlError, read_yaml_file
from trainer.data.scan import DataError

HEADER = "# TrainDeck dataset manifest: images left out (exclude), given another class (relabel) or added (add).\n" \
         "# Your image files are never deleted, moved or rewritten; undo an entry by removing its line.\n"


@dataclass
class Manifest:
    path: Path
    exclude: list[str] = field(default_factory=list)  # real paths
    relabel: dict[str, str] = field(default_factory=dict)  # real path -> class name
    add: dict[str, str] = field(default_factory=dict)  # real path of an image outside the folder -> class name

    def __len__(self) -> int:
        return len(self.exclude) + len(self.relabel) + len(self.add)

    def mark_excluded(self, image: str) -> None:
        key = _real(image)
        self.relabel.pop(key, None)
        if key not in self.exclude:
            self.exclude.append(key)

    def mark_relabelled(self, image: str, class_name: str) -> None:
        key = _real(image)
        if key in self.exclude:
            self.exclude.remove(key)
        self.relabel[key] = class_name

    def mark_added(self, image: str, class_name: str) -> None:
        """Train on `image` (outside the folder: a labelled pool image) as `class_name`."""
        self.add[_real(image)] = class_name

    def undo(self, image: str) -> None:
        key = _real(image)
        if key in self.exclude:
            self.exclude.remove(key)
        self.relabel.pop(key, None)
        self.add.pop(key, None)

    def entries(self) -> list[tuple[str, str | None]]:
        """(image, new class) for each entry; None means excluded."""
        return [(p, None) for p in self.exclude] + list(self.relabel.items())

    def filter(self, samples: list[tuple[str, int]], classes: list[str], key: str = "data.exclude",
               additions: bool = False) -> tuple[list[tuple[str, int]], int, int, int]:
        """`samples` with excluded images dropped, relabelled ones moved and (`additions`: the training folder's
        scan) the added ones appended; (samples, excluded, relabelled, added).

        A relabel or an addition to a class the folder does not have is a DataError naming the manifest and the
        class."""
        for verb, targets in (("relabels to", self.relabel.values()), ("adds images to", self.add.values())):
            unknown = sorted({c for c in targets if c not in classes})
            if unknown:
                raise DataError(f"{key}: {self.path}: {verb} {', '.join(unknown)}, which is not a class of the "
                                f"dataset ({', '.join(classes)})")
        if not self:
            return samples, 0, 0, 0
        excluded, relabel = set(self.exclude), {k: classes.index(v) for k, v in self.relabel.items()}
        out, n_excluded, n_relabelled = [], 0, 0
        for path, label in samples:
            real = _real(path)
            if real in excluded:
                n_excluded += 1
                continue
            if real in relabel:
                n_relabelled += 1
                label = relabel[real]
            out.append((path, label))
        if not additions:
            return out, n_excluded, n_relabelled, 0
        present = {_real(path) for path, _ in out} | excluded
        added = [(path, classes.index(c)) for path, c in self.add.items() if path not in present]
        return out + added, n_excluded, n_relabelled, len(added)


def _real(path: str | os.PathLike) -> str:
    return os.path.realpath(os.path.expanduser(path))


def read_manifest(path: str | os.PathLike) -> Manifest:
    """The manifest at `path` (empty when the file does not exist yet); DataError naming the file when unreadable."""
    path = Path(path)
    if not os.path.lexists(path):
        return Manifest(path)
    try:
        raw = read_yaml_file(path, "manifest", MAX_MANIFEST_BYTES) or {}
    except (YamlError, UserFileError) as e:
        raise DataError(f"data.exclude: {e}") from None
    if not isinstance(raw, dict) or set(raw) - {"exclude", "relabel", "add"}:
        raise DataError(f"data.exclude: {path}: expected the keys exclude (a list of images), relabel and add "
                        f"(image: class), got {sorted(raw) if isinstance(raw, dict) else type(raw).__name__}")
    exclude, relabel, add = raw.get("exclude") or [], raw.get("relabel") or {}, raw.get("add") or {}
    if not isinstance(exclude, list) or not all(isinstance(p, str) for p in exclude):
        raise DataError(f"data.exclude: {path}: exclude must be a list of image paths")
    for name, mapping in (("relabel", relabel), ("add", add)):
        if not isinstance(mapping, dict) or not all(isinstance(k, str) and isinstance(v, str)
                                                    for k, v in mapping.items()):
            raise DataError(f"data.exclude: {path}: {name} must map image paths to class names")
    base = path.parent
    resolve = lambda p: _real(p if os.path.isabs(os.path.expanduser(p)) else base / p)  # noqa: E731
    return Manifest(path, [resolve(p) for p in exclude], {resolve(k): v for k, v in relabel.items()},
                    {resolve(k): v for k, v in add.items()})


def edit_manifest(path: str | os.PathLike, change: Callable[[Manifest], object], base: Manifest | None = None) -> Manifest:
    """Change the manifest at `path` as `change(manifest)` says, under a lock held from the read to the write: two
    writers (the app, a second window, a script) each keep the other's entries (read, mark, write without it kept
    204 of 400). `base`: start from these entries instead of the file's (a run's copy taken to a new file)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with locked(path.with_name(f".{path.name}.lock")):
        manifest = read_manifest(path) if base is None else Manifest(path, list(base.exclude), dict(base.relabel),
                                                                     dict(base.add))
        change(manifest)
        write_manifest(manifest)
    return manifest


def write_manifest(manifest: Manifest, path: str | os.PathLike | None = None) -> Path:
    """Write the manifest (atomically) to `path` or its own file; entries relative to that file's folder."""
    path = Path(path or manifest.path)
    base = os.path.realpath(path.parent)

    def stored(p: str) -> str:
        try:
            rel = os.path.relpath(p, base)
        except ValueError:  # another drive (Windows)
            return p
        return p if rel.startswith(os.pardir + os.sep + os.pardir + os.sep + os.pardir) else rel

    body = {"exclude": [stored(p) for p in manifest.exclude],
            "relabel": {stored(k): v for k, v in manifest.relabel.items()}}
    if manifest.add:
        body["add"] = {stored(k): v for k, v in manifest.add.items()}
    path.parent.mkdir(parents=True, exist_ok=True)
    return atomic_write_text(path, HEADER + yaml.safe_dump(body, sort_keys=False, allow_unicode=True))
