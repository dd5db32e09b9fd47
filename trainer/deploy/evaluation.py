"""Evaluating a trained network on a folder: metrics and per-image predictions, written under RUN_DIR/eval/NAME/.

`metrics.json`: accuracy, top-5 accuracy (with at least 5 classes), precision / recall / F1 / support per class, the
confusion matrix, the mean loss, and the expected calibration error with its reliability diagram. `predictions.csv`:
one row per image: path, true, predicted, confidence, loss and the top-k classes with their probabilities.
The same files come from `main.py evaluate`, from `data.test_dir` at the end of a run, and (for `val`) from the
trainer at each new best epoch, so the app reads errors without computing anything.
"""

from __future__ import annotations

import json
import logging
import os
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F

from trainer.core.csvfile import dict_rows_text
from trainer.core.files import atomic_write_text
from trainer.core.predictions import FIELDS as PREDICTION_FIELDS
from trainer.core.rundir import RunDir

log = logging.getLogger(__name__)

ECE_BINS = 15
TOP_K = 5


@dataclass
class Predictions:
    paths: list[str]
    labels: torch.Tensor  # (N,) int64
    logits: torch.Tensor  # (N, C) float32, on the CPU


def top_classes(logits: torch.Tensor, k: int) -> torch.Tensor:
    """Each row's `k` most likely classes, best first. A tie (two bf16-rounded logits can be equal) goes to the lower
    class index, the same way for validation, metrics.json and predictions.csv: an image has one prediction."""
    return torch.sort(logits.float(), dim=1, descending=True, stable=True).indices[:, :k]


def classification_metrics(logits: torch.Tensor, labels: torch.Tensor, classes: list[str]) -> dict:
    """Every metric of `metrics.json` from logits and true labels (a class without images gets null, not 0)."""
    logits = logits.float()
    n, c = len(labels), len(classes)
    probs = logits.softmax(1)
    top = top_classes(logits, min(TOP_K, c))
    predicted = top[:, 0]
    confidence = probs.gather(1, predicted[:, None])[:, 0]
    confusion = torch.bincount(labels * c + predicted, minlength=c * c).view(c, c)
    tp = confusion.diag().double()
    support = confusion.sum(1).double()
    predicted_count = confusion.sum(0).double()
    per_class = {}
    for i, name in enumerate(classes):
        precision = (tp[i] / predicted_count[i]).item() if predicted_count[i] else None
        recall = (tp[i] / support[i]).item() if support[i] else None
        f1 = (2 * precision * recall / (precision + recall) if precision is not None and recall is not None
              and precision + recall > 0 else (0.0 if precision is not None and recall is not None else None))
        per_class[name] = {"precision": precision, "recall": recall, "f1": f1, "support": int(support[i])}
    out = {"images": n, "accuracy": (tp.sum() / max(n, 1)).item(),
           "loss": F.cross_entropy(logits, labels).item() if n else None,
           "per_class": per_class, "confusion": confusion.tolist(), "classes": list(classes)}
    if c >= TOP_K:
        out["top5_accuracy"] = (top == labels[:, None]).any(1).double().mean().item()
    out.update(calibration(confidence, predicted == labels))
    return out


def calibration(confidence: torch.Tensor, correct: torch.Tensor, bins: int = ECE_BINS) -> dict:
    """Expected calibration error over equal-width confidence bins, and the bins for a reliability diagram."""
    edges = torch.linspace(0, 1, bins + 1)
    index = torch.clamp(torch.bucketize(confidence, edges[1:-1], right=True), 0, bins - 1)
    diagram, ece, n = [], 0.0, max(len(confidence), 1)
    for b in range(bins):
        mask = index == b
        count = int(mask.sum())
        if count:
            conf = confidence[mask].double().mean().item()
            acc = correct[mask].double().mean().item()
            ece += count / n * abs(acc - conf)
        else:
            conf = acc = None
        diagram.append({"low": edges[b].item(), "high": edges[b + 1].item(), "count": count, "confidence": conf,
                        "accuracy": acc})
    return {"ece": ece, "reliability": diagram}


