"""A map of a run's images (issue #35, `main.py audit RUN --map`): the audit's embeddings projected to two
dimensions, kept as RUN/audit/map.csv with what the audit found of each image, for the app to draw.

The projection: PCA to at most 50 dimensions, then UMAP (`umap-learn`) where it is installed, else openTSNE's t-SNE
(FFT-accelerated, linear in the images: the `data` extra; 33 s at 20,000 images where scikit-learn's Barnes-Hut took
72 s), else scikit-learn's. Each keeps neighbours together; distances between far clusters mean little. Past FIT_UP_TO
images, t-SNE fits a random FIT_UP_TO of them and each other image goes beside its nearest fitted one (by cosine on
the principal components), scattered by half the spacing of the map's points there, so a cluster keeps its shape
(at the median of several, the added images drew a dense core in each cluster): t-SNE's time grows with the images
it fits (openTSNE: 18 s at 5,000, ~50 s at 10,000 on 2 cores), the placing takes seconds at 100,000.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

import numpy as np

from trainer.core.csvfile import dict_rows_text
from trainer.core.files import atomic_write_text

log = logging.getLogger(__name__)

PCA_DIMS = 50
FIT_UP_TO = 5_000  # images t-SNE fits; the others are placed among them
COLUMNS = ["path", "split", "label", "suggested", "x", "y", "finding"]


def project(embeddings: np.ndarray, seed: int = 0) -> tuple[np.ndarray, str]:
    """(n x 2 coordinates, how they were made)."""
    from sklearn.decomposition import PCA

    n = len(embeddings)
    if n < 3:
        return np.zeros((n, 2)), "too few images to project"
    reduced = PCA(n_components=min(PCA_DIMS, n - 1, embeddings.shape[1]), random_state=seed).fit_transform(embeddings)
    perplexity = float(min(30, max(2, (n - 1) / 3)))
    try:
        import umap
    except ImportError:
        umap = None
    if umap is not None:
        xy = umap.UMAP(n_components=2, random_state=seed).fit_transform(reduced)
        return xy, f"UMAP of {reduced.shape[1]} principal components"
    try:
        from openTSNE import TSNE as OpenTSNE
    except ImportError:
        from sklearn.manifold import TSNE

        xy = TSNE(n_components=2, perplexity=perplexity, init="pca", random_state=seed).fit_transform(reduced)
        return xy, f"t-SNE (scikit-learn, perplexity {perplexity:g}) of {reduced.shape[1]} principal components"
    fit = np.arange(n) if n <= FIT_UP_TO else np.sort(np.random.default_rng(seed).choice(n, FIT_UP_TO, replace=False))
    fitted = np.asarray(OpenTSNE(perplexity=perplexity, random_state=seed, n_jobs=os.cpu_count() or 1).fit(reduced[fit]))
    how = f"t-SNE (openTSNE, perplexity {perplexity:g}) of {reduced.shape[1]} principal components"
    if n <= FIT_UP_TO:
        return fitted, how
    xy = np.empty((n, 2))
    xy[fit] = fitted
    placed = np.setdiff1d(np.arange(n), fit)
    xy[placed] = place_beside(fitted, reduced[fit], reduced[placed], seed)
    return xy, (f"{how}, fitted on {FIT_UP_TO:,} of the {n:,} images; each other one placed beside its nearest among "
                f"them")


def place_beside(fitted_xy: np.ndarray, fitted: np.ndarray, others: np.ndarray, seed: int) -> np.ndarray:
    """A map place for each of `others`: beside its nearest of `fitted` (cosine on the principal components),
    scattered by half the map's spacing there (each fitted point's distance to its nearest other on the map)."""
    from sklearn.neighbors import NearestNeighbors

    from trainer.data.neighbours import nearest

    _, near = nearest(others, 1, among=fitted)
    gaps, _ = NearestNeighbors(n_neighbors=2).fit(fitted_xy).kneighbors(fitted_xy)  # Euclidean, on the map
    spacing = gaps[near[:, 0], 1]
    jitter = np.random.default_rng(seed).normal(size=(len(others), 2))
    return fitted_xy[near[:, 0]] + jitter * spacing[:, None] / 2


def write_map(path: Path, rows: list[dict]) -> None:
    atomic_write_text(path, dict_rows_text(COLUMNS, rows))
