"""Label errors, copies and outliers in a run's data (issue #35, `main.py audit RUN`): which labelled images of the
run's folders are probably labelled wrong, ranked, with the label the evidence suggests; which images are copies of
another (resized or recompressed too), across train/val/test a leak (trainer.data.duplicates); and which are far from
every other image (the mean cosine distance of their embedding to its nearest ones, beyond Tukey's far-out fence).

Out-of-sample first: every image's class probabilities come from a model that did not see that image's label. Here
that is a linear probe (multinomial logistic regression) on the run's own embeddings (the input of its last linear
layer), cross-fitted over k stratified folds: cheap (one pass of the network over the images, then seconds), where a
k-fold of whole training runs would cost k runs (`--oof runs` does that: trainer.runs.cross_fit). The probabilities
go to cleanlab's confident learning (`cleanlab.filter.find_label_issues`, ranked by its self-confidence
label-quality score).

The result is kept beside the run (`audit/oof.npz`: per image the probabilities, fold, embedding and thumbnail;
`audit/label_issues.csv`, `duplicates.csv`, `outliers.csv`), and reused while the images, their labels (the manifest
included) and the checkpoint are unchanged. The images are read, never moved or rewritten; fixing a label goes
through the manifest.
"""

from __future__ import annotations

import hashlib
import io
import json
import logging
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from trainer.core.config import load_config
from trainer.core.csvfile import dict_rows_text
from trainer.core.errors import InputError, first_line
from trainer.core.files import atomic_write_bytes, atomic_write_text
from trainer.core.rundir import RunDir
from trainer.data.duplicates import (
    DuplicateGroup,
    Duplicates,
    ImageRef,
    LeakWorth,
    find_near_duplicates,
    format_duplicates,
    leak_worth,
)
from trainer.data.loader import load_manifest
from trainer.data.scan import DataError, data_root, printable_path, scan_image_folder
from trainer.deploy.inference import BATCH, LoadedModel, load_run_model

log = logging.getLogger(__name__)

FOLDS = 5
MIN_PER_CLASS = 2  # a class needs this many images for a fold to hold one out
OUTLIER_K = 10  # an image's typicality: its mean distance to this many nearest images
OUTLIER_IQR = 3.0  # listed beyond Q3 + this many interquartile ranges of those distances (Tukey's far-out fence)
UNSURE_TOP = 0.5  # unsure: the network gives no class of an image even odds (its top probability below this)
THUMB = 16  # px of the colour thumbnail that tells a copy from a look-alike
INSTALL = "pip install cleanlab scikit-learn (or pip install -e '.[data]')"


class AuditError(InputError, ValueError):
    pass


# (run, its labelled images, their labels, the classes, folds) -> (out-of-sample probabilities, each one's fold)
CrossFit = Callable[[RunDir, list[ImageRef], np.ndarray, list[str], int], tuple[np.ndarray, np.ndarray]]


@dataclass
class Suspect:
    path: str
    given: str
    suggested: str
    score: float  # cleanlab's label quality (self-confidence): the probability of the given label, out of sample
    fold: int
    add: str = ""  # multi-label: the labels it probably misses (`;` between them)
    remove: str = ""  # multi-label: the labels it probably should not carry
    flagged: bool = True  # confident learning flags it; False: below the line, among the least confident of the rest


@dataclass
class Outlier:
    path: str
    label: str
    suggested: str  # the probe's most probable class for it
    distance: float  # mean cosine distance to its OUTLIER_K nearest images
    fence: float  # the distance beyond which an image is listed (Tukey's far-out fence of all of them)
    why: str = "far"  # "far" (beyond the fence) or "unsure" (the network's top probability below UNSURE_TOP)
    top: float = 1.0  # the network's own top class probability for it (multi-label: that of the label `about`)
    about: str = ""  # multi-label, unsure: the label whose probability sits near its threshold


