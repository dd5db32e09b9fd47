"""Label errors and outliers in a run's data (issue #35, `main.py audit RUN`): which labelled images of the run's
folders are probably labelled wrong, ranked, with the label the evidence suggests; and which are far from every other
image (the mean cosine distance of their embedding to its nearest ones, beyond Tukey's far-out fence).

Out-of-sample first: every image's class probabilities come from a model that did not see that image's label. Here
that is a linear probe (multinomial logistic regression) on the run's own embeddings (the input of its last linear
layer), cross-fitted over k stratified folds: cheap (one pass of the network over the images, then seconds), where a
k-fold of whole training runs would cost k runs. The probabilities go to cleanlab's confident learning
(`cleanlab.filter.find_label_issues`, ranked by its self-confidence label-quality score).

The result is kept beside the run (`audit/oof.npz`: per image the probabilities, fold and embedding; and
`audit/label_issues.csv`), and reused while the images, their labels (the manifest included) and the checkpoint are
unchanged. The images are read, never moved or rewritten; fixing a label goes through the manifest.
"""

from __future__ import annotations

import hashlib
import io
import json
import logging
import os
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from trainer.core.config import load_config
from trainer.core.csvfile import dict_rows_text
from trainer.core.errors import InputError, first_line
from trainer.core.files import atomic_write_bytes, atomic_write_text
from trainer.core.rundir import RunDir
from trainer.data.loader import load_manifest
from trainer.data.scan import DataError, scan_image_folder
from trainer.deploy.inference import BATCH, LoadedModel, load_run_model

log = logging.getLogger(__name__)

FOLDS = 5
MIN_PER_CLASS = 2  # a class needs this many images for a fold to hold one out
OUTLIER_K = 10  # an image's typicality: its mean distance to this many nearest images
OUTLIER_IQR = 3.0  # listed beyond Q3 + this many interquartile ranges of those distances (Tukey's far-out fence)
INSTALL = "pip install cleanlab scikit-learn (or pip install -e '.[data]')"


class AuditError(InputError, ValueError):
    pass


@dataclass
class Suspect:
    path: str
    given: str
    suggested: str
    score: float  # cleanlab's label quality (self-confidence): the probability of the given label, out of sample
    fold: int


@dataclass
class Outlier:
    path: str
    label: str
    suggested: str  # the probe's most probable class for it
    distance: float  # mean cosine distance to its OUTLIER_K nearest images
    fence: float  # the distance beyond which an image is listed (Tukey's far-out fence of all of them)


@dataclass
class Audit:
    images: int
    folds: int
    suspects: list[Suspect]  # most likely wrong first
    skipped: dict[str, str]  # path -> why it could not be read
    reused: bool  # the out-of-sample probabilities were kept from an earlier audit of the same data
    outliers: list[Outlier] = field(default_factory=list)  # farthest from every other image first


def labelled_images(run: RunDir) -> tuple[list[str], list[tuple[str, int]]]:
    """(classes, (path, label) of every labelled image the run's folders hold: data.train_dir, and data.val_dir
    when set), with the run's manifest (data.exclude) applied."""
    cfg = load_config(run.config).data
    manifest = load_manifest(cfg)
    classes: list[str] | None = None
    samples: list[tuple[str, int]] = []
    for key, folder in (("data.train_dir", cfg.train_dir), ("data.val_dir", cfg.val_dir)):
        if not folder:
            continue
        try:
            scan = scan_image_folder(folder, manifest=manifest)
        except DataError as e:
            raise AuditError(f"{key}: {e}") from e
        if classes is not None and scan.classes != classes:
            raise AuditError(f"{key}: {folder}: its classes differ from data.train_dir's")
        classes = scan.classes
        samples += scan.samples
    return classes or [], samples


def embed(model: LoadedModel, paths: list[str], batch: int = BATCH) -> tuple[np.ndarray, list[int], dict[str, str]]:
    """(embeddings, the index of each row in `paths`, unreadable path -> why): the input of the network's last
    linear layer for each image that could be read."""
    last = [m for m in model.net.modules() if isinstance(m, torch.nn.Linear)]
    if not last:
        raise AuditError(f"{model.source}: the network has no linear layer to take embeddings from")
    captured: list[torch.Tensor] = []
    hook = last[-1].register_forward_hook(lambda mod, args, out: captured.append(args[0].detach().float().flatten(1)))
    rows, kept, skipped = [], [], {}
    try:
        for start in range(0, len(paths), batch):
            images = []
            for i, path in enumerate(paths[start:start + batch], start=start):
                try:
                    images.append(model.preprocess.decode(path))
                    kept.append(i)
                except Exception as e:  # noqa: BLE001 - any unreadable file is listed, not fatal
                    skipped[path] = f"cannot read image ({first_line(e)})"
            if images:
                with torch.inference_mode(), model.preprocess.autocast("cpu"):
                    model.net(model.preprocess.to_input(torch.stack(images)))
                rows.append(captured.pop().cpu().numpy())
    finally:
        hook.remove()
    return (np.concatenate(rows) if rows else np.zeros((0, 0), np.float32)), kept, skipped