def prediction_rows(preds: Predictions, classes: list[str], k: int = TOP_K) -> list[dict]:
    probs = preds.logits.float().softmax(1)
    losses = F.cross_entropy(preds.logits.float(), preds.labels, reduction="none")
    top_i = top_classes(preds.logits, min(k, len(classes)))
    top_p = probs.gather(1, top_i)
    rows = []
    for i, path in enumerate(preds.paths):
        rows.append({"path": path, "true": classes[preds.labels[i]], "predicted": classes[top_i[i, 0]],
                     "confidence": round(top_p[i, 0].item(), 6), "loss": round(losses[i].item(), 6),
                     "top_k": ";".join(f"{classes[j]}:{p:.4f}" for j, p in zip(top_i[i].tolist(), top_p[i].tolist()))})
    return rows


def write_evaluation(run_path: Path, name: str, preds: Predictions, classes: list[str], extra: dict | None = None) -> dict:
    """metrics.json and predictions.csv under run_path/eval/NAME (each replaced atomically); the metrics."""
    folder = RunDir(run_path).evaluation(name)
    folder.mkdir(parents=True, exist_ok=True)
    metrics = {**classification_metrics(preds.logits, preds.labels, classes), **(extra or {})}
    atomic_write_text(folder / "metrics.json", json.dumps(metrics, indent=1))
    atomic_write_text(folder / "predictions.csv", dict_rows_text(PREDICTION_FIELDS, prediction_rows(preds, classes)))
    return metrics


RESERVED_NAMES = {"val": "the best epoch's validation predictions, written by the trainer",
                  "test": "the run's data.test_dir, evaluated at the end of the run"}


def evaluation_name(run_path: Path, folder: str, test_dir: str | None, name: str | None, overwrite: bool) -> str:
    """Where under RUN_DIR/eval/ an evaluation of `folder` goes: `--name`, else the folder's name. The trainer's
    own names (val, test) are reserved: a folder called val becomes PARENT-val. A name that holds another
    folder's evaluation gets -2, -3, ...; one that holds this folder's is replaced only with `overwrite`."""
    from trainer.data.scan import DataError

    real = os.path.realpath(folder)
    is_test = bool(test_dir) and real == os.path.realpath(test_dir)
    if name is not None:
        if not name or "/" in name or name.startswith("."):
            raise DataError(f"--name: {name!r} is not a folder name")
        if name in RESERVED_NAMES and not (name == "test" and is_test):
            raise DataError(f"--name: {name} is reserved ({RESERVED_NAMES[name]}); choose another name")
        base = name
    elif is_test:
        base = "test"
    else:
        path = Path(real)
        path = path.with_suffix("") if path.is_file() else path  # a labels file (multi-label): its name's stem
        base = path.name if path.name not in RESERVED_NAMES else f"{path.parent.name}-{path.name}"
    candidate, n = base, 1
    while (RunDir(run_path).evaluation(candidate) / "metrics.json").exists():
        try:
            earlier = json.loads((RunDir(run_path).evaluation(candidate) / "metrics.json").read_text(encoding="utf-8"))
        except (OSError, ValueError):
            earlier = {}
        if os.path.realpath(earlier.get("folder") or "") == real or (candidate == "test" and is_test) \
                or name is not None:
            if overwrite:
                return candidate
            raise DataError(f"{Path(run_path) / 'eval' / candidate}: already holds an evaluation of "
                            f"{earlier.get('folder') or 'a folder'}; pass --overwrite to replace it, or --name NAME")
        n += 1
        candidate = f"{base}-{n}"
    return candidate