@dataclass
class Audit:
    images: int
    folds: int
    suspects: list[Suspect]  # most likely wrong first
    skipped: dict[str, str]  # path -> why it could not be read
    reused: bool  # the out-of-sample probabilities were kept from an earlier audit of the same data
    outliers: list[Outlier] = field(default_factory=list)  # farthest from every other image first, then the unsure
    duplicates: Duplicates = field(default_factory=Duplicates)  # exact and near copies, most alike first
    leak_worth: LeakWorth | None = None  # the run's test score with and without its leaked test images
    map_how: str = ""  # with --map: how RUN/audit/map.csv's coordinates were made
    oof: str = "probe"  # the out-of-sample probabilities: "probe" or "runs"


@dataclass
class Embedded:
    """What one pass of the network over the audited images gives, kept in RUN/audit/oof.npz."""

    rows: np.ndarray  # the index (in the audited images) of each image that could be read
    embeddings: np.ndarray
    thumbnails: np.ndarray  # THUMB x THUMB colour, 0-1 (`thumbnails`)
    probs: np.ndarray  # out of sample, for the labelled ones among `rows` (they come first)
    net_probs: np.ndarray  # the run's network's own, for every one of `rows`
    fold: np.ndarray
    skipped: dict[str, str]
    reused: bool
    key: str = ""  # the fingerprint of what it was computed from


def audited_images(run: RunDir) -> tuple[list[str], list[ImageRef], int]:
    """(classes, the run's images, how many of them are labelled): first every labelled image of data.train_dir (the
    manifest's additions with them) and data.val_dir (when set), with the run's manifest (data.exclude) applied; then
    data.test_dir's, as they are."""
    cfg = load_config(run.config).data
    manifest = load_manifest(cfg)
    classes: list[str] | None = None
    images: list[ImageRef] = []
    labelled = 0
    for split, key, folder in (("train", "data.train_dir", cfg.train_dir), ("val", "data.val_dir", cfg.val_dir),
                               ("test", "data.test_dir", cfg.test_dir)):
        if not folder:
            continue
        try:
            scan = scan_image_folder(folder, check=False, manifest=manifest if split != "test" else None,
                                     additions=split == "train")  # the images the run added from a pool too
            # (no file opened: the network's pass decodes each image and lists the ones it cannot read)
        except DataError as e:
            raise AuditError(f"{key}: {e}") from e
        if classes is not None and scan.classes != classes:
            raise AuditError(f"{key}: {folder}: its classes differ from data.train_dir's")
        classes = scan.classes
        images += [ImageRef(split, path, scan.classes[label]) for path, label in scan.samples]
        labelled += len(scan.samples) if split != "test" else 0
    return classes or [], images, labelled


@dataclass
class Pass:
    """One pass of a run's network over images: for each one that could be read (`kept`: its index in the paths
    given), the input of the last linear layer, a THUMB px colour thumbnail and the class probabilities."""

    embeddings: np.ndarray
    thumbnails: np.ndarray  # THUMB x THUMB colour, 0-1
    probs: np.ndarray
    kept: list[int]
    skipped: dict[str, str]  # unreadable path -> why


def embed(model: LoadedModel, paths: list[str], batch: int = BATCH) -> Pass:
    """The network's pass over `paths` (see Pass); an unreadable file is listed, not fatal."""
    last = [m for m in model.net.modules() if isinstance(m, torch.nn.Linear)]
    if not last:
        raise AuditError(f"{model.source}: the network has no linear layer to take embeddings from")
    captured: list[torch.Tensor] = []
    hook = last[-1].register_forward_hook(lambda mod, args, out: captured.append(args[0].detach().float().flatten(1)))
    model.net.to(memory_format=torch.channels_last)  # the same numbers; on a CPU convolutions take half the time
    whole: list[np.ndarray] = []  # the embeddings, thumbnails and probabilities, a row per path (made at the first
    # batch, when the sizes are known), filled as the batches come: never a list of batches and their concatenation
    kept, skipped, filled = [], {}, 0
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
                stacked = torch.stack(images)
                with torch.inference_mode(), model.preprocess.autocast("cpu"):
                    logits = model.net(model.preprocess.to_input(stacked).contiguous(memory_format=torch.channels_last))
                scores = torch.sigmoid(logits.float()) if model.multilabel else torch.softmax(logits.float(), dim=1)
                parts = (captured.pop().cpu().numpy(), thumbnails(stacked), scores.cpu().numpy())
                if not whole:
                    whole = [np.empty((len(paths), *part.shape[1:]), np.float32) for part in parts]
                for rows, part in zip(whole, parts):
                    rows[filled:filled + len(part)] = part
                filled += len(images)
    finally:
        hook.remove()
    if not whole:
        classes = len(model.classes)
        return Pass(np.zeros((0, 0), np.float32), np.zeros((0, 3 * THUMB * THUMB), np.float32),
                    np.zeros((0, classes), np.float32), kept, skipped)
    embeddings, thumbs, probs = (rows[:filled] for rows in whole)
    return Pass(embeddings, thumbs, probs, kept, skipped)


