"""Multi-label data (issue #36, its first part): the labels file beside the images, read and checked. Torch-free.

Two CSV layouts, told apart by the header:

    file,labels              one row per image, its labels separated by `;` or `|` (an empty cell: no label)
    file,cat,outdoor,night   one-hot: a column per label, 1 or 0 (also true/false, yes/no; empty is 0)

Paths are relative to the labels file's folder (absolute ones are taken as they are). UTF-8 with or without a BOM,
LF or CRLF lines. Every problem names the file, its line and the value; the first few are listed and the rest
counted, so a file of a million bad rows is still one short message.
"""

from __future__ import annotations

import csv
import io
import os
import re
from collections import Counter
from dataclasses import dataclass, field
from itertools import combinations
from pathlib import Path

from trainer.core.errors import InputError
from trainer.core.files import UserFileError, read_user_file
from trainer.data.scan import ScanResult, check_images, image_paths, printable_path

MAX_LABELS_BYTES = 512 << 20  # a labels file of 10^6 rows is ~50 MB
MAX_LABEL_NAME = 100
MAX_LABELS = 50_000  # labels (columns) in one file: Open Images' 20,000 fit; 10^6 columns is not a labels file
PAIRED_LABELS = 64  # co_occurrence's pairs: of the most frequent labels (at most 2,016 pairs an image)
SHOWN_PROBLEMS = 5
SEPARATORS = re.compile(r"[;|]")
SEPARATOR = ";"  # what TrainDeck writes between an image's labels
FORBIDDEN_IN_NAMES = set(",/\\;|")
TRUE, FALSE = {"1", "true", "yes"}, {"0", "false", "no", ""}


class LabelsError(InputError, ValueError):
    """A labels file that cannot be used; the message names the file, the line and the value."""


@dataclass
class Labels:
    path: str
    names: list[str]  # the labels: one-hot, in the order of its columns; a list per image, sorted
    items: list[tuple[str, tuple[int, ...]]] = field(default_factory=list)  # (image path, its labels' indices)
    line_of: dict[str, int] = field(default_factory=dict)  # image path -> its line in the file

    @property
    def counts(self) -> dict[str, int]:
        c = Counter(i for _, labels in self.items for i in labels)
        return {name: c.get(i, 0) for i, name in enumerate(self.names)}

    @property
    def unlabelled(self) -> int:
        """Images listed with no label at all (a negative for every label)."""
        return sum(1 for _, labels in self.items if not labels)

    def co_occurrence(self) -> Counter:
        """How often each pair of the PAIRED_LABELS most frequent labels is on the same image: {(a, b): n}, a before
        b in `names`. A pair is never more frequent than its rarer label, so the most frequent pairs are among
        those (20,000 labels on one image would otherwise be 2 x 10^8 pairs)."""
        counts = Counter(i for _, labels in self.items for i in labels)
        frequent = {i for i, _ in counts.most_common(PAIRED_LABELS)}
        pairs: Counter = Counter()
        for _, labels in self.items:
            kept = sorted(i for i in labels if i in frequent)
            pairs.update((self.names[a], self.names[b]) for a, b in combinations(kept, 2))
        return pairs


def _refusal(path: Path, problems: list[str]) -> LabelsError:
    shown = problems[:SHOWN_PROBLEMS]
    more = f"; and {len(problems) - SHOWN_PROBLEMS} more" if len(problems) > SHOWN_PROBLEMS else ""
    return LabelsError(f"{path}: " + "; ".join(shown) + more)


def _label_name(name: str) -> str | None:
    """Why `name` cannot be a label's name (None when it can)."""
    if not name:
        return "an empty label name"
    if FORBIDDEN_IN_NAMES & set(name) or not name.isprintable():
        return f"label {name[:MAX_LABEL_NAME]!r} holds a comma, a slash, ; or | or a control character"
    if len(name) > MAX_LABEL_NAME:
        return f"label {name[:40]!r}... is longer than {MAX_LABEL_NAME} characters"
    return None


