"""The nearest-neighbour search behind copies and outliers (issue #35: "faiss-cpu or scikit-learn, chosen by
measurement"): each image's k nearest by cosine among N embeddings of D numbers, exact in both.

    python bench/neighbours.py --n 2000 20000 --dim 512 --k 11 --repeats 3

Needs scikit-learn, and faiss-cpu for its row (not a TrainDeck dependency: run it in an environment that has it).
The embeddings: N points around 20 cluster centres (what a classifier's embeddings of 20 classes look like).
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np


def embeddings(n: int, dim: int, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    centres = rng.normal(size=(20, dim)).astype(np.float32)
    x = centres[rng.integers(0, 20, n)] + 0.5 * rng.normal(size=(n, dim)).astype(np.float32)
    return x / np.linalg.norm(x, axis=1, keepdims=True)


def sklearn_knn(x: np.ndarray, k: int) -> np.ndarray:
    from sklearn.neighbors import NearestNeighbors

    return NearestNeighbors(n_neighbors=k, metric="cosine").fit(x).kneighbors(x)[1]


def faiss_knn(x: np.ndarray, k: int) -> np.ndarray:
    import faiss

    index = faiss.IndexFlatIP(x.shape[1])  # exact; inner product of unit vectors is the cosine
    index.add(x)
    return index.search(x, k)[1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--n", type=int, nargs="+", default=[2000, 20000])
    parser.add_argument("--dim", type=int, default=512)
    parser.add_argument("--k", type=int, default=11)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    print("| images | scikit-learn (s) | faiss-cpu (s) | same neighbours |")
    print("|---|---|---|---|")
    for n in args.n:
        x = embeddings(n, args.dim)
        times: dict[str, list[float]] = {"sklearn": [], "faiss": []}
        found = {}
        for _ in range(args.repeats):  # side by side, alternating
            for name, fn in (("sklearn", sklearn_knn), ("faiss", faiss_knn)):
                start = time.perf_counter()
                found[name] = fn(x, args.k)
                times[name].append(time.perf_counter() - start)
        same = np.mean([len(set(a) & set(b)) / args.k for a, b in zip(found["sklearn"], found["faiss"])])
        print(f"| {n} | {statistics.median(times['sklearn']):.2f} | {statistics.median(times['faiss']):.2f} | "
              f"{same:.1%} |")


if __name__ == "__main__":
    main()