def thumbnails(images: torch.Tensor) -> np.ndarray:
    """A uint8 (N, 3, S, S) batch as THUMB x THUMB colour thumbnails: each row the channels' mean over each cell,
    0-1 (`trainer.data.duplicates` tells copies by them)."""
    return (F.adaptive_avg_pool2d(images.float(), THUMB) / 255).flatten(1).numpy()


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

    # n_jobs=1: cleanlab's default forks a pool, which can hang for good in a process that already holds threads
    # (torch's, the resident worker's; an audit in the test suite's worker never came back); the work is light
    ranked = find_label_issues(labels, probs, return_indices_ranked_by="self_confidence", n_jobs=1)
    return np.asarray(ranked, dtype=np.int64), get_label_quality_scores(labels, probs, method="self_confidence")


def below_the_line(ranked: np.ndarray, quality: np.ndarray) -> list[int]:
    """The rows `ranked` (confident learning's flags, most likely wrong first), then as many more of the others,
    least confident first. Confident learning counts the flips it is sure of: on real digits with 90 flipped it
    flagged 79 (77 of them flipped), and the next least confident held most of the rest (issue #69: the top 90 of
    this list were 96.7% flipped, where the flags alone reached 85.6% of them)."""
    flagged = set(ranked.tolist())
    rest = [int(r) for r in np.argsort(quality, kind="stable") if int(r) not in flagged][:len(ranked)]
    return ranked.tolist() + rest


def outlier_distances(embeddings: np.ndarray, k: int = OUTLIER_K) -> tuple[np.ndarray, float]:
    """(each row's mean cosine distance to its k nearest other rows, the far-out fence of those distances)."""
    from trainer.data.neighbours import nearest

    k = min(k, len(embeddings) - 1)
    if k < 1:
        return np.zeros(len(embeddings)), float("inf")
    distances, _ = nearest(embeddings, k + 1)
    mean = distances[:, 1:].mean(axis=1)  # the first neighbour is the image itself
    q1, q3 = np.percentile(mean, [25, 75])
    return mean, float(q3 + OUTLIER_IQR * (q3 - q1))


def find_outliers(images: list[ImageRef], embeddings: np.ndarray, probs: np.ndarray, net_probs: np.ndarray,
                  classes: list[str]) -> list[Outlier]:
    """The images far from every other (beyond the fence of outlier_distances), farthest first; then the ones the
    network calls nothing with confidence (its top probability below UNSURE_TOP), least sure first."""
    distance, fence = outlier_distances(embeddings)
    top = net_probs.max(axis=1) if len(net_probs) else np.ones(len(images))

    def outlier(r: int, why: str) -> Outlier:
        return Outlier(images[r].path, images[r].label, classes[int(probs[r].argmax())], float(distance[r]), fence,
                       why, float(top[r]))

    far = [outlier(r, "far") for r in np.argsort(-distance) if distance[r] > fence]
    unsure = [outlier(r, "unsure") for r in np.argsort(top, kind="stable")
              if top[r] < UNSURE_TOP and distance[r] <= fence]
    return far + unsure


