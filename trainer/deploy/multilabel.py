"""Multi-label metrics (issue #36): each label's average precision and their mean (mAP: macro over the labels, micro
over every image-label pair), each label's threshold chosen on the validation split (the one with the best F1), and
precision, recall and F1 at those thresholds. In torch, so the training loop measures mAP every epoch.

Average precision is scikit-learn's definition (`average_precision_score`): the precision at each distinct score,
weighted by the recall it adds; tied scores count as one threshold. A label with no positive image has no AP (null,
not 0) and keeps the threshold 0.5.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from trainer.core.predictions import MULTILABEL_FIELDS as PREDICTION_FIELDS
from trainer.core.rundir import RunDir

DEFAULT_THRESHOLD = 0.5


def _ranked(scores: torch.Tensor, targets: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(distinct scores from high to low, true positives and false positives when predicting at each of them)."""
    order = torch.argsort(scores, descending=True, stable=True)
    s, t = scores[order].double(), targets[order].double()
    tp, fp = torch.cumsum(t, 0), torch.cumsum(1 - t, 0)
    last = torch.ones_like(s, dtype=torch.bool)  # the last image of each run of tied scores
    last[:-1] = s[1:] != s[:-1]
    return s[last], tp[last], fp[last]


def average_precision(scores: torch.Tensor, targets: torch.Tensor) -> float | None:
    """The AP of `scores` (N,) for the binary `targets` (N,); None without a positive."""
    positives = float(targets.sum())
    if positives == 0:
        return None
    _, tp, fp = _ranked(scores, targets)
    precision, recall = tp / (tp + fp), tp / positives
    gained = torch.diff(recall, prepend=torch.zeros(1, dtype=recall.dtype))
    return float((gained * precision).sum())


def best_f1_threshold(probs: torch.Tensor, targets: torch.Tensor) -> float:
    """The probability threshold (predict the label at or above it) with the best F1 on these images; halfway to the
    next lower score, so a score a little under the lowest positive's still counts. DEFAULT_THRESHOLD without a
    positive."""
    positives = float(targets.sum())
    if positives == 0:
        return DEFAULT_THRESHOLD
    s, tp, fp = _ranked(probs, targets)
    f1 = 2 * tp / (2 * tp + fp + (positives - tp))
    best = int(torch.argmax(f1))
    below = float(s[best + 1]) if best + 1 < len(s) else 0.0
    return (float(s[best]) + below) / 2


def choose_thresholds(probs: torch.Tensor, targets: torch.Tensor) -> list[float]:
    """Each label's F1-best threshold on (N, L) probabilities and targets."""
    return [best_f1_threshold(probs[:, j], targets[:, j]) for j in range(probs.shape[1])]


def mean_average_precision(logits: torch.Tensor, targets: torch.Tensor) -> tuple[float | None, float | None]:
    """(macro mAP: the mean of the labels' APs, over the labels with a positive; micro: the AP of every pair)."""
    aps = [average_precision(logits[:, j], targets[:, j]) for j in range(logits.shape[1])]
    known = [a for a in aps if a is not None]
    macro = sum(known) / len(known) if known else None
    return macro, average_precision(logits.flatten(), targets.flatten())


def multilabel_metrics(logits: torch.Tensor, targets: torch.Tensor, names: list[str],
                       thresholds: list[float] | None = None) -> dict:
    """Every metric of a multi-label `metrics.json`; `thresholds` chosen here (F1-best per label) when not given
    (the validation split), else applied as given (a test set is scored at the thresholds validation chose)."""
    logits, targets = logits.float(), (targets > 0.5).float()
    probs = torch.sigmoid(logits)
    chosen = thresholds is None
    if thresholds is None:
        thresholds = choose_thresholds(probs, targets)
    predicted = probs >= torch.tensor(thresholds)
    truth = targets.bool()
    per_label = {}
    for j, name in enumerate(names):
        tp = int((predicted[:, j] & truth[:, j]).sum())
        fp = int((predicted[:, j] & ~truth[:, j]).sum())
        fn = int((~predicted[:, j] & truth[:, j]).sum())
        precision = tp / (tp + fp) if tp + fp else None
        recall = tp / (tp + fn) if tp + fn else None
        f1 = 2 * tp / (2 * tp + fp + fn) if tp + fp + fn else None
        per_label[name] = {"ap": average_precision(logits[:, j], targets[:, j]), "precision": precision,
                           "recall": recall, "f1": f1, "support": tp + fn, "threshold": thresholds[j]}
    macro, micro = mean_average_precision(logits, targets)
    n = len(targets)
    return {"task": "multilabel", "images": n, "map": macro, "map_micro": micro,
            "exact_match": float((predicted == truth).all(1).double().mean()) if n else None,
            "label_accuracy": float((predicted == truth).double().mean()) if n else None,
            "loss": float(F.binary_cross_entropy_with_logits(logits, targets)) if n else None,
            "thresholds": dict(zip(names, thresholds)), "thresholds_chosen_here": chosen,
            "per_label": per_label, "classes": list(names)}




def prediction_rows(paths: list[str], probs: torch.Tensor, targets: torch.Tensor | None, names: list[str],
                    thresholds: list[float]) -> list[dict]:
    """One row per image: its labels (`;`-separated), the labels at or above their thresholds, and every label's
    probability (`label:0.931;...`, the file's order of labels)."""
    rows = []
    for i, path in enumerate(paths):
        p = probs[i].tolist()
        rows.append({"path": path,
                     "true": ";".join(n for n, t in zip(names, targets[i].tolist()) if t > 0.5)
                     if targets is not None else "",
                     "predicted": ";".join(n for n, q, t in zip(names, p, thresholds) if q >= t),
                     "probabilities": ";".join(f"{n}:{q:.4f}" for n, q in zip(names, p))})
    return rows


def write_multilabel_evaluation(run_path, name: str, paths: list[str], logits: torch.Tensor, targets: torch.Tensor,
                                names: list[str], thresholds: list[float] | None = None,
                                extra: dict | None = None) -> dict:
    """metrics.json (multilabel_metrics; the thresholds chosen here when none are given) and predictions.csv under
    run_path/eval/NAME, each replaced atomically; the metrics."""
    import json

    from trainer.core.csvfile import dict_rows_text
    from trainer.core.files import atomic_write_text

    folder = RunDir(run_path).evaluation(name)
    folder.mkdir(parents=True, exist_ok=True)
    metrics = {**multilabel_metrics(logits, targets, names, thresholds), **(extra or {})}
    used = [metrics["thresholds"][n] for n in names]
    atomic_write_text(folder / "metrics.json", json.dumps(metrics, indent=1))
    rows = prediction_rows(paths, torch.sigmoid(logits.float()), targets, names, used)
    atomic_write_text(folder / "predictions.csv", dict_rows_text(PREDICTION_FIELDS, rows))
    return metrics


def run_thresholds(run_path, names: list[str]) -> list[float]:
    """The thresholds a multi-label run chose on its validation split at its best epoch (eval/val/metrics.json);
    DEFAULT_THRESHOLD for a label it has none for (a run stopped before its first epoch ended)."""
    import json

    try:
        chosen = json.loads((RunDir(run_path).evaluation("val") / "metrics.json").read_text(encoding="utf-8"))
        chosen = chosen.get("thresholds") or {}
    except (OSError, ValueError):
        chosen = {}
    return [float(chosen.get(n, DEFAULT_THRESHOLD)) for n in names]