def out_of_sample(embeddings: np.ndarray, labels: np.ndarray, classes: int, folds: int,
                  seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """(probabilities, fold) per row: each row's from a logistic regression fitted on the other folds (stratified;
    the embeddings standardised on the training folds)."""
    from sklearn.linear_model import LogisticRegression
    from sklearn.model_selection import StratifiedKFold
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler

    probs = np.zeros((len(labels), classes), np.float64)
    fold_of = np.zeros(len(labels), np.int64)
    splitter = StratifiedKFold(n_splits=folds, shuffle=True, random_state=seed)
    for fold, (fit_rows, held_rows) in enumerate(splitter.split(embeddings, labels)):
        probe = make_pipeline(StandardScaler(), LogisticRegression(max_iter=2000, C=0.5))
        probe.fit(embeddings[fit_rows], labels[fit_rows])
        probs[np.ix_(held_rows, probe.classes_)] = probe.predict_proba(embeddings[held_rows])
        fold_of[held_rows] = fold
    return probs, fold_of


def rank_issues(labels: np.ndarray, probs: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(row indices of the label issues, most likely wrong first; every row's label-quality score): cleanlab's
    confident learning."""
    from cleanlab.filter import find_label_issues
    from cleanlab.rank import get_label_quality_scores

    ranked = find_label_issues(labels, probs, return_indices_ranked_by="self_confidence")
    return np.asarray(ranked, dtype=np.int64), get_label_quality_scores(labels, probs, method="self_confidence")


def outlier_distances(embeddings: np.ndarray, k: int = OUTLIER_K) -> tuple[np.ndarray, float]:
    """(each row's mean cosine distance to its k nearest other rows, the far-out fence of those distances)."""
    from sklearn.neighbors import NearestNeighbors

    unit = embeddings / np.maximum(np.linalg.norm(embeddings, axis=1, keepdims=True), 1e-12)
    k = min(k, len(unit) - 1)
    if k < 1:
        return np.zeros(len(unit)), float("inf")
    distances, _ = NearestNeighbors(n_neighbors=k + 1, metric="cosine").fit(unit).kneighbors(unit)
    mean = distances[:, 1:].mean(axis=1)  # the first neighbour is the image itself
    q1, q3 = np.percentile(mean, [25, 75])
    return mean, float(q3 + OUTLIER_IQR * (q3 - q1))


def fingerprint(samples: list[tuple[str, int]], checkpoint: Path, folds: int) -> str:
    """What the kept probabilities depend on: each image's path, label, size and time, the checkpoint, the folds."""
    h = hashlib.blake2b(digest_size=16)
    for path, label in samples:
        st = os.stat(path)
        h.update(f"{path}\0{label}\0{st.st_size}\0{st.st_mtime_ns}\n".encode())
    st = checkpoint.stat()
    h.update(f"{checkpoint}\0{st.st_size}\0{st.st_mtime_ns}\0{folds}".encode())
    return h.hexdigest()


def audit_run(run: RunDir, folds: int = FOLDS) -> Audit:
    """The label issues of the run's labelled images (see the module's docstring); kept under RUN/audit/."""
    try:
        import cleanlab  # noqa: F401
        import sklearn  # noqa: F401
    except ImportError as e:
        raise AuditError(f"finding label errors needs cleanlab and scikit-learn ({e.name} is missing): {INSTALL}") \
            from None
    model = load_run_model(run, "best")
    classes, samples = labelled_images(run)
    if classes != model.classes:
        raise AuditError(f"{run.path}: the folder's classes {classes} differ from the run's {model.classes}")
    counts = np.bincount([label for _, label in samples], minlength=len(classes))
    if not samples:
        raise AuditError(f"{run.path}: its folders hold no labelled images")
    if folds < 2 or counts.min() < max(folds, MIN_PER_CLASS):
        thin = classes[int(counts.argmin())]
        raise AuditError(f"--folds {folds}: class {thin!r} has {int(counts.min())} images; every class needs at least "
                         f"as many images as folds (and folds at least 2)")
    probs, fold_of, rows, embeddings, skipped, reused = _out_of_sample_kept(run, model, classes, samples, folds)
    labels = np.asarray([samples[i][1] for i in rows], np.int64)
    ranked, quality = rank_issues(labels, probs)
    suspects = [Suspect(samples[rows[r]][0], classes[labels[r]], classes[int(probs[r].argmax())], float(quality[r]),
                        int(fold_of[r])) for r in ranked]
    write_issues(run.path / "audit" / "label_issues.csv", suspects)
    distance, fence = outlier_distances(embeddings)
    far = [r for r in np.argsort(-distance) if distance[r] > fence]
    outliers = [Outlier(samples[rows[r]][0], classes[labels[r]], classes[int(probs[r].argmax())], float(distance[r]), fence)
                for r in far]
    write_outliers(run.path / "audit" / "outliers.csv", outliers)
    return Audit(len(rows), folds, suspects, skipped, reused, outliers)


def _out_of_sample_kept(run: RunDir, model: LoadedModel, classes: list[str], samples: list[tuple[str, int]],
                        folds: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, dict[str, str], bool]:
    """(probabilities, folds, sample index of each row, embeddings, skipped files, reused): from RUN/audit/oof.npz
    while its fingerprint matches, else computed and kept there."""
    key = fingerprint(samples, model.source, folds)
    kept_file = run.path / "audit" / "oof.npz"
    if kept_file.is_file():
        with np.load(kept_file, allow_pickle=False) as kept:
            if str(kept["fingerprint"]) == key:
                return (kept["probs"], kept["fold"], kept["rows"], kept["embeddings"],
                        json.loads(str(kept["skipped"])), True)
    paths = [p for p, _ in samples]
    embeddings, rows, skipped = embed(model, paths)
    rows = np.asarray(rows, np.int64)
    labels = np.asarray([samples[i][1] for i in rows], np.int64)
    probs, fold_of = out_of_sample(embeddings, labels, len(classes), folds)
    buffer = io.BytesIO()
    np.savez_compressed(buffer, fingerprint=key, probs=probs, fold=fold_of, rows=rows, embeddings=embeddings,
                        paths=np.asarray([paths[i] for i in rows]), skipped=json.dumps(skipped))
    kept_file.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_bytes(kept_file, buffer.getvalue())
    return probs, fold_of, rows, embeddings, skipped, False


def write_issues(path: Path, suspects: list[Suspect]) -> None:
    rows = [{"rank": rank, "path": x.path, "given": x.given, "suggested": x.suggested, "score": f"{x.score:.4f}",
             "fold": x.fold} for rank, x in enumerate(suspects, 1)]
    atomic_write_text(path, dict_rows_text(["rank", "path", "given", "suggested", "score", "fold"], rows))


def write_outliers(path: Path, outliers: list[Outlier]) -> None:
    rows = [{"rank": rank, "path": o.path, "label": o.label, "suggested": o.suggested, "distance": f"{o.distance:.4f}",
             "fence": f"{o.fence:.4f}"} for rank, o in enumerate(outliers, 1)]
    atomic_write_text(path, dict_rows_text(["rank", "path", "label", "suggested", "distance", "fence"], rows))


def format_audit(audit: Audit, run: RunDir, top: int) -> list[str]:
    """What `main.py audit` prints: the count, how it was found, and the `top` suspects."""
    share = len(audit.suspects) / max(1, audit.images)
    lines = [f"label issues: {len(audit.suspects)} of {audit.images} images ({share:.1%}), most likely wrong first "
             f"(cleanlab's confident learning on out-of-sample probabilities of a {audit.folds}-fold linear probe on "
             f"the run's embeddings{'; kept from the last audit' if audit.reused else ''})"]
    for s in audit.suspects[:top]:
        lines.append(f"  {s.score:.3f}  {s.given} -> {s.suggested}  {s.path}")
    if len(audit.suspects) > top:
        lines.append(f"  ... {len(audit.suspects) - top} more in {run.path / 'audit' / 'label_issues.csv'}")
    fence = f" (mean cosine distance to its {OUTLIER_K} nearest images over {audit.outliers[0].fence:.3f})" \
        if audit.outliers else ""
    lines.append(f"outliers: {len(audit.outliers)} images far from every other{fence}, farthest first")
    for o in audit.outliers[:top]:
        lines.append(f"  {o.distance:.3f}  {o.label}  {o.path}")
    for path, why in list(audit.skipped.items())[:5]:
        lines.append(f"skipped {path}: {why}")
    return lines