def fingerprint(images: list[ImageRef], checkpoint: Path, folds: int | str) -> str:
    """What the kept results depend on: each image's split, path, label, size and time, the checkpoint, the folds."""
    h = hashlib.blake2b(digest_size=16)
    for image in images:
        st = os.stat(image.path)
        h.update(f"{image.split}\0{image.path}\0{image.label}\0{st.st_size}\0{st.st_mtime_ns}\n".encode())
    st = checkpoint.stat()
    h.update(f"{checkpoint}\0{st.st_size}\0{st.st_mtime_ns}\0{folds}".encode())
    return h.hexdigest()


def check_installed() -> None:
    """AuditError saying how to install them, where cleanlab or scikit-learn is missing."""
    try:
        import cleanlab  # noqa: F401
        import sklearn  # noqa: F401
    except ImportError as e:
        raise AuditError(f"finding label errors needs cleanlab and scikit-learn ({e.name} is missing): {INSTALL}") \
            from None


def audit_run(run: RunDir, folds: int | None = None, with_map: bool = False, cross_fit: CrossFit | None = None) -> Audit:
    """The label issues, copies and outliers of the run's images (see the module's docstring), and (`with_map`) a
    map of them; kept under RUN/audit/. The out-of-sample probabilities come from a cross-fitted linear probe on
    the run's embeddings (seconds), or from `cross_fit` (trainer.runs.cross_fit.cross_fitted: k training runs with
    the run's recipe, each without one fold)."""
    oof = "runs" if cross_fit else "probe"
    check_installed()
    model = load_run_model(run, "best")
    if model.multilabel:
        raise AuditError(f"{run.path}: a multi-label run: trainer.deploy.audit_multilabel audits it")
    folds = folds or FOLDS
    classes, images, labelled = audited_images(run)
    if classes != model.classes:
        raise AuditError(f"{run.path}: the folder's classes {classes} differ from the run's {model.classes}")
    _check_folds(run, classes, images[:labelled], folds)
    kept = _kept_or_computed(run, model, classes, images, labelled, folds, cross_fit)
    rows = kept.rows[kept.rows < labelled]  # the labelled images that could be read: the first of the rows
    found = _kept_findings(run, kept) if kept.reused else None  # the Map asks again: nothing to search again
    if found is None:
        found = _findings(kept, images, rows, classes)
        keep(run.path / "audit" / "findings.npz", kept.key, findings=json.dumps(_findings_json(*found)))
    suspects, outliers, copies = found
    worth = keep_findings(run, suspects, outliers, copies)
    audit = Audit(len(rows), folds, suspects, kept.skipped, kept.reused, outliers, copies, worth, oof=oof)
    if with_map:
        audit.map_how = write_map(run, kept, images, audit, [classes[int(p.argmax())] for p in kept.probs])
    return audit


def keep_findings(run: RunDir, suspects: list[Suspect], outliers: list[Outlier], copies: Duplicates) -> LeakWorth | None:
    """The findings written under RUN/audit/ (label_issues.csv, outliers.csv, duplicates.csv); the run's test score
    with and without its leaked test images, where it has both."""
    write_issues(run.path / "audit" / "label_issues.csv", suspects)
    write_outliers(run.path / "audit" / "outliers.csv", outliers)
    write_duplicates(run.path / "audit" / "duplicates.csv", copies)
    predictions = run.evaluation("test") / "predictions.csv"
    return leak_worth(predictions, copies) if copies.leaks and predictions.is_file() else None


def _findings(kept: Embedded, images: list[ImageRef], rows: np.ndarray,
              classes: list[str]) -> tuple[list[Suspect], list[Outlier], Duplicates]:
    """The label issues (cleanlab on the out-of-sample probabilities), outliers and copies of the images read."""
    index = {c: n for n, c in enumerate(classes)}
    labels = np.asarray([index[images[i].label] for i in rows], np.int64)
    ranked, quality = rank_issues(labels, kept.probs)
    flagged = set(ranked.tolist())
    suspects = [Suspect(images[rows[r]].path, classes[labels[r]], classes[int(kept.probs[r].argmax())],
                        float(quality[r]), int(kept.fold[r]), flagged=r in flagged)
                for r in below_the_line(ranked, quality)]
    outliers = find_outliers([images[i] for i in rows], kept.embeddings[:len(rows)], kept.probs,
                             kept.net_probs[:len(rows)], classes)
    copies = find_near_duplicates([images[i] for i in kept.rows], kept.embeddings, kept.thumbnails)
    return suspects, outliers, copies


