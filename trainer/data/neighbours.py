"""Each row's nearest rows by cosine, for the audit's outliers and copies: faiss-cpu where it is installed (the `data`
extra; 11x faster than scikit-learn at 20,000 images, docs/benchmarks.md), else scikit-learn. Both search exactly."""

from __future__ import annotations

import numpy as np


def nearest(rows: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """(cosine distances, indices) of each row's `k` nearest rows, nearest first, the row itself among them (first,
    but for exact copies of it), as scikit-learn's `kneighbors` gives them."""
    unit = np.asarray(rows, dtype=np.float32)
    unit = np.ascontiguousarray(unit / np.maximum(np.linalg.norm(unit, axis=1, keepdims=True), 1e-12))
    try:
        import faiss
    except ImportError:
        from sklearn.neighbors import NearestNeighbors

        return NearestNeighbors(n_neighbors=k, metric="cosine").fit(unit).kneighbors(unit)
    index = faiss.IndexFlatIP(unit.shape[1])  # inner products of unit vectors: the cosine similarity
    index.add(unit)
    similarity, indices = index.search(unit, k)
    return 1.0 - similarity, indices