def _text(path: Path) -> str:
    try:  # a regular file only (a FIFO waited for ever), bounded
        raw = read_user_file(path, MAX_LABELS_BYTES, "labels file")
    except UserFileError as e:
        raise LabelsError(str(e)) from None
    try:
        return raw.decode("utf-8-sig")  # a BOM (Excel's "CSV UTF-8") is not part of the first column's name
    except UnicodeDecodeError as e:
        raise LabelsError(f"{path}: not UTF-8 text (byte {e.start}); save it as CSV UTF-8") from None


def _rows(reader, path: Path):
    """The CSV rows; a row the csv module cannot read (a cell over its 131,072-character limit) is a LabelsError
    naming the file and line, not `field larger than field limit`."""
    while True:
        try:
            yield next(reader)
        except StopIteration:
            return
        except csv.Error as e:
            raise LabelsError(f"{path}: line {reader.line_num}: {e} (a cell that long is not a file name or a "
                              f"label)") from None


def read_labels(path: str | os.PathLike) -> Labels:
    """The labels file at `path`, checked: LabelsError naming the lines at fault."""
    path = Path(path).absolute()  # its images are named relative to its folder; the folder's scan is absolute
    reader = csv.reader(io.StringIO(_text(path), newline=""))
    rows = _rows(reader, path)
    header = [cell.strip() for cell in next(rows, [])]
    if not header or header[0].lower() != "file" or len(header) < 2:
        raise LabelsError(f"{path}: line 1: expected a header `file,labels` or `file,LABEL1,LABEL2,...`, got "
                          f"{','.join(header)[:120]!r}")
    one_hot = not (len(header) == 2 and header[1].lower() == "labels")
    problems: list[str] = []
    names: list[str] = []
    if one_hot:
        if len(header) - 1 > MAX_LABELS:
            raise LabelsError(f"{path}: line 1: {len(header) - 1:,} label columns; a labels file has at most "
                              f"{MAX_LABELS:,}")
        known: set[str] = set()
        for name in header[1:]:
            why = _label_name(name)
            if why:
                problems.append(f"line 1: {why}")
            elif name in known:
                problems.append(f"line 1: label {name!r} is a column twice")
            known.add(name)
            names.append(name)
            if len(problems) > 20:
                break
        if problems:
            raise _refusal(path, problems)
    index = {name: i for i, name in enumerate(names)}
    folder = str(path.parent)  # joined as strings: a Path per row was half the time of a million-row file
    seen: dict[str, int] = {}
    items: list[tuple[str, tuple[int, ...]]] = []
    for line, row in enumerate(rows, start=2):
        if not row or all(not cell.strip() for cell in row):
            continue
        file = row[0].strip()
        if not file:
            problems.append(f"line {line}: no file name")
            continue
        image = os.path.normpath(file if os.path.isabs(file) else os.path.join(folder, file))
        if image in seen:
            problems.append(f"line {line}: {file!r} is listed again (first on line {seen[image]})")
            continue
        seen[image] = line
        real = os.path.realpath(image) if os.path.islink(image) else image  # one lstat a row; a link: its file
        if real != image and real in seen:  # one real file is one image: a link to a listed file is not another
            problems.append(f"line {line}: {file!r} is a link to {os.path.basename(real)!r}, listed on line "
                            f"{seen[real]}: one file is one image")
            continue
        seen.setdefault(real, line)
        if one_hot:
            labels = _one_hot(row, header, line, problems)
        else:
            labels = _listed(row, index, names, line, problems)
        if labels is not None:
            items.append((image, labels))
    if problems:
        raise _refusal(path, problems)
    if not items:
        raise LabelsError(f"{path}: no images listed (a line per image under the header)")
    if not any(labels for _, labels in items):
        raise LabelsError(f"{path}: every image has an empty label set; give each image its labels")
    if not one_hot:
        names, items = _sorted_names(names, items)
    return Labels(str(path), names, items, seen)