def _findings_json(suspects: list[Suspect], outliers: list[Outlier], copies: Duplicates) -> dict:
    # vars(), not asdict(): their fields are plain values, and asdict's deep copies took 8 s of 43,000 suspects
    return {"suspects": [vars(s) for s in suspects], "outliers": [vars(o) for o in outliers],
            "groups": [{"images": [vars(i) for i in g.images], "near": g.near, "similarity": g.similarity}
                       for g in copies.groups],
            "unreadable": [list(u) for u in copies.unreadable]}


def _kept_findings(run: RunDir, kept: Embedded) -> tuple[list[Suspect], list[Outlier], Duplicates] | None:
    """The findings of the last audit of the same images, labels and checkpoint (RUN/audit/findings.npz, written
    with oof.npz's fingerprint): the neighbour searches (~n^1.9) are not run again for the Map."""
    stored = read_kept(run.path / "audit" / "findings.npz", kept.key, ("findings",))
    if stored is None:
        return None
    raw = json.loads(str(stored["findings"]))
    groups = [DuplicateGroup([ImageRef(**i) for i in g["images"]], g["near"], g["similarity"]) for g in raw["groups"]]
    return ([Suspect(**s) for s in raw["suspects"]], [Outlier(**o) for o in raw["outliers"]],
            Duplicates(groups, [tuple(u) for u in raw["unreadable"]]))


def write_map(run: RunDir, kept: Embedded, images: list[ImageRef], audit: Audit, suggested: list[str]) -> str:
    """RUN/audit/map.csv: every image read, its 2-D place (kept in map.npz while the data is unchanged), what the
    audit found of it and (`suggested`, for each labelled one read) what the probe calls it; how the places were
    made."""
    from trainer.deploy.data_map import project, write_map

    kept_file = run.path / "audit" / "map.npz"
    old = read_kept(kept_file, kept.key, ("xy", "how"))
    if old:
        xy, how = old["xy"], str(old["how"])
    else:
        xy, how = project(kept.embeddings)
        keep(kept_file, kept.key, xy=xy, how=how)
    finding = {s.path: "label issue" for s in audit.suspects if s.flagged} | \
        {o.path: "outlier" if o.why == "far" else "unsure" for o in audit.outliers}
    for g in audit.duplicates.groups:
        finding |= {i.path: "leak" if g.leak else "copy" for i in g.images}
    rows = []
    for r, i in enumerate(kept.rows):
        image = images[i]
        rows.append({"path": image.path, "split": image.split, "label": image.label,
                     "suggested": suggested[r] if r < len(suggested) else "",
                     "x": f"{xy[r, 0]:.4f}", "y": f"{xy[r, 1]:.4f}", "finding": finding.get(image.path, "")})
    write_map(run.path / "audit" / "map.csv", rows)
    return how


def _check_folds(run: RunDir, classes: list[str], labelled: list[ImageRef], folds: int) -> None:
    if not labelled:
        raise AuditError(f"{run.path}: its folders hold no labelled images")
    counts = np.bincount([classes.index(i.label) for i in labelled], minlength=len(classes))
    if folds < 2 or counts.min() < max(folds, MIN_PER_CLASS):
        thin = classes[int(counts.argmin())]
        raise AuditError(f"--folds {folds}: class {thin!r} has {int(counts.min())} images; every class needs at least "
                         f"as many images as folds (and folds at least 2)")


