"""The nearest-neighbour search behind copies and outliers (issue #35: "faiss-cpu or scikit-learn, chosen by
measurement"): each image's k nearest by cosine among N embeddings of D numbers, exact in both.

    python bench/neighbours.py --n 2000 20000 --dim 512 --k 11 --repeats 3
    python bench/neighbours.py --approximate --n 50000 100000 --repeats 1

`--approximate`: faiss's exact search against the audit's own search beyond its exact limit
(trainer.data.neighbours.nearest: an inverted file), and the share of the exact neighbours the latter finds.

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


def approximate(ns: list[int], dim: int, k: int, repeats: int) -> None:
    import sys

    from common import REPO

    sys.path.insert(0, str(REPO))
    from trainer.data.neighbours import nearest

    print("| images | exact (s) | inverted file (s) | exact neighbours found | mean distance to the 10 nearest: exact / found |")
    print("|---|---|---|---|---|")
    for n in ns:
        x = embeddings(n, dim)
        times: dict[str, list[float]] = {"exact": [], "ivf": []}
        found = {}
        for _ in range(repeats):
            for name, limit in (("exact", n), ("ivf", 0)):
                start = time.perf_counter()
                found[name] = nearest(x, k, exact_up_to=limit)
                times[name].append(time.perf_counter() - start)
        same = np.mean([len(set(a[1:]) & set(b[1:])) / (k - 1) for a, b in zip(found["exact"][1], found["ivf"][1])])
        far = [float(found[name][0][:, 1:].mean()) for name in ("exact", "ivf")]
        print(f"| {n} | {statistics.median(times['exact']):.1f} | {statistics.median(times['ivf']):.1f} | {same:.1%} | "
              f"{far[0]:.4f} / {far[1]:.4f} |", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--n", type=int, nargs="+", default=[2000, 20000])
    parser.add_argument("--dim", type=int, default=512)
    parser.add_argument("--k", type=int, default=11)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--approximate", action="store_true")
    args = parser.parse_args()
    if args.approximate:
        approximate(args.n, args.dim, args.k, args.repeats)
        return
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
