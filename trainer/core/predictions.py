"""An evaluation's per-image predictions, `RUN_DIR/eval/NAME/predictions.csv`: its columns declared and its rows read
in one place (torch-free: the app's Results tab, the export's measuring set, int8 calibration and check-data's leak
figure all read it here).

Single-label rows: path, true, predicted, confidence, loss, top_k ("class:p;class:p;..."). Multi-label rows: path,
true and predicted (the image's labels, ";"-separated) and probabilities ("label:p;..."). Cells a spreadsheet would
run are neutralised on disk (`trainer.core.csvfile`); the rows read here hold the true names.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

from trainer.core.csvfile import read_dict_rows

FIELDS = ["path", "true", "predicted", "confidence", "loss", "top_k"]
MULTILABEL_FIELDS = ["path", "true", "predicted", "probabilities"]


@dataclass
class PredictionRow:
    path: str
    true: list[str]  # the image's class, or its labels (multi-label: any number)
    predicted: list[str]
    confidence: float = 0.0  # single-label: the predicted class's probability
    loss: float = 0.0  # single-label: the image's cross-entropy
    top_k: list[tuple[str, float]] = field(default_factory=list)  # single-label: the most probable classes
    probabilities: dict[str, float] = field(default_factory=dict)  # multi-label: each label's probability

    @property
    def correct(self) -> bool:
        return set(self.true) == set(self.predicted)


def scores(text: str) -> list[tuple[str, float]]:
    """"name:p;name:p" as pairs (a name may itself hold a colon: the last one splits)."""
    pairs = []
    for part in filter(None, text.split(";")):
        name, _, p = part.rpartition(":")
        pairs.append((name, float(p)))
    return pairs


def labels(text: str) -> list[str]:
    return [n for n in text.split(";") if n]


def read_predictions(path: str | os.PathLike) -> list[PredictionRow]:
    """The rows of a predictions.csv; OSError when unreadable, ValueError when a row is not one the trainer writes."""
    with open(path, newline="", encoding="utf-8") as f:
        rows = read_dict_rows(f)
    try:
        if rows and "probabilities" in rows[0]:
            return [PredictionRow(r["path"], labels(r["true"]), labels(r["predicted"]),
                                  probabilities=dict(scores(r["probabilities"]))) for r in rows]
        return [PredictionRow(r["path"], [r["true"]], [r["predicted"]], float(r["confidence"]), float(r["loss"]),
                              scores(r.get("top_k") or "")) for r in rows]
    except KeyError as e:
        raise ValueError(f"{path}: no column {e}") from None
