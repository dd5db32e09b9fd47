"""Which unlabelled images to label next (issue #35, `main.py label RUN --pool FOLDER --next N`): a pool of images
is run through the run's network and ordered by how unsure it is of them (the margin between its two most probable
classes, smallest first), with a diversity rule so the top of the list is not a row of near-copies: copies of an
image already taken are passed over (resized or recompressed: the audit's thumbnail rule), the 5N most uncertain
left are clustered into N groups by their embeddings (k-means) and each group gives its most uncertain image
(Zhdanov's "diverse mini-batch" active learning).

For a multi-label run (issue #49), how unsure the network is of an image is how near its probability for some label
sits to that label's threshold (the one its validation chose): the image whose most undecided label is nearest
first; the diversity rule is the same.

A pool image already in the run's folders (byte for byte: train, val or test), or already labelled in the manifest,
is set aside and said so; an unreadable one is listed. The labels themselves go into the manifest as additions
(`add:`, a class, or a multi-label run's label set `3;7`): the pool's files stay where they are, untouched.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

import numpy as np

from trainer.core.catalog import LABEL_NEXT_MAX
from trainer.core.config import load_config
from trainer.core.errors import InputError
from trainer.core.rundir import RunDir
from trainer.data.duplicates import ImageRef, copy_among, find_duplicates, shapes
from trainer.data.loader import load_manifest
from trainer.data.manifest import read_manifest
from trainer.data.scan import image_paths, printable_path
from trainer.deploy.audit import INSTALL, audited_images, embed
from trainer.deploy.audit_multilabel import audited_label_sets, label_set
from trainer.deploy.inference import load_run_model
from trainer.deploy.multilabel import run_thresholds

CANDIDATES_PER_PICK = 5  # the most uncertain 5N are clustered into N groups


class LabelError(InputError, ValueError):
    pass


@dataclass
class Pick:
    path: str
    guess: str  # the network's most probable class
    probability: float  # of the guess
    margin: float  # the guess's probability less the runner-up's (multi-label: the distance of `about`'s
    # probability from its threshold): small is unsure
    top: list[tuple[str, float]]  # the three most probable classes (multi-label: the three labels nearest their
    # thresholds)
    about: str = ""  # multi-label: the label the network is least decided on (`guess` is the set at the thresholds)


@dataclass
class NextToLabel:
    classes: list[str]  # the run's
    pool: int  # images found in the pool folder
    picks: list[Pick]  # the order to label them in
    in_dataset: dict[str, str] = field(default_factory=dict)  # pool image -> "split: the run's image it copies"
    labelled: list[str] = field(default_factory=list)  # already in the manifest's additions
    skipped: dict[str, str] = field(default_factory=dict)  # unreadable pool image -> why
    multilabel: bool = False  # the run's: picks carry label sets, and the manifest takes them so


def next_to_label(run: RunDir, pool: str, count: int, manifest_path: str | None = None) -> NextToLabel:
    """The `count` pool images to label next (see the module's docstring); those labelled in `manifest_path` (else
    the run's own manifest) are set aside."""
    if not 1 <= count <= LABEL_NEXT_MAX:
        raise LabelError(f"--next {count}: ask for 1 to {LABEL_NEXT_MAX} images")
    try:
        import sklearn  # noqa: F401 - the diversity rule's k-means
    except ImportError:
        raise LabelError(f"ordering a pool needs scikit-learn: {INSTALL}") from None
    paths = image_paths(pool)
    if not paths:
        raise LabelError(f"--pool {pool}: no images in that folder")
    model = load_run_model(run, "best")
    manifest = read_manifest(manifest_path) if manifest_path else load_manifest(load_config(run.config).data)
    out = NextToLabel(model.classes, len(paths), [], multilabel=model.multilabel)
    added = set(manifest.add) if manifest else set()
    out.labelled = [p for p in paths if os.path.realpath(p) in added]
    out.in_dataset = _copies_in_dataset(run, [p for p in paths if os.path.realpath(p) not in added], model.multilabel)
    fresh = [p for p in paths if os.path.realpath(p) not in added and p not in out.in_dataset]
    done = embed(model, fresh)
    out.skipped = done.skipped
    if done.kept:
        if model.multilabel:
            thresholds = np.asarray(run_thresholds(run.path, model.classes))
            margin = np.abs(done.probs - thresholds).min(axis=1)
            pick = lambda path, probs: _pick_labels(path, probs, model.classes, thresholds)  # noqa: E731
        else:
            margin = margins(done.probs)
            pick = lambda path, probs: _pick(path, probs, model.classes)  # noqa: E731
        order = diverse_uncertain(margin, done.embeddings, count, done.thumbnails)
        out.picks = [pick(fresh[done.kept[i]], done.probs[i]) for i in order]
    return out


def margins(probs: np.ndarray) -> np.ndarray:
    """Each row's most probable class's probability less the runner-up's."""
    top2 = np.sort(probs, axis=1)[:, -2:] if probs.shape[1] > 1 else np.concatenate([np.zeros_like(probs), probs], 1)
    return top2[:, 1] - top2[:, 0]


def diverse_uncertain(margin: np.ndarray, embeddings: np.ndarray, count: int, thumbnails: np.ndarray | None = None,
                      seed: int = 0) -> list[int]:
    """Row indices, most uncertain (smallest `margin`) first: walking down the margins, copies of an image already
    taken are passed over (by their colour thumbnails, the audit's rule for copies: `copy_among`), until
    CANDIDATES_PER_PICK x `count` are taken; those are clustered into `count` groups by their embeddings and the
    most uncertain of each is picked."""
    candidates: list[int] = []
    grey = shapes(thumbnails) if thumbnails is not None else None
    for i in np.argsort(margin, kind="stable"):
        if len(candidates) == CANDIDATES_PER_PICK * count:
            break
        if thumbnails is None or not candidates or not copy_among(thumbnails, grey, candidates, int(i)):
            candidates.append(int(i))
    if len(candidates) <= count:
        return candidates
    from sklearn.cluster import KMeans

    chosen = embeddings[candidates]
    unit = chosen / np.maximum(np.linalg.norm(chosen, axis=1, keepdims=True), 1e-12)
    groups = KMeans(n_clusters=count, n_init=3, random_state=seed).fit_predict(unit)
    picked = [next(i for i, g in zip(candidates, groups) if g == group) for group in set(groups.tolist())]
    return sorted(picked, key=lambda i: margin[i])


def _pick(path: str, probs: np.ndarray, classes: list[str]) -> Pick:
    order = np.argsort(-probs)
    runner_up = float(probs[order[1]]) if len(order) > 1 else 0.0
    return Pick(path, classes[int(order[0])], float(probs[order[0]]), float(probs[order[0]]) - runner_up,
                [(classes[int(i)], float(probs[i])) for i in order[:3]])


def _pick_labels(path: str, probs: np.ndarray, names: list[str], thresholds: np.ndarray) -> Pick:
    gap = np.abs(probs - thresholds)
    order = np.argsort(gap, kind="stable")
    about = int(order[0])
    return Pick(path, label_set(probs >= thresholds, names), float(probs[about]), float(gap[about]),
                [(names[int(i)], float(probs[i])) for i in order[:3]], names[about])


def _copies_in_dataset(run: RunDir, pool: list[str], multilabel: bool) -> dict[str, str]:
    """Pool images whose bytes are those of one of the run's images (train, val or test): pool path -> "split:
    that image"."""
    _, images, _ = (audited_label_sets if multilabel else audited_images)(run)
    found = find_duplicates([ImageRef("pool", p, "") for p in pool] + images)
    copies = {}
    for group in found.groups:
        known = next((f"{i.split}: {i.path}" for i in group.images if i.split != "pool"), None)
        copies |= {i.path: known for i in group.images if i.split == "pool" and known}
    return copies


def format_next(found: NextToLabel, manifest: str | None) -> list[str]:
    """What `main.py label` prints."""
    how = ("a label's probability nearest its threshold" if found.multilabel else
           "margin between its two most probable classes")
    lines = [f"label next: {len(found.picks)} of the {found.pool} pool images, the network's most uncertain first "
             f"({how}; one from each of {len(found.picks)} groups of the uncertain ones, so no two are near-copies)"]
    lines += [f"  {p.margin:.3f}  {p.guess or '(none)'} (unsure of {p.about}: {100 * p.probability:.0f}%)  "
              f"{printable_path(p.path)}" if p.about else
              f"  {p.margin:.3f}  {p.guess} ({100 * p.probability:.0f}%)  {printable_path(p.path)}"
              for p in found.picks]
    if found.in_dataset:
        lines.append(f"{len(found.in_dataset)} pool image(s) already in the run's data (the same bytes), left out:")
        lines += [f"  {printable_path(pool)} = {printable_path(known)}" for pool, known in list(found.in_dataset.items())[:10]]
    if found.labelled:
        lines.append(f"{len(found.labelled)} pool image(s) already labelled in the manifest")
    lines += [f"skipped {printable_path(path)}: {why}" for path, why in list(found.skipped.items())[:10]]
    where = manifest or "the manifest (data.exclude)"
    if found.multilabel:
        lines.append(f"label them under add: in {where} (image: its labels, ; between them)")
    else:
        lines.append(f"label them in the app (Results tab, Label a pool…) or under add: in {where} (image: class)")
    return lines
