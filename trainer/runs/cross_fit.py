"""Out-of-sample probabilities from k-fold training runs (issue #35's first choice, `main.py audit RUN --oof runs`,
which hands this to trainer.deploy.audit):
the labelled images are split into k stratified folds, and for each fold a run with the run's own recipe trains
without that fold (its images left out through a manifest, the folder untouched) and predicts it. Every image's
probabilities then come from a network that never saw its label: what the cheap probe on the run's embeddings
approximates (the run's network did see every training label). It costs k training runs.

The fold runs live under RUN/audit/folds/ (their configs, manifests, logs), so what was done can be looked at.
"""

from __future__ import annotations

import logging
import subprocess
from collections.abc import Callable

import numpy as np

from trainer.core.config import load_config, save_config
from trainer.core.errors import InputError
from trainer.core.rundir import RunDir
from trainer.data.duplicates import ImageRef
from trainer.data.loader import load_manifest
from trainer.data.manifest import Manifest, write_manifest
from trainer.deploy.audit import embed
from trainer.deploy.inference import load_run_model
from trainer.runs.launch import train_command

log = logging.getLogger(__name__)


class CrossFitError(InputError, RuntimeError):
    pass


def fold_of_each(labels: np.ndarray, folds: int, seed: int = 0) -> np.ndarray:
    """Each row's fold, stratified by label."""
    from sklearn.model_selection import StratifiedKFold

    fold = np.zeros(len(labels), np.int64)
    for f, (_, held) in enumerate(StratifiedKFold(folds, shuffle=True, random_state=seed).split(labels, labels)):
        fold[held] = f
    return fold


def cross_fitted(run: RunDir, images: list[ImageRef], labels: np.ndarray, classes: list[str], folds: int,
                 say: Callable[[str], None] = log.info) -> tuple[np.ndarray, np.ndarray]:
    """(probabilities, fold) of each of `images` (labelled, readable), each from the best checkpoint of a run that
    trained without it."""
    fold = fold_of_each(labels, folds)
    probs = np.zeros((len(images), len(classes)))
    for f in range(folds):
        held = np.flatnonzero(fold == f)
        paths = [images[i].path for i in held]
        fold_run = train_without(run, paths, f, folds, say)
        done = embed(load_run_model(fold_run, "best"), paths)
        if len(done.kept) != len(paths):
            raise CrossFitError(f"fold {f + 1}: {len(paths) - len(done.kept)} of its images could not be read again")
        probs[held] = done.probs
    return probs, fold


def train_without(run: RunDir, held_out: list[str], f: int, folds: int, say: Callable[[str], None]) -> RunDir:
    """A run with `run`'s config and manifest, less the `held_out` images: RUN/audit/folds/fold-F."""
    root = run.path / "audit" / "folds"
    cfg = load_config(run.config)
    manifest = load_manifest(cfg.data) or Manifest(root / f"fold-{f + 1}.exclude.yaml")
    fold_manifest = Manifest(root / f"fold-{f + 1}.exclude.yaml", list(manifest.exclude), dict(manifest.relabel),
                             dict(manifest.add))
    for path in held_out:
        fold_manifest.mark_excluded(path)
    cfg.data.exclude = str(write_manifest(fold_manifest))
    cfg.data.test_dir, cfg.data.test_split = None, 0.0  # each fold predicts its own held-out images
    cfg.export.formats = []
    cfg.train.budget, cfg.train.min_epochs = 0.0, 0
    config = root / f"fold-{f + 1}.yaml"
    save_config(cfg, config)
    target = RunDir(root / f"fold-{f + 1}")
    say(f"fold {f + 1} of {folds}: training without its {len(held_out)} images ({target.path})")
    done = subprocess.run(train_command(config, run_dir=target.path, overwrite=True), capture_output=True, text=True)
    if done.returncode != 0:
        last = [line for line in done.stderr.splitlines() if line.strip()]
        raise CrossFitError(f"fold {f + 1}'s run failed ({target.path}): {last[-1] if last else done.returncode}")
    return target