def _sorted_names(names: list[str], items: list[tuple[str, tuple[int, ...]]]
                  ) -> tuple[list[str], list[tuple[str, tuple[int, ...]]]]:
    """A list of labels per image names its labels in no order of its own: sorted, as class folders are."""
    order = sorted(range(len(names)), key=names.__getitem__)
    if order == list(range(len(names))):
        return names, items
    new = {old: i for i, old in enumerate(order)}
    return [names[i] for i in order], [(image, tuple(sorted(new[i] for i in labels))) for image, labels in items]


def _one_hot(row: list[str], header: list[str], line: int, problems: list[str]) -> tuple[int, ...] | None:
    if len(row) != len(header):
        problems.append(f"line {line}: {len(row)} cells for the header's {len(header)}")
        return None
    labels = []
    for i, cell in enumerate(row[1:]):
        value = cell.strip().lower()
        if value in TRUE:
            labels.append(i)
        elif value not in FALSE:
            problems.append(f"line {line}: {header[i + 1]} is {cell.strip()[:40]!r}, not 1 or 0")
            return None
    return tuple(labels)


def _listed(row: list[str], index: dict[str, int], names: list[str], line: int,
            problems: list[str]) -> tuple[int, ...] | None:
    if len(row) > 2:
        problems.append(f"line {line}: {len(row)} cells; separate an image's labels with ; or | (a comma starts "
                        f"another cell), or quote the cell")
        return None
    labels = set()
    for name in (n.strip() for n in SEPARATORS.split(row[1] if len(row) > 1 else "")):
        if not name:
            continue
        why = _label_name(name)
        if why:
            problems.append(f"line {line}: {why}")
            return None
        if name not in index:
            if len(names) >= MAX_LABELS:
                problems.append(f"line {line}: more than {MAX_LABELS:,} labels in the file")
                return None
            index[name] = len(names)
            names.append(name)
        labels.add(index[name])
    return tuple(sorted(labels))


def check_against_folder(labels: Labels, images: list[str]) -> list[str]:
    """The images of the folder (`images`) the labels file does not list; LabelsError naming the lines of the ones it
    lists that are not there (a typo, or the wrong folder)."""
    present = {os.path.abspath(p) for p in images}  # the folder as given (relative or not) against the file's paths
    missing = [image for image, _ in labels.items if os.path.abspath(image) not in present]
    if missing:
        raise _refusal(Path(labels.path), [f"line {labels.line_of[m]}: {m} is not an image in the folder"
                                            for m in missing])
    listed = {os.path.abspath(p) for p in labels.line_of}
    return sorted(present - listed)


def format_labels_report(labels: Labels, unlisted: list[str], bad_files: list[tuple[str, str]] = (),
                         pairs: int = 5) -> list[str]:
    """The lines `check-data --labels` prints: per-label counts, the most frequent pairs, what has no label, and
    the listed files that cannot be used (each named, control characters shown as escapes)."""
    lines = [f"{printable_path(str(labels.path))}: {len(labels.names)} labels on {len(labels.items) - len(bad_files)} "
             f"usable images ({labels.unlabelled} with no label)"]
    width = max(len(n) for n in labels.names)
    lines += [f"  {name:<{width}}  {n}" for name, n in labels.counts.items()]
    together = labels.co_occurrence().most_common(pairs)
    if together:
        lines.append("most often together: " + ", ".join(f"{a} + {b} ({n})" for (a, b), n in together))
    if unlisted:
        lines.append(f"not in the labels file: {len(unlisted)} image(s) of the folder (first: "
                     f"{printable_path(unlisted[0])}); they are left out")
    if bad_files:
        lines.append(f"{len(bad_files)} files cannot be used:")
        lines.extend(f"  {printable_path(path)}: {reason}" for path, reason in bad_files)
    return lines


