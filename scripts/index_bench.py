"""Index benchmark for big stores on keys drawn from the real key distribution (BENCHMARKS.md section 10).

Real keys: the target's retrieval keys (`Target.retrieval_key`, what build-datastore stores) of
every frame of the successful episodes of --demos (the base the store is drawn from) and of
--heldout (the queries: frames of other episodes, so no query is a perturbed copy of itself);
encoded once and kept in --keys-cache. Or a datastore's keys.npy (--datastore), whose episodes
with id % 10 == 0 are then held out as queries.

Drawing N keys from the base (`--sizes`, far beyond the ~35k real ones): pick a base key a,
one of its 8 nearest base neighbours b, u ~ U(0, 1), and return normalize(a + u (b - a) + e)
with e ~ N(0, s^2 I), s = 0.1 |a - nn1(a)| / sqrt(D): points on the segments between real
neighbours (the manifold the frames lie on), plus noise a tenth of the local spacing.

Wide keys (`--dims 4096`): no OpenVLA-7B weights exist here, so a 4096-d key is the 519-d key
mapped by a seeded random MLP of the projector's shape (Linear D -> 4096, GELU, Linear 4096 ->
4096; weights N(0, 1/fan_in)), then normalized. Its intrinsic dimension is that of the 519-d
keys: it says what 4096 floats per key cost, not how OpenVLA's own features compress.

Per (width, size, index): build seconds (`--build-threads`), serialized index bytes per entry,
recall@8 against exact search, and p50/p90 of one query at a time on one thread. Ground truth:
exact inner product over every key. JSON lines go to --out, a markdown table to stdout.

    nice -n 10 python scripts/index_bench.py --target checkpoints/vla --demos demos/mw_train_clean.hdf5 \
        demos/mw_train_noisy.hdf5 --heldout demos/mw_heldout.hdf5 --keys-cache outputs/mw_keys.npz \
        --dims 519 --sizes 100000 1000000 --out outputs/index_bench.jsonl
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

import faiss
import numpy as np

from heisd.retrieval.index import build_index, index_kind, search, set_nprobe
from heisd.retrieval.index_config import IndexConfig

K = 8
NEIGHBOURS = 8  # a drawn key lies between a base key and one of these neighbours
NOISE = 0.1  # noise scale, as a fraction of the distance to the nearest base neighbour
CHUNK = 50_000


def split_real_keys(datastore: Path) -> tuple[np.ndarray, np.ndarray]:
    """(base keys, held-out keys): episodes with id % 10 == 0 are held out."""
    keys = np.load(datastore / "keys.npy")
    held = np.load(datastore / "episode.npy") % 10 == 0
    return np.ascontiguousarray(keys[~held]), np.ascontiguousarray(keys[held])


def encode_keys(target_dir: Path, demos: list[Path], batch: int = 64) -> np.ndarray:
    """Normalized retrieval keys of every frame of the successful episodes (as build-datastore keeps)."""
    import torch

    from heisd.data.dataset import DemoFile
    from heisd.targets import load_target

    torch.set_num_threads(1)
    target = load_target(target_dir, "cpu", torch.float32)
    spec, parts = target.spec, []
    with torch.no_grad():
        for path in demos:
            with DemoFile(path) as f:
                for ep in f:
                    if not ep.success:
                        continue
                    for lo in range(0, len(ep), batch):
                        images = torch.as_tensor(ep.images[lo : lo + batch])
                        parts.append(target.retrieval_key(images, spec.state_input(ep.state[lo : lo + batch])).numpy())
    keys = np.concatenate(parts).astype(np.float32)
    return keys / np.linalg.norm(keys, axis=1, keepdims=True)


def real_keys(args: argparse.Namespace) -> tuple[np.ndarray, np.ndarray]:
    if args.datastore is not None:
        return split_real_keys(args.datastore)
    if args.keys_cache is not None and args.keys_cache.exists():
        cached = np.load(args.keys_cache)
        return cached["base"], cached["heldout"]
    if args.target is None or not args.demos or not args.heldout:
        raise SystemExit("index_bench: give --datastore, or --target with --demos and --heldout")
    base, held = encode_keys(args.target, args.demos), encode_keys(args.target, args.heldout)
    if args.keys_cache is not None:
        np.savez(args.keys_cache, base=base, heldout=held)
    return base, held


class KeyModel:
    """Draws keys near the base keys' manifold (see the module docstring)."""

    def __init__(self, base: np.ndarray, seed: int) -> None:
        self.base = base
        index = faiss.IndexFlatIP(base.shape[1])
        index.add(base)
        sims, nn = index.search(base, NEIGHBOURS + 1)
        self.nn = nn[:, 1:]  # column 0 is the key itself
        nn1 = np.sqrt(np.maximum(2.0 - 2.0 * sims[:, 1], 0.0))  # unit keys: |a - b|^2 = 2 - 2 cos
        self.sigma = (NOISE * nn1 / np.sqrt(base.shape[1])).astype(np.float32)
        self.seed = seed

    def draw(self, n: int, chunk_id: int) -> np.ndarray:
        rng = np.random.default_rng([self.seed, chunk_id])
        a = rng.integers(0, len(self.base), n)
        b = self.nn[a, rng.integers(0, NEIGHBOURS, n)]
        u = rng.random((n, 1), dtype=np.float32)
        x = self.base[a] + u * (self.base[b] - self.base[a])
        x += self.sigma[a, None] * rng.standard_normal(x.shape, dtype=np.float32)
        return x / np.linalg.norm(x, axis=1, keepdims=True)