def _kept_or_computed(run: RunDir, model: LoadedModel, classes: list[str], images: list[ImageRef], labelled: int,
                      folds: int, cross_fit: CrossFit | None) -> Embedded:
    """The network's pass over `images` and the out-of-sample probabilities for the first `labelled` of them (from
    `cross_fit` when given, else the probe): from RUN/audit/oof.npz while its fingerprint matches, else computed and
    kept there."""
    index = {c: n for n, c in enumerate(classes)}

    def probe(embeddings: np.ndarray, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        labels = np.asarray([index[images[i].label] for i in rows], np.int64)
        if cross_fit:
            return cross_fit(run, [images[i] for i in rows], labels, classes, folds)
        return out_of_sample(embeddings, labels, len(classes), folds)

    return kept_or_computed(run, model, images, labelled, folds, "runs" if cross_fit else "probe", probe)


# (the labelled images' embeddings, their indices in the images) -> (out-of-sample probabilities, each one's fold)
Probe = Callable[[np.ndarray, np.ndarray], tuple[np.ndarray, np.ndarray]]


def kept_or_computed(run: RunDir, model: LoadedModel, images: list[ImageRef], labelled: int, folds: int, how: str,
                     probe: Probe) -> Embedded:
    """The network's pass over `images` and `probe`'s out-of-sample probabilities for the first `labelled` of them
    (`how` it made them): from RUN/audit/oof.npz while its fingerprint matches, else computed and kept there."""
    key = fingerprint(images, model.source, f"{folds} {how}")
    kept_file = run.path / "audit" / "oof.npz"
    kept = read_kept(kept_file, key, ("rows", "embeddings", "colour_thumbnails", "probs", "net_probs", "fold",
                                      "skipped"))  # (an older audit's grey thumbnails: computed again)
    if kept and kept["colour_thumbnails"].shape == (len(kept["rows"]), 3 * THUMB * THUMB):
        return Embedded(kept["rows"], kept["embeddings"], kept["colour_thumbnails"], kept["probs"],
                        kept["net_probs"], kept["fold"], json.loads(str(kept["skipped"])), True, key)
    paths = [i.path for i in images]
    done = embed(model, paths)
    embeddings, thumbs, skipped = done.embeddings, done.thumbnails, done.skipped
    rows = np.asarray(done.kept, np.int64)
    of_labelled = rows < labelled
    probs, fold_of = probe(embeddings[of_labelled], rows[of_labelled])
    keep(kept_file, key, probs=probs, net_probs=done.probs, fold=fold_of, rows=rows, embeddings=embeddings,
         colour_thumbnails=thumbs, paths=np.asarray([paths[i] for i in rows]), skipped=json.dumps(skipped))
    return Embedded(rows, embeddings, thumbs, probs, done.probs, fold_of, skipped, False, key)


def read_kept(path: Path, key: str, names: tuple[str, ...]) -> dict[str, np.ndarray] | None:
    """The arrays `names` kept in `path` when it was written for `key` (the fingerprint of what they came from);
    None when there is no such file, it is of another key, or it lacks one of them (written by an older audit)."""
    if not path.is_file():
        return None
    with np.load(path, allow_pickle=False) as kept:
        if str(kept["fingerprint"]) != key or any(n not in kept for n in names):
            return None
        return {n: kept[n] for n in names}


def keep(path: Path, key: str, **arrays) -> None:
    """`arrays` kept in `path` (atomically) with the fingerprint `key` of what they came from. Not compressed:
    embeddings hardly compress, and at 100,000 images compressing them took 10 s."""
    buffer = io.BytesIO()
    np.savez(buffer, fingerprint=key, **arrays)
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_bytes(path, buffer.getvalue())


def write_issues(path: Path, suspects: list[Suspect]) -> None:
    rows = [{"rank": rank, "path": x.path, "given": x.given, "suggested": x.suggested, "score": f"{x.score:.4f}",
             "fold": x.fold, "add": x.add, "remove": x.remove, "flagged": "yes" if x.flagged else "no"}
            for rank, x in enumerate(suspects, 1)]
    atomic_write_text(path, dict_rows_text(["rank", "path", "given", "suggested", "score", "fold", "add", "remove",
                                            "flagged"], rows))


def write_outliers(path: Path, outliers: list[Outlier]) -> None:
    rows = [{"rank": rank, "path": o.path, "label": o.label, "suggested": o.suggested, "why": o.why,
             "distance": f"{o.distance:.4f}", "fence": f"{o.fence:.4f}", "top": f"{o.top:.4f}", "about": o.about}
            for rank, o in enumerate(outliers, 1)]
    atomic_write_text(path, dict_rows_text(["rank", "path", "label", "suggested", "why", "distance", "fence", "top",
                                            "about"], rows))


def write_duplicates(path: Path, found: Duplicates) -> None:
    """One row per image of each group of copies (the group's number, whether it is a leak, how alike)."""
    rows = [{"group": n, "kind": "near" if g.near else "exact", "leak": "yes" if g.leak else "no",
             "similarity": f"{g.similarity:.4f}", "split": i.split, "path": i.path, "label": i.label}
            for n, g in enumerate(found.groups, 1) for i in g.images]
    atomic_write_text(path, dict_rows_text(["group", "kind", "leak", "similarity", "split", "path", "label"], rows))


def _oof_said(audit: Audit) -> str:
    if audit.oof == "runs":
        return f"{audit.folds} training runs with the run's recipe, each without one fold (RUN/audit/folds/)"
    return f"a {audit.folds}-fold linear probe on the run's embeddings"


def data_folder(run: RunDir) -> str:
    """The folder the run's images were given as: the one holding its data.train_dir, val_dir and test_dir (a folder
    with train/ val/ test/), or data.train_dir itself. The audit's paths are shown relative to it."""
    data = load_config(run.config).data
    return data_root(data.train_dir, data.val_dir, data.test_dir)


def format_audit(audit: Audit, run: RunDir, top: int) -> list[str]:
    """What `main.py audit` prints: the count, how it was found, and the `top` suspects."""
    flagged = sum(s.flagged for s in audit.suspects)
    share = flagged / max(1, audit.images)
    folder = data_folder(run)
    lines = [f"label issues: {flagged} of {audit.images} images ({share:.1%}), most likely wrong first "
             f"(cleanlab's confident learning on out-of-sample probabilities of {_oof_said(audit)}"
             f"{'; kept from the last audit' if audit.reused else ''})"
             + (f"; then {len(audit.suspects) - flagged} below the line, the least confident of the rest"
                if len(audit.suspects) > flagged else "")]
    for s in audit.suspects[:top]:
        change = " ".join([f"+{n}" for n in s.add.split(";") if n] + [f"-{n}" for n in s.remove.split(";") if n])
        lines.append(f"  {s.score:.3f}  {s.given or '(none)'} -> {s.suggested or '(none)'}"
                     f"{f' ({change})' if change else ''}  {printable_path(s.path, folder)}")
    if len(audit.suspects) > top:
        lines.append(f"  ... {len(audit.suspects) - top} more in {run.path / 'audit' / 'label_issues.csv'}")
    far = [o for o in audit.outliers if o.why == "far"]
    unsure = [o for o in audit.outliers if o.why == "unsure"]
    fence = f" (mean cosine distance to its {OUTLIER_K} nearest images over {far[0].fence:.3f})" if far else ""
    lines.append(f"outliers: {len(far)} images far from every other{fence}, farthest first")
    lines += [f"  {o.distance:.3f}  {o.label}  {printable_path(o.path, folder)}" for o in far[:top]]
    if any(o.about for o in unsure):
        lines.append(f"unsure: {len(unsure)} images with a label whose probability sits near its threshold, nearest "
                     f"first")
    else:
        lines.append(f"unsure: {len(unsure)} images the network gives no class even odds (its top probability under "
                     f"{UNSURE_TOP:.0%}), least sure first")
    lines += [f"  {o.top:.3f}  {o.about + ' of ' if o.about else ''}{o.label}  {printable_path(o.path, folder)}"
              for o in unsure[:top]]
    lines += format_duplicates(audit.duplicates, folder, top, "copies (exact, resized or recompressed)")
    if audit.leak_worth:
        lines.append(audit.leak_worth.line())
    for path, why in list(audit.skipped.items())[:5]:
        lines.append(f"skipped {printable_path(path, folder)}: {why}")
    return lines
