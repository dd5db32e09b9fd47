"""What a run's last audit found in its data, in one line (issue #35's dataset doctor): the counts of label issues,
copies (and leaks), outliers and unsure images, read from the CSVs `main.py audit` keeps under RUN/audit/. Torch-free: the Dataset
page reads it on its scan thread, `check-data --run` prints it.
"""

from __future__ import annotations

import csv
import os
from dataclasses import dataclass
from pathlib import Path

import yaml

FILES = ("label_issues.csv", "duplicates.csv", "outliers.csv")


@dataclass
class Findings:
    run: Path
    label_issues: int
    copies: int  # images beyond the first of each group of copies
    leaks: int  # of those groups, the ones across train/val/test
    outliers: int  # far from every other image
    unsure: int = 0  # the network calls nothing with confidence

    def line(self) -> str:
        return (f"the audit of run {self.run.name}: {self.label_issues} label issue(s), {self.copies} cop(ies) "
                f"({self.leaks} leak(s) across train/val/test), {self.outliers} outlier(s), {self.unsure} unsure")


def read_findings(run: str | os.PathLike) -> Findings | None:
    """The counts of the run's last audit; None when it has not been audited (or its files are unreadable)."""
    audit = Path(run) / "audit"
    try:
        rows = {name: list(csv.DictReader((audit / name).open(newline="", encoding="utf-8"))) for name in FILES}
    except (OSError, csv.Error, UnicodeDecodeError):
        return None
    groups: dict[str, list[dict]] = {}
    for row in rows["duplicates.csv"]:
        groups.setdefault(row.get("group", ""), []).append(row)
    unsure = sum(row.get("why") == "unsure" for row in rows["outliers.csv"])
    issues = sum(row.get("flagged") != "no" for row in rows["label_issues.csv"])  # (below the line: not counted)
    return Findings(Path(run), issues, sum(len(g) - 1 for g in groups.values()),
                    sum(g[0].get("leak") == "yes" for g in groups.values()), len(rows["outliers.csv"]) - unsure, unsure)


def latest_audit(runs_dir: str | os.PathLike, train_dir: str) -> Findings | None:
    """The findings of the most recently audited run in `runs_dir` that trained on `train_dir`."""
    want = os.path.realpath(train_dir)
    audited = []
    for run in Path(runs_dir).iterdir() if Path(runs_dir).is_dir() else ():
        marker = run / "audit" / FILES[0]
        if marker.is_file() and _train_dir(run) == want:
            audited.append((marker.stat().st_mtime_ns, run))
    return read_findings(max(audited)[1]) if audited else None


def _train_dir(run: Path) -> str | None:
    try:
        data = (yaml.safe_load((run / "config.yaml").read_text(encoding="utf-8")) or {}).get("data") or {}
    except (OSError, yaml.YAMLError, AttributeError):
        return None
    return os.path.realpath(data["train_dir"]) if isinstance(data.get("train_dir"), str) else None
