"""Typed configuration of the datastore's vector index, importable without faiss: the command
line reads these defaults before anything heavy is loaded."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import numpy as np

from heisd.errors import UsageError

Reduction = Literal["none", "pca", "opq"]
REDUCTIONS = ("none", "pca", "opq")
# faiss' k-means asks for >= 39 points per centroid; training on 64 per cell (faiss samples 256)
# keeps a 1M-entry build to about a minute of one core, with little loss in the cells' quality.
MIN_POINTS_PER_CELL = 39
TRAIN_POINTS_PER_CELL = 64


@dataclass(frozen=True)
class IVFPQParams:
    """The parameters one collection's IVF-PQ index was built with (recorded in the manifest)."""

    nlist: int  # coarse cells
    m: int  # sub-quantizers: code bytes per entry at 8 bits
    nbits: int  # bits per sub-quantizer code
    nprobe: int  # cells scanned per query
    reduction: Reduction  # learned linear map applied before the coarse quantizer
    dim: int  # width the codes cover: the reduced width, or key_dim without a reduction
    rerank: int  # the datastore re-scores k * rerank candidates with the exact keys

    def check(self, n_entries: int, key_dim: int) -> None:
        """Clear errors for parameters faiss would refuse or silently degrade."""
        where = f"IVF-PQ over {n_entries} keys of {key_dim} dims"
        if self.reduction not in REDUCTIONS:
            raise UsageError(f"{where}: reduction must be one of {REDUCTIONS}, got {self.reduction!r}")
        if not 1 <= self.dim <= key_dim:
            raise UsageError(f"{where}: cannot code {self.dim} dims (pq_m={self.m} sub-vectors of at least 1 dim)")
        if self.dim % self.m:
            raise UsageError(
                f"{where}: pq_m={self.m} does not divide the {self.dim}-d width the codes cover "
                f"(choose pq_m among the divisors of {self.dim}, or a reduce_dim that pq_m divides)"
            )
        if not 1 <= self.nbits <= 16:
            raise UsageError(f"{where}: pq_nbits must be in 1..16, got {self.nbits}")
        centroids = 1 << self.nbits
        if n_entries < centroids:
            raise UsageError(
                f"{where}: pq_nbits={self.nbits} trains {centroids} centroids per sub-quantizer, "
                f"which needs at least {centroids} keys (use a flat or HNSW index for this collection, "
                "or fewer pq_nbits)"
            )
        if n_entries < self.nlist:
            raise UsageError(f"{where}: ivf_nlist={self.nlist} cells need at least {self.nlist} keys")
        if self.nprobe < 1 or self.rerank < 1:
            raise UsageError(f"{where}: nprobe and rerank must be >= 1, got {self.nprobe}, {self.rerank}")


def auto_nlist(n_entries: int) -> int:
    """About sqrt(N) cells (a query scans nprobe / sqrt(N) of the store), capped so k-means sees
    enough points per cell. faiss suggests 4-16 sqrt(N), whose training costs 4-16x more here."""
    return int(max(1, min(round(np.sqrt(n_entries)), n_entries // MIN_POINTS_PER_CELL)))


IndexKind = Literal["auto", "flat", "hnsw", "ivfpq"]
INDEX_KINDS = ("auto", "flat", "hnsw", "ivfpq")
Kind = Literal["flat", "hnsw", "ivfpq"]


@dataclass(frozen=True)
class IndexConfig:
    # "auto": flat while n_entries * key_dim <= flat_max_floats, HNSW up to hnsw_max_floats, IVF-PQ above.
    kind: IndexKind = "auto"
    # Measured (1 thread, top-8, clustered keys): flat costs ~0.2 ms at 5k x 256-d and
    # ~0.3 ms at 2k x 1024-d, growing linearly; HNSW stays ~0.05-0.1 ms there. 2^20 floats
    # (4k entries at 256-d) keeps exact search under ~0.2 ms, a few % of one decode step.
    flat_max_floats: int = 1 << 20
    # HNSW keeps every key in full plus its graph (~2.3 KB per 519-d entry); past 2^28 floats
    # (1 GiB of keys: ~517k entries at 519-d, 65k at 4096-d) IVF-PQ's ~80-95 bytes per entry win
    # (BENCHMARKS.md section 10).
    hnsw_max_floats: int = 1 << 28
    hnsw_m: int = 32  # graph degree (links per node on the base layer: 2 * M)
    ef_construction: int = 40  # faiss default; build cost grows linearly with it
    ef_search: int = 64  # query-time beam width; raise it for recall at ~1M entries
    ivf_nlist: int = 0  # IVF-PQ coarse cells; 0: about sqrt(N), at least 39 keys per cell
    # IVF-PQ sub-quantizers (code bytes per entry at 8 bits); 0: one per 8 coded dims, at most 64.
    # Sub-vectors of 8 dims: faiss' k-means on 4-d ones trains ~9x slower (104 s vs 12 s, 20k keys, 1 thread).
    pq_m: int = 0
    pq_nbits: int = 8  # bits per sub-quantizer code
    nprobe: int = 32  # IVF-PQ cells scanned per query
    reduction: Reduction = "pca"  # learned map to the coded width: pca, opq or none
    # IVF-PQ codes cover the largest multiple of pq_m up to min(key_dim, reduce_dim) (519 -> 512, 4096 -> 512)
    reduce_dim: int = 512
    # IVF-PQ: the datastore re-scores k * rerank candidates with the exact keys; 16 lifts recall@8
    # at 1M x 519-d from 0.71 (rerank 4) to 0.95 for +0.2 ms (BENCHMARKS.md section 10)
    rerank: int = 16

    def __post_init__(self) -> None:
        if self.kind not in INDEX_KINDS:
            raise UsageError(f"IndexConfig.kind must be one of {INDEX_KINDS}, got {self.kind!r}")
        if self.reduction not in REDUCTIONS:
            raise UsageError(f"IndexConfig.reduction must be one of {REDUCTIONS}, got {self.reduction!r}")
        positive = ("flat_max_floats", "hnsw_max_floats", "hnsw_m", "ef_construction", "ef_search")
        for name in (*positive, "pq_nbits", "nprobe", "reduce_dim", "rerank"):
            if getattr(self, name) < 1:
                raise UsageError(f"IndexConfig.{name} must be >= 1, got {getattr(self, name)}")
        for name in ("ivf_nlist", "pq_m"):
            if getattr(self, name) < 0:
                raise UsageError(f"IndexConfig.{name} must be >= 0 (0: by size), got {getattr(self, name)}")

    def resolve(self, n_entries: int, key_dim: int) -> Kind:
        if self.kind != "auto":
            return self.kind
        floats = n_entries * key_dim
        if floats <= self.flat_max_floats:
            return "flat"
        return "hnsw" if floats <= self.hnsw_max_floats else "ivfpq"

    def ivfpq_params(self, n_entries: int, key_dim: int) -> IVFPQParams:
        """This config's IVF-PQ parameters for one collection (nlist by size when 0)."""
        width = key_dim if self.reduction == "none" else min(key_dim, self.reduce_dim)
        m = self.pq_m or max(1, min(64, width // 8))
        dim = key_dim if self.reduction == "none" else width // m * m
        return IVFPQParams(
            nlist=self.ivf_nlist or auto_nlist(n_entries),
            m=m,
            nbits=self.pq_nbits,
            nprobe=self.nprobe,
            reduction=self.reduction if dim < key_dim or self.reduction == "opq" else "none",
            dim=dim,
            rerank=self.rerank,
        )