def evaluate_run(run_path: Path, data_dir: str | None = None, which: str = "best", name: str | None = None,
                 overwrite: bool = False, labels: str | None = None) -> tuple[Path, dict]:
    """Evaluate a run's checkpoint on a folder (default: its data.test_dir) with the run's own preprocessing, into
    RUN_DIR/eval/NAME (`evaluation_name`); the eval folder written and its metrics. DataError when the folder's
    classes differ from the run's, or the name would replace an evaluation without `overwrite`. A multi-label run
    is evaluated on a labels file (`labels`, default its data.test_labels) at its thresholds."""
    from trainer.data.manifest import read_manifest
    from trainer.data.scan import DataError, scan_image_folder
    from trainer.deploy.inference import load_run_model

    run = RunDir(run_path)
    model = load_run_model(run, which)
    state = model.state
    if model.multilabel or labels:
        return _evaluate_labels_file(run, model, data_dir, labels, name, overwrite)
    test_dir = state["config"]["data"].get("test_dir")
    folder = data_dir or test_dir
    if not folder:
        raise DataError(f"{run.path}: the run has no data.test_dir; give the folder to evaluate with --data DIR")
    name = evaluation_name(run.path, folder, test_dir, name, overwrite)
    exclude = state["config"]["data"].get("exclude")
    manifest = read_manifest(exclude) if exclude and os.path.isfile(exclude) else None
    try:
        scan = scan_image_folder(folder, manifest=manifest)
    except DataError as e:
        raise DataError(f"--data: {e}") from e
    classes = list(state["classes"])
    if scan.classes != classes:
        extra = sorted(set(scan.classes) - set(classes))
        missing = sorted(set(classes) - set(scan.classes))
        raise DataError(f"{folder}: its classes differ from the run's (extra: {', '.join(extra) or '-'}; missing: "
                        f"{', '.join(missing) or '-'})")
    for path, reason in scan.bad_files:
        log.warning("skipping %s: %s", path, reason)
    metrics = evaluate_samples(run.path, model, scan.samples, name, str(Path(folder).resolve()), scan.bad_files)
    return run.evaluation(name), metrics


def _evaluate_labels_file(run, model, data_dir: str | None, labels: str | None, name: str | None,
                          overwrite: bool) -> tuple[Path, dict]:
    """A multi-label run on the images of a labels file, scored at the thresholds its validation chose."""
    from trainer.data.labels import labelled_scan
    from trainer.data.scan import DataError
    from trainer.deploy.inference import classify
    from trainer.deploy.multilabel import write_multilabel_evaluation

    if not model.multilabel:
        raise DataError("--labels: the run has one class per image; evaluate it on a folder with --data DIR")
    if data_dir:
        raise DataError("--data: a multi-label run is evaluated on a labels file: --labels FILE")
    test_labels = model.state["config"]["data"].get("test_labels")
    labels = labels or test_labels
    if not labels:
        raise DataError(f"{run.path}: the run has no data.test_labels; give the labels file with --labels FILE")
    samples = labelled_scan(labels, "--labels", names=model.classes).samples
    name = evaluation_name(run.path, labels, test_labels, name, overwrite)
    found = classify(model, [path for path, _ in samples])
    targets = torch.tensor([samples[i][1] for i in found.kept], dtype=torch.float32)
    skipped = [{"path": samples[i][0], "reason": r} for i, r in found.errors.items()]
    metrics = write_multilabel_evaluation(run.path, name, found.paths, found.logits, targets, model.classes,
                                          model.thresholds, extra={"folder": str(Path(labels).resolve()),
                                                                   "checkpoint": str(model.source),
                                                                   "epoch": model.state["epoch"], "skipped": skipped})
    return run.evaluation(name), metrics


def evaluate_samples(run_path: Path, model, samples: list[tuple[str, int]], name: str, folder: str,
                     skipped: list[tuple[str, str]] = ()) -> dict:
    """Classify `samples` (path, label) with a loaded run model, written as RUN_DIR/eval/NAME; the metrics.
    `folder` says where they come from (a folder, or the part of one held out by data.test_split)."""
    from trainer.deploy.inference import classify

    result = classify(model, [path for path, _ in samples])
    preds = Predictions(result.paths, torch.tensor([samples[i][1] for i in result.kept], dtype=torch.long),
                        result.logits)
    skipped = list(skipped) + [(samples[i][0], reason) for i, reason in result.errors.items()]
    return write_evaluation(run_path, name, preds, model.classes, extra={
        "folder": folder, "checkpoint": str(model.source), "epoch": model.state["epoch"],
        "skipped": [{"path": p, "reason": r} for p, r in skipped]})


def summary(metrics: dict) -> dict:
    """The small part of the metrics that goes into a `test` event and the run summary."""
    keys = ("images", "accuracy", "top5_accuracy", "loss", "ece")
    return {k: metrics[k] for k in keys if k in metrics}