def manifest_labels(manifest, path: str, position: dict[str, int], entry: str = "relabel") -> list[int]:
    """A multi-label manifest's relabel (or, `entry` "add", addition) of `path`: the image's whole set of labels,
    `;`-separated (empty: no label); LabelsError naming the manifest for a label the run does not have."""
    text = (manifest.relabel if entry == "relabel" else manifest.add)[path]
    chosen = [n.strip() for n in SEPARATORS.split(text) if n.strip()]
    unknown = [n for n in chosen if n not in position]
    if unknown:
        raise LabelsError(f"data.exclude: {manifest.path}: {entry} {path}: label {unknown[0]!r} is not one of the "
                          f"run's labels")
    return [position[n] for n in chosen]


def labelled_scan(labels_file: str, key: str, folder: str | None = None, names: list[str] | None = None,
                  manifest=None, full: bool = False, additions: bool = False) -> ScanResult:
    """A multi-label split as the loader takes a scanned folder: `samples` of (image, its labels as a 0/1 tuple over
    `classes`). The images listed in `labels_file` (config key `key`) must be in `folder` (the labels file's own
    folder when None); the folder's images the file does not list are left out (a warning says how many). With
    `names` (the training labels) a label outside them is refused. The manifest's exclusions apply, and its relabels
    give an image its whole new set of labels (`cat;outdoor`); with `additions` (the training split), its additions
    (images from outside the folder, labelled from a pool: `main.py label`) join with their label sets.
    Each image is checked as a class folder's are (`check_images`; `full` decodes it whole): one that cannot be
    used (0 bytes, not an image, a decompression bomb) is in `bad_files`, not `samples`."""
    try:
        labels = read_labels(labels_file)
        unlisted = check_against_folder(labels, image_paths(folder or Path(labels_file).parent))
    except LabelsError as e:
        raise LabelsError(f"{key}: {e}") from None
    names = list(names or labels.names)
    position = {name: i for i, name in enumerate(names)}
    unknown = [n for n in labels.names if n not in position]
    if unknown:
        raise LabelsError(f"{key}: {labels_file}: label {unknown[0]!r} is not one of data.labels' labels "
                          f"({', '.join(names[:10])}{', ...' if len(names) > 10 else ''})")
    left_out = set(manifest.exclude) if manifest is not None else set()
    relabel = {path: manifest_labels(manifest, path, position) for path in manifest.relabel} if manifest else {}
    scan = ScanResult(str(folder or Path(labels_file).parent), names, labels_file=str(labels_file))
    for image, indices in labels.items:
        real = os.path.realpath(image)
        if real in left_out:
            scan.excluded += 1
            continue
        chosen = relabel.get(real)
        if chosen is None:
            chosen = [position[labels.names[i]] for i in indices]
        else:
            scan.relabelled += 1
        hot = [0.0] * len(names)
        for i in chosen:
            hot[i] = 1.0
        scan.samples.append((image, tuple(hot)))
    added = manifest.add if additions and manifest is not None else {}
    listed = {os.path.realpath(image) for image, _ in scan.samples} if added else set()
    for image in added:
        if image in listed or image in left_out:
            continue
        hot = [0.0] * len(names)
        for i in manifest_labels(manifest, image, position, "add"):
            hot[i] = 1.0
        scan.samples.append((image, tuple(hot)))
        scan.added += 1
    checked = check_images([image for image, _ in scan.samples], full)
    scan.bad_files = [(image, reason) for (image, _), (reason, _) in zip(scan.samples, checked) if reason]
    scan.image_sizes = [size for (reason, size) in checked if not reason]
    scan.samples = [sample for sample, (reason, _) in zip(scan.samples, checked) if not reason]
    if unlisted:
        scan.warnings.append(f"{key}: {len(unlisted)} image(s) of {scan.root} are not in {labels_file} and are left "
                             f"out (first: {unlisted[0]})")
    if not scan.samples:
        why = "cannot be used" if scan.bad_files else "is excluded by the manifest"
        raise LabelsError(f"{key}: {labels_file}: every image listed {why}")
    return scan
