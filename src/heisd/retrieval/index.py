"""FAISS vector index for datastore collections, chosen by size: exact (flat) when small, HNSW
when large, IVF-PQ (`heisd.retrieval.ivfpq`) when HNSW's full vectors would not fit in memory.

Keys are L2-normalized, so inner product is cosine similarity; `search` reports cosine for every kind.
"""

from __future__ import annotations

import time
from typing import Any

import faiss
import numpy as np

from heisd.retrieval.index_config import INDEX_KINDS, IndexConfig, Kind
from heisd.retrieval.ivfpq import build_ivfpq, ivf_of


def build_index(keys: np.ndarray, config: IndexConfig) -> faiss.Index:
    """Index over the rows of `keys` (float32 [N, D], normalized); faiss ids are row numbers."""
    keys = np.ascontiguousarray(keys, dtype=np.float32)
    n, d = keys.shape
    kind = config.resolve(n, d)
    if kind == "ivfpq":
        return build_ivfpq(keys, config.ivfpq_params(n, d))
    if kind == "flat":
        index: faiss.Index = faiss.IndexFlatIP(d)
    else:
        index = faiss.IndexHNSWFlat(d, config.hnsw_m, faiss.METRIC_INNER_PRODUCT)
        index.hnsw.efConstruction = config.ef_construction
        index.hnsw.efSearch = config.ef_search
    index.add(keys)
    return index


def index_kind(index: faiss.Index) -> Kind:
    if isinstance(index, faiss.IndexHNSW):
        return "hnsw"
    return "ivfpq" if ivf_of(index) is not None else "flat"


def search(index: faiss.Index, queries: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """(similarities, rows) of the top k per query; an L2 index on unit keys reports 1 - d^2 / 2,
    the cosine (approximate where the index's distances are)."""
    found, rows = index.search(queries, k)
    if index.metric_type == faiss.METRIC_L2:
        found = 1.0 - found / 2.0
    return found, rows


def set_ef_search(index: faiss.Index, ef_search: int) -> None:
    """Set efSearch on an HNSW index; flat indexes are exact and ignore it."""
    if isinstance(index, faiss.IndexHNSW):
        index.hnsw.efSearch = int(ef_search)


def set_nprobe(index: faiss.Index, nprobe: int) -> None:
    """Set the cells an IVF index scans per query; other kinds ignore it."""
    if (ivf := ivf_of(index)) is not None:
        ivf.nprobe = min(int(nprobe), ivf.nlist)


def clustered_keys(
    n: int, dim: int, centers: np.ndarray, rng: np.random.Generator, spread: float = 0.3, chunk: int = 65536
) -> np.ndarray:
    """Normalized points scattered around `centers`: demonstration frames of a task look
    alike, so real keys cluster; uniform random keys would make HNSW look worse than it is."""
    out = np.empty((n, dim), dtype=np.float32)
    for lo in range(0, n, chunk):
        hi = min(n, lo + chunk)
        x = centers[rng.integers(0, len(centers), hi - lo)]
        x = x + spread * rng.standard_normal((hi - lo, dim), dtype=np.float32)
        out[lo:hi] = x / np.linalg.norm(x, axis=1, keepdims=True)
    return out


def benchmark_index(
    n_entries: int, key_dim: int, k: int = 8, n_queries: int = 200, config: IndexConfig | None = None, seed: int = 0
) -> dict[str, Any]:
    """Build an index over clustered synthetic keys and time single queries on one thread.

    Returns kind, build_s (with faiss' default thread count), bytes_per_entry (serialized
    index size / entries), query_p50_ms / query_p90_ms (one query at a time, 1 thread) and
    recall_at_k against exact search (1.0 for flat, which is exact).
    """
    config = config or IndexConfig()
    rng = np.random.default_rng(seed)
    centers = rng.standard_normal((max(16, n_entries // 1000), key_dim), dtype=np.float32)
    keys = clustered_keys(n_entries, key_dim, centers, rng)
    queries = clustered_keys(n_queries, key_dim, centers, rng)

    t0 = time.perf_counter()
    index = build_index(keys, config)
    build_s = time.perf_counter() - t0
    bytes_per_entry = faiss.serialize_index(index).nbytes / n_entries

    threads = faiss.omp_get_max_threads()
    faiss.omp_set_num_threads(1)  # one control step issues one query
    try:
        found = np.empty((n_queries, k), dtype=np.int64)
        times = np.empty(n_queries)
        for i in range(n_queries):
            t = time.perf_counter()
            _, found[i] = index.search(queries[i : i + 1], k)
            times[i] = time.perf_counter() - t
    finally:
        faiss.omp_set_num_threads(threads)

    recall = 1.0
    if index_kind(index) != "flat":
        exact = faiss.IndexFlatIP(key_dim)
        exact.add(keys)
        _, truth = exact.search(queries, k)
        recall = float(np.mean([len(set(a) & set(b)) / k for a, b in zip(found, truth, strict=True)]))
    return {
        "n_entries": n_entries,
        "key_dim": key_dim,
        "k": k,
        "n_queries": n_queries,
        "kind": index_kind(index),
        "ef_search": config.ef_search,
        "nprobe": config.nprobe,
        "build_s": build_s,
        "bytes_per_entry": bytes_per_entry,
        "query_p50_ms": float(np.percentile(times, 50) * 1e3),
        "query_p90_ms": float(np.percentile(times, 90) * 1e3),
        "recall_at_k": recall,
    }


def main(argv: list[str] | None = None) -> int:
    """`python -m heisd.retrieval.index`: the index micro-benchmark as a markdown table."""
    import argparse

    p = argparse.ArgumentParser(description=main.__doc__, formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--entries", type=int, nargs="+", default=[10_000, 100_000], help="index sizes")
    p.add_argument("--key-dim", type=int, default=512, help="key dimension (the shipped target's pooled feature)")
    p.add_argument("--kind", default="auto", choices=INDEX_KINDS, help="index kind")
    p.add_argument("--ef-search", type=int, default=64, help="HNSW efSearch")
    p.add_argument("--nprobe", type=int, default=IndexConfig.nprobe, help="IVF-PQ cells scanned per query")
    p.add_argument("--queries", type=int, default=500, help="single queries timed per size")
    args = p.parse_args(argv)
    print("| entries | key dim | index | build s | bytes/entry | query p50 ms | query p90 ms | recall@8 |")
    print("|---|---|---|---|---|---|---|---|")
    for n in args.entries:
        r = benchmark_index(
            n,
            args.key_dim,
            n_queries=args.queries,
            config=IndexConfig(kind=args.kind, ef_search=args.ef_search, nprobe=args.nprobe),
        )
        print(
            f"| {n} | {args.key_dim} | {r['kind']} | {r['build_s']:.2f} | {r['bytes_per_entry']:.0f} | "
            f"{r['query_p50_ms']:.3f} | {r['query_p90_ms']:.3f} | {r['recall_at_k']:.3f} |",
            flush=True,
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
