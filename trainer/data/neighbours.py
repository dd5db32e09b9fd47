"""Each row's nearest rows by cosine, for the audit's outliers, copies and map: faiss-cpu where it is installed (the
`data` extra; 11x faster than scikit-learn at 20,000 images, docs/benchmarks.md), else scikit-learn.

Up to EXACT_UP_TO rows the search is exact (either library). Beyond, faiss searches an inverted file: the rows
grouped around 2 sqrt(n) k-means centres, each query looking only in the few groups nearest it (`bench/neighbours.py
--approximate` measures the time and how many true neighbours it finds). An image and its copies sit in the same
group, so a search for copies (`near_only`) looks in fewer groups still; an image's mean distance to its nearest (the
outliers) is at most a little larger where a true neighbour was missed.
"""

from __future__ import annotations

import math

import numpy as np

EXACT_UP_TO = 30_000  # rows searched exactly (faiss: a few seconds at 30,000 x 512 on 2 cores)
PROBES = 16  # groups of the inverted file a query looks in
NEAR_PROBES = 4  # and when only near copies matter
TRAIN_PER_GROUP = 64  # rows the grouping is learned from, per group (at most)


def unit_rows(rows: np.ndarray) -> np.ndarray:
    unit = np.asarray(rows, dtype=np.float32)
    return np.ascontiguousarray(unit / np.maximum(np.linalg.norm(unit, axis=1, keepdims=True), 1e-12))


def nearest(rows: np.ndarray, k: int, among: np.ndarray | None = None, near_only: bool = False,
            exact_up_to: int = EXACT_UP_TO) -> tuple[np.ndarray, np.ndarray]:
    """(cosine distances, indices) of each row's `k` nearest rows of `among` (default: `rows` themselves, each row
    then among its own: first, but for exact copies of it), nearest first, as scikit-learn's `kneighbors` gives
    them."""
    queries = unit_rows(rows)
    base = queries if among is None else unit_rows(among)
    try:
        import faiss
    except ImportError:
        from sklearn.neighbors import NearestNeighbors

        return NearestNeighbors(n_neighbors=k, metric="cosine").fit(base).kneighbors(queries)
    n, dims = base.shape
    if n <= exact_up_to:
        index = faiss.IndexFlatIP(dims)  # inner products of unit vectors: the cosine similarity
    else:
        groups = int(2 * math.sqrt(n))
        index = faiss.IndexIVFFlat(faiss.IndexFlatIP(dims), dims, groups, faiss.METRIC_INNER_PRODUCT)
        sample = np.random.default_rng(0).choice(n, min(n, TRAIN_PER_GROUP * groups), replace=False)
        index.cp.seed = 0  # the same groups on every run
        index.train(base[np.sort(sample)])
        index.nprobe = NEAR_PROBES if near_only else PROBES
    index.add(base)
    similarity, indices = index.search(queries, k)
    short = np.flatnonzero((indices < 0).any(axis=1))  # a query whose groups held fewer than k rows: exactly
    if len(short):
        flat = faiss.IndexFlatIP(dims)
        flat.add(base)
        similarity[short], indices[short] = flat.search(queries[short], k)
    return 1.0 - similarity, indices
