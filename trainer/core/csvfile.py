"""CSV that a spreadsheet cannot run. Torch-free: the trainer's predictions and the app's curve exports write it,
the Results tab reads it back.

A cell starting with `=`, `+`, `-`, `@`, a tab or a carriage return is a formula to Excel, LibreOffice and Google
Sheets (CWE-1236: a class folder named `=HYPERLINK(...)` would run when predictions.csv is opened). Such text cells
get a leading `'` (the OWASP rule), which spreadsheets show as text; so that the rule can be undone exactly, a text
cell that already starts with `'` gets one too. Numbers are written as numbers (-0.5 stays a number). The JSON
files and the app keep the true names.
"""

from __future__ import annotations

import csv
import io
from collections.abc import Iterable
from typing import Any

FORMULA_START = ("=", "+", "-", "@", "\t", "\r")
QUOTE = "'"


def neutralised(value: Any) -> Any:
    """The cell as written: text a spreadsheet would read as a formula gets a leading `'`."""
    if isinstance(value, str) and value.startswith((*FORMULA_START, QUOTE)):
        return QUOTE + value
    return value


def true_text(cell: str) -> str:
    """The text a neutralised cell stands for."""
    return cell[1:] if cell.startswith(QUOTE) else cell


class SafeWriter:
    """`csv.writer` whose every text cell is neutralised."""

    def __init__(self, f):
        self._writer = csv.writer(f)

    def writerow(self, row: Iterable[Any]) -> None:
        self._writer.writerow([neutralised(v) for v in row])


def dict_rows_text(fields: list[str], rows: Iterable[dict]) -> str:
    """CSV text (header and rows of dicts), every text cell neutralised."""
    out = io.StringIO()
    writer = SafeWriter(out)
    writer.writerow(fields)
    for row in rows:
        writer.writerow([row.get(f) for f in fields])
    return out.getvalue()


def read_dict_rows(f) -> list[dict[str, str]]:
    """The rows of a file written with `dict_rows_text`, with the true text of every cell."""
    return [{true_text(k): true_text(v or "") for k, v in r.items()} for r in csv.DictReader(f)]
