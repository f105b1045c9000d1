"""IVF with product quantization, for collections too big for HNSW's full vectors in memory.

Wide keys are first reduced by a learned linear map (PCA, or OPQ's rotation fitted to the
quantizer); each key is assigned to one of `nlist` coarse cells and stored as `m` codes of
`nbits` bits of its residual, so an entry costs m * nbits / 8 bytes plus its 8-byte id. A query
scans the `nprobe` cells nearest to it.

Metric: squared L2 on the L2-normalized keys, which ranks entries exactly as cosine does
(|x - q|^2 = 2 - 2 cos) and, unlike inner product, is unchanged by PCA's centring.
`heisd.retrieval.index.search` turns the distances back into cosine similarities.
"""

from __future__ import annotations

import faiss
import numpy as np

from heisd.retrieval.index_config import TRAIN_POINTS_PER_CELL, IVFPQParams


def build_ivfpq(keys: np.ndarray, params: IVFPQParams, seed: int = 0) -> faiss.Index:
    """Train on a seeded sample of `keys` (float32 [N, D], normalized) and add all of them."""
    n, d = keys.shape
    params.check(n, d)
    quantizer = faiss.IndexFlatL2(params.dim)
    ivf = faiss.IndexIVFPQ(quantizer, params.dim, params.nlist, params.m, params.nbits)
    ivf.nprobe = min(params.nprobe, params.nlist)
    ivf.cp.seed = ivf.pq.cp.seed = seed
    ivf.cp.max_points_per_centroid = TRAIN_POINTS_PER_CELL
    # Under 39 points per code centroid faiss warns on every k-means run (per sub-quantizer, per
    # OPQ iteration); `check` already refused fewer points than centroids.
    ivf.pq.cp.min_points_per_centroid = 1
    index: faiss.Index = ivf
    pca = None
    if params.reduction != "none":
        transform: faiss.LinearTransform
        if params.reduction == "pca":
            transform = pca = faiss.PCAMatrix(d, params.dim)
        else:
            opq = faiss.OPQMatrix(d, params.m, params.dim)
            opq.pq = ivf.pq  # train the rotation with the quantizer's own settings
            transform = opq
        index = faiss.IndexPreTransform(transform, ivf)
    # Enough for the cells and for every code's centroids; also bounds the copy the transform makes.
    n_train = min(n, max(TRAIN_POINTS_PER_CELL * params.nlist, 64 << params.nbits))
    sample = np.sort(np.random.default_rng(seed).choice(n, n_train, replace=False)) if n_train < n else slice(None)
    index.train(np.ascontiguousarray(keys[sample]))
    if pca is not None:  # its full D x D eigenbasis is training state: 64 MB at 4096-d, never used to search
        pca.PCAMat.clear()
    index.add(keys)
    return index


def ivf_of(index: faiss.Index) -> faiss.IndexIVF | None:
    """The IVF part of an index (inside a pre-transform), or None for flat and HNSW."""
    return faiss.try_extract_index_ivf(index)