class Widen:
    """A seeded random MLP of the projector's shape: D -> 4096 (GELU) -> width, then normalized."""

    def __init__(self, d_in: int, width: int, seed: int) -> None:
        rng = np.random.default_rng(seed)
        self.w1 = (rng.standard_normal((d_in, 4096), dtype=np.float32) / np.sqrt(d_in)).astype(np.float32)
        self.w2 = (rng.standard_normal((4096, width), dtype=np.float32) / np.sqrt(4096)).astype(np.float32)

    def __call__(self, x: np.ndarray) -> np.ndarray:
        h = x @ self.w1
        h = 0.5 * h * (1.0 + np.tanh(0.7978845608 * (h + 0.044715 * h**3)))  # GELU (tanh form)
        y = h @ self.w2
        return y / np.linalg.norm(y, axis=1, keepdims=True)


def store_keys(model: KeyModel, widen: Widen | None, n: int) -> np.ndarray:
    width = model.base.shape[1] if widen is None else widen.w2.shape[1]
    out = np.empty((n, width), dtype=np.float32)
    for c, lo in enumerate(range(0, n, CHUNK)):
        hi = min(n, lo + CHUNK)
        x = model.draw(hi - lo, c)
        out[lo:hi] = x if widen is None else widen(x)
    return out


def timed_queries(index: faiss.Index, queries: np.ndarray, keys: np.ndarray, rerank: int) -> tuple[np.ndarray, np.ndarray]:
    """Top-K rows per query and each query's (wall, CPU) seconds, one query at a time on this
    thread (CPU time: what the query costs, without the waits a shared machine adds); `rerank` > 0
    re-scores K * rerank candidates with the exact keys, as the datastore does for IVF-PQ."""
    found = np.empty((len(queries), K), dtype=np.int64)
    seconds = np.empty((len(queries), 2))
    for i, q in enumerate(queries):
        t, c = time.perf_counter(), time.thread_time()
        _, rows = search(index, q[None], K * max(rerank, 1))
        rows = rows[0]
        if rerank:
            rows = rows[rows >= 0]
            rows = rows[np.argsort(-(keys[rows] @ q), kind="stable")[:K]]
        seconds[i] = time.perf_counter() - t, time.thread_time() - c
        found[i, : len(rows)] = rows[:K]
        found[i, len(rows) :] = -1
    return found, seconds


def recall(found: np.ndarray, truth: np.ndarray) -> float:
    return float(np.mean([len(set(a) & set(b)) / K for a, b in zip(found, truth, strict=True)]))


