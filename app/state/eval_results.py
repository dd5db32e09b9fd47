"""Reading a run's evaluations (RUN_DIR/eval/NAME/metrics.json and predictions.csv) for the Results tab.

Qt-free and torch-free: the files are the trainer's (trainer/deploy/evaluation.py writes them); this only reads and
slices them (errors by loss, one confusion-matrix cell, the most confused pairs).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from trainer.core.predictions import read_predictions
from trainer.core.rundir import RunDir, metrics_file, predictions_file, read_run_json
from trainer.remote.mirror import local_copy


@dataclass
class Prediction:
    path: str
    true: str
    predicted: str
    confidence: float
    loss: float
    top_k: list[tuple[str, float]] = field(default_factory=list)
    audit: str = ""  # `main.py audit`'s "issue" (confidence: the label-quality score), "outlier" (confidence: the
    # distance to its nearest images), "unsure" (confidence: the network's top probability), "exact copy" or "near
    # copy" (confidence: how alike); true is the given label, predicted the suggested one
    copy_of: tuple[str, str] | None = None  # a copy's original: (its split, its path)

    @property
    def wrong(self) -> bool:
        return self.true != self.predicted


@dataclass
class Evaluation:
    name: str
    metrics: dict
    predictions: list[Prediction]  # highest loss first

    @property
    def classes(self) -> list[str]:
        return self.metrics.get("classes", [])

    def errors(self) -> list[Prediction]:
        """The misclassified images, highest loss first (the top losses)."""
        return [p for p in self.predictions if p.wrong]

    def cell(self, true: str, predicted: str) -> list[Prediction]:
        """The images of one confusion-matrix cell, highest loss first."""
        return [p for p in self.predictions if p.true == true and p.predicted == predicted]


def evaluation_names(run_path: Path) -> list[str]:
    """The evaluations a run has: val first, then test, then evaluated folders by name."""
    folder = RunDir(run_path).evaluations
    names = sorted(p.name for p in folder.iterdir() if metrics_file(p).is_file()) if folder.is_dir() else []
    order = {"val": 0, "test": 1}
    return sorted(names, key=lambda n: (order.get(n, 2), n))


def evaluation_label(run_path: Path, name: str) -> str:
    """How the set list shows an evaluation: by the folder it evaluated (val: the best epoch's validation set)."""
    if name == "val":
        return "val (best epoch)"
    try:
        folder = read_run_json(RunDir(run_path).metrics_file(name)).get("folder")
    except (OSError, ValueError, AttributeError):
        folder = None
    return f"{name}: {folder}" if folder else name


def read_evaluation(run_path: Path, name: str) -> Evaluation | MultiLabelEvaluation:
    """One evaluation (a multi-label run's as MultiLabelEvaluation); OSError/ValueError when its files are missing
    or unreadable."""
    folder = RunDir(run_path).evaluation(name)
    metrics = read_run_json(metrics_file(folder), "evaluation")
    if not isinstance(metrics, dict):
        raise ValueError(f"{metrics_file(folder)}: not a JSON object")
    if metrics.get("task") == "multilabel":
        return read_multilabel_evaluation(run_path, name, metrics)
    rows = []
    remote = (Path(run_path) / "remote.json").exists()  # a mirror: the images are its copies of the host's
    csv_path = predictions_file(folder)
    if csv_path.exists():
        for r in read_predictions(csv_path):
            path = local_copy(run_path, r.path) if remote else r.path
            rows.append(Prediction(path, r.true[0], r.predicted[0], r.confidence, r.loss, r.top_k))
    rows.sort(key=lambda p: -p.loss)
    return Evaluation(name, metrics, rows)


def most_confused(confusion: list[list[int]], classes: list[str], limit: int = 20) -> list[tuple[str, str, int]]:
    """(true, predicted, images) for the off-diagonal cells with images, the largest first."""
    pairs = [(classes[i], classes[j], n) for i, row in enumerate(confusion) for j, n in enumerate(row) if i != j and n]
    return sorted(pairs, key=lambda p: -p[2])[:limit]


def mtime(run_path: Path, name: str) -> float:
    """When an evaluation was last written (0 when it does not exist): the tab re-reads it when this changes."""
    try:
        return RunDir(run_path).metrics_file(name).stat().st_mtime
    except OSError:
        return 0.0


@dataclass
class LabelledPrediction:
    """One image of a multi-label evaluation: its labels, the labels at their thresholds, every label's probability."""
    path: str
    true: list[str]
    predicted: list[str]
    probabilities: dict[str, float]


@dataclass
class MultiLabelEvaluation:
    name: str
    metrics: dict  # trainer.deploy.multilabel's: map, map_micro, per_label, thresholds, ...
    predictions: list[LabelledPrediction]

    @property
    def labels(self) -> list[str]:
        return self.metrics.get("classes", [])

    def false_positives(self, label: str) -> list[LabelledPrediction]:
        """Images the network gives `label` at its threshold that do not carry it, most probable first."""
        found = [p for p in self.predictions if label in p.predicted and label not in p.true]
        return sorted(found, key=lambda p: -p.probabilities[label])

    def false_negatives(self, label: str) -> list[LabelledPrediction]:
        """Images that carry `label` the network leaves without it, least probable first."""
        found = [p for p in self.predictions if label in p.true and label not in p.predicted]
        return sorted(found, key=lambda p: p.probabilities[label])

    def precision_recall(self, label: str) -> tuple[list[float], list[float]]:
        """(recall, precision) at each image's probability of `label` taken as the threshold, highest first."""
        ranked = sorted(self.predictions, key=lambda p: -p.probabilities[label])
        positives = sum(label in p.true for p in ranked)
        recall, precision, hits = [], [], 0
        for seen, p in enumerate(ranked, 1):
            hits += label in p.true
            recall.append(hits / positives if positives else 0.0)
            precision.append(hits / seen)
        return recall, precision


def read_multilabel_evaluation(run_path: Path, name: str, metrics: dict) -> MultiLabelEvaluation:
    """A multi-label evaluation's predictions (trainer.deploy.multilabel writes them); OSError/ValueError when
    unreadable."""
    rows = []
    remote = (Path(run_path) / "remote.json").exists()
    for r in read_predictions(RunDir(run_path).predictions_file(name)):
        path = local_copy(run_path, r.path) if remote else r.path
        rows.append(LabelledPrediction(path, r.true, r.predicted, r.probabilities))
    return MultiLabelEvaluation(name, metrics, rows)