def run_one(name: str, config: IndexConfig, keys: np.ndarray, queries: np.ndarray, truth: np.ndarray,
            build_threads: int, nprobes: list[int], rerank: int) -> list[dict[str, Any]]:
    """Build once; one row per nprobe for IVF-PQ (bare, and re-ranked), one row otherwise."""
    faiss.omp_set_num_threads(build_threads)
    t, c = time.perf_counter(), time.process_time()
    index = build_index(keys, config)
    build_s, build_cpu_s = time.perf_counter() - t, time.process_time() - c
    nbytes = faiss.serialize_index(index).nbytes
    faiss.omp_set_num_threads(1)  # one control step issues one query
    kind = index_kind(index)
    rows = []
    for nprobe in nprobes if kind == "ivfpq" else [0]:
        set_nprobe(index, nprobe)
        row: dict[str, Any] = {"index": name, "kind": kind, "build_s": round(build_s, 2),
                               "build_cpu_s": round(build_cpu_s, 2), "bytes_per_entry": round(nbytes / len(keys), 1)}
        for label, r in (("", 0), ("_rerank", rerank)) if kind == "ivfpq" else (("", 0),):
            found, seconds = timed_queries(index, queries, keys, r)
            row[f"recall_at_8{label}"] = round(recall(found, truth), 3)
            for clock, col in (("", 0), ("_cpu", 1)):
                for pct in (50, 90):
                    row[f"p{pct}{clock}_ms{label}"] = round(float(np.percentile(seconds[:, col], pct) * 1e3), 3)
        if kind == "ivfpq":
            params = config.ivfpq_params(*keys.shape)
            row["params"] = {"nlist": params.nlist, "m": params.m, "nbits": params.nbits, "nprobe": nprobe,
                             "dim": params.dim, "reduction": params.reduction, "rerank": rerank}
        rows.append(row)
    return rows


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--target", type=Path, help="target checkpoint whose retrieval keys are the real keys")
    p.add_argument("--demos", type=Path, nargs="+", help="demonstrations whose frames' keys the store is drawn from")
    p.add_argument("--heldout", type=Path, nargs="+", help="held-out demonstrations whose frames' keys are the queries")
    p.add_argument("--keys-cache", type=Path, help="npz of the encoded keys: written once, read on later runs")
    p.add_argument("--datastore", type=Path,
                   help="instead of --target/--demos: a datastore's keys.npy (episodes with id %% 10 == 0 held out)")
    p.add_argument("--dims", type=int, nargs="+", default=[519],
                   help="key widths: the real keys' own width, or wider through the random projector-shaped MLP")
    p.add_argument("--sizes", type=int, nargs="+", default=[100_000], help="entries in the drawn store")
    p.add_argument("--indexes", nargs="+", default=["flat", "hnsw", "ivfpq"],
                   choices=["flat", "hnsw", "ivfpq", "ivfpq-opq"], help="indexes to build at every size")
    p.add_argument("--hnsw-max", type=int, default=200_000,
                   help="skip HNSW above this many entries (its build is the slow one)")
    p.add_argument("--pq-m", type=int, default=IndexConfig.pq_m, help="IVF-PQ sub-quantizers (0: one per 8 coded dims, at most 64)")
    p.add_argument("--reduce-dim", type=int, default=IndexConfig.reduce_dim, help="IVF-PQ reduced width")
    p.add_argument("--nprobe", type=int, nargs="+", default=[IndexConfig.nprobe],
                   help="IVF-PQ cells scanned per query (one row each, same index)")
    p.add_argument("--rerank", type=int, default=IndexConfig.rerank,
                   help="IVF-PQ rows also timed re-scoring K * rerank candidates with the exact keys")
    p.add_argument("--queries", type=int, default=300, help="held-out real keys used as queries")
    p.add_argument("--build-threads", type=int, default=1, help="FAISS threads while building (queries: 1)")
    p.add_argument("--seed", type=int, default=0, help="seed of the drawn keys, the query sample and the MLP")
    p.add_argument("--out", type=Path, required=True, help="JSON lines, one per row of the table (appended)")
    args = p.parse_args(argv)

    base, held = real_keys(args)
    model = KeyModel(base, args.seed)
    rng = np.random.default_rng(args.seed)
    queries_real = held[rng.choice(len(held), min(args.queries, len(held)), replace=False)]
    print(f"real keys: {len(base)} base, {len(held)} held out; {len(queries_real)} queries", flush=True)
    print("| width | entries | index | build s (CPU s) | bytes/entry | recall@8 | p50 / p90 ms | p50 / p90 CPU ms |"
          " recall@8 re-ranked | p50 / p90 CPU ms re-ranked |")
    print("|---|---|---|---|---|---|---|---|---|---|", flush=True)
    for width in args.dims:
        widen = None if width == base.shape[1] else Widen(base.shape[1], width, args.seed)
        queries = np.ascontiguousarray(queries_real if widen is None else widen(queries_real))
        for n in args.sizes:
            t = time.perf_counter()
            keys = store_keys(model, widen, n)
            exact = faiss.IndexFlatIP(width)
            exact.add(keys)
            faiss.omp_set_num_threads(args.build_threads)
            _, truth = exact.search(queries, K)
            del exact
            print(f"<!-- drew {n} x {width} keys and exact top-8 in {time.perf_counter() - t:.0f} s -->", flush=True)
            for name in args.indexes:
                if name == "hnsw" and n > args.hnsw_max:
                    continue
                config = IndexConfig(kind="ivfpq" if name.startswith("ivfpq") else name,  # type: ignore[arg-type]
                                     reduction="opq" if name == "ivfpq-opq" else "pca", pq_m=args.pq_m,
                                     reduce_dim=args.reduce_dim, nprobe=args.nprobe[0], rerank=args.rerank)
                for row in run_one(name, config, keys, queries, truth, args.build_threads, args.nprobe, args.rerank):
                    row = {"width": width, "entries": n, "queries": len(queries), "seed": args.seed, **row}
                    with open(args.out, "a") as f:
                        f.write(json.dumps(row) + "\n")
                    rr = (f"{row['recall_at_8_rerank']:.3f} | "
                          f"{row['p50_cpu_ms_rerank']:.3f} / {row['p90_cpu_ms_rerank']:.3f}"
                          if "recall_at_8_rerank" in row else "- | -")
                    label = f"{name} nprobe {row['params']['nprobe']}" if "params" in row else name
                    print(f"| {width} | {n} | {label} | {row['build_s']:.1f} ({row['build_cpu_s']:.1f}) | "
                          f"{row['bytes_per_entry']:.0f} | {row['recall_at_8']:.3f} | "
                          f"{row['p50_ms']:.3f} / {row['p90_ms']:.3f} | {row['p50_cpu_ms']:.3f} / "
                          f"{row['p90_cpu_ms']:.3f} | {rr} |", flush=True)
            del keys
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
