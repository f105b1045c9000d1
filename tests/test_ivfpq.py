"""IVF-PQ indexes for big stores: choice by size, manifest round trip, recall, parameter errors."""

from __future__ import annotations

import json
from pathlib import Path

import faiss
import numpy as np
import pytest

from heisd.commands.runner import main as heisd_main
from heisd.errors import UsageError
from heisd.retrieval import GLOBAL_COLLECTION, Datastore, DatastoreWriter, IndexConfig
from heisd.retrieval.index import build_index, clustered_keys, index_kind
from heisd.retrieval.ivfpq import ivf_of

KEY_DIM, HIDDEN_DIM, N_TOKENS, N_SEQ = 32, 6, 4, 2
TASKS = ("reach", "push", "drawer-open")
PER_TASK = 300
# Small enough for a 300-key collection: 6-bit codes (64 centroids), 8 of them over a 16-d PCA.
SMALL_PQ = dict(pq_m=8, pq_nbits=6, reduce_dim=16, nprobe=4)

faiss.omp_set_num_threads(1)


def _store(path: Path, config: IndexConfig, seed: int = 0) -> Path:
    rng = np.random.default_rng(seed)
    writer = DatastoreWriter(key_dim=KEY_DIM, hidden_dim=HIDDEN_DIM, n_tokens=N_TOKENS, n_sequences=N_SEQ,
                             target_fingerprint="tiny@sha256:00", index_config=config, tasks=TASKS)
    for t, task in enumerate(TASKS):
        keys = clustered_keys(PER_TASK, KEY_DIM, rng.standard_normal((4, KEY_DIM), dtype=np.float32), rng)
        writer.add(keys=keys, tokens=rng.integers(0, 256, (PER_TASK, N_SEQ, N_TOKENS)),
                   own_tokens=rng.integers(0, 256, (PER_TASK, N_TOKENS)),
                   hidden=rng.standard_normal((PER_TASK, HIDDEN_DIM)), ee_pos=rng.standard_normal((PER_TASK, 3)),
                   episode=t, step=np.arange(PER_TASK), task=task)
    return writer.finalize(path, extras={"theta": 0.5})


def test_size_based_choice_picks_ivfpq_above_its_threshold(tmp_path: Path) -> None:
    config = IndexConfig(flat_max_floats=100 * KEY_DIM, hnsw_max_floats=PER_TASK * KEY_DIM, **SMALL_PQ)
    assert [config.resolve(n, KEY_DIM) for n in (100, 101, PER_TASK, PER_TASK + 1)] == ["flat", "hnsw", "hnsw",
                                                                                        "ivfpq"]
    ds = Datastore.load(_store(tmp_path / "ds", config))
    collections = ds.manifest["collections"]
    assert collections[GLOBAL_COLLECTION]["kind"] == "ivfpq"  # 900 entries
    assert {collections[t]["kind"] for t in TASKS} == {"hnsw"}  # 300 entries each
    assert index_kind(ds._indexes[GLOBAL_COLLECTION]) == "ivfpq"
    assert "params" not in collections["reach"]


def test_ivfpq_round_trip_records_and_restores_parameters(tmp_path: Path) -> None:
    config = IndexConfig(kind="ivfpq", rerank=3, **SMALL_PQ)
    path = _store(tmp_path / "ds", config)
    manifest = json.loads((path / "manifest.json").read_text())
    params = manifest["collections"][GLOBAL_COLLECTION]["params"]
    # nlist by size: sqrt(900) = 30, capped at 900 // 39 = 23 cells (39 keys per cell)
    assert params == {"nlist": 23, "m": 8, "nbits": 6, "nprobe": 4, "reduction": "pca", "dim": 16, "rerank": 3}
    assert manifest["collections"]["push"]["params"]["nlist"] == 300 // 39
    assert manifest["index_config"]["kind"] == "ivfpq"
    # codes, ids, cells, code books and the 32 x 16 PCA map; not PCA's 32 x 32 training basis
    stored = faiss.read_index(str(path / "index_global.faiss"))  # kept alive: it owns the transform
    pca = faiss.downcast_VectorTransform(stored.chain.at(0))
    assert pca.A.size() == 16 * 32 and pca.PCAMat.size() == 0

    faiss_index = faiss.read_index(str(path / "index_global.faiss"))
    faiss.extract_index_ivf(faiss_index).nprobe = 1  # a stale value in the file: the manifest wins
    (path / "index_global.faiss").write_bytes(faiss.serialize_index(faiss_index).tobytes())
    manifest["files"]["index_global.faiss"]["bytes"] = (path / "index_global.faiss").stat().st_size
    (path / "manifest.json").write_text(json.dumps(manifest))
    ds = Datastore.load(path, verify_checksums=False)
    assert ivf_of(ds._indexes[GLOBAL_COLLECTION]).nprobe == 4
    assert ds.extras == {"theta": 0.5}

    # Every stored key finds itself first, with its exact cosine (1), in its own collection.
    rows = np.arange(0, 3 * PER_TASK, 37)
    for row in rows:
        task = TASKS[ds.task_id[row]]
        for name in (task, None):
            result = ds.query(ds.keys[row], name, k=5)
            assert result.indices[0] == row and len(result) == 5
            np.testing.assert_allclose(result.similarities, ds.keys[result.indices] @ ds.keys[row], rtol=1e-6)
            assert np.all(np.diff(result.similarities) <= 0)


def test_manifest_without_index_parameters_still_loads(tmp_path: Path) -> None:
    """Datastores written before IVF-PQ: no index_config fields for it, no per-collection params."""
    path = _store(tmp_path / "ds", IndexConfig(kind="hnsw"))
    manifest = json.loads((path / "manifest.json").read_text())
    manifest["index_config"] = {k: manifest["index_config"][k]
                                for k in ("kind", "flat_max_floats", "hnsw_m", "ef_construction", "ef_search")}
    (path / "manifest.json").write_text(json.dumps(manifest))
    ds = Datastore.load(path)
    result = ds.query(ds.keys[7], "reach", k=3)
    assert result.indices[0] == 7


def test_ivfpq_recall_on_clustered_keys() -> None:
    rng = np.random.default_rng(1)
    centers = rng.standard_normal((30, KEY_DIM), dtype=np.float32)
    keys = clustered_keys(4000, KEY_DIM, centers, rng, spread=0.2)
    queries = clustered_keys(100, KEY_DIM, centers, rng, spread=0.2)
    exact = faiss.IndexFlatIP(KEY_DIM)
    exact.add(keys)
    _, truth = exact.search(queries, 8)

    def recall(found: np.ndarray) -> float:
        return float(np.mean([len(set(a) & set(b)) / 8 for a, b in zip(found, truth, strict=True)]))

    index = build_index(keys, IndexConfig(kind="ivfpq", pq_m=16, nprobe=16))
    assert index_kind(index) == "ivfpq" and faiss.serialize_index(index).nbytes < 40 * len(keys)
    _, found = index.search(queries, 8)
    bare = recall(found)
    _, candidates = index.search(queries, 32)  # what the datastore re-scores with rerank 4
    sims = np.einsum("qd,qcd->qc", queries, keys[candidates])
    reranked = recall(np.take_along_axis(candidates, np.argsort(-sims, axis=1)[:, :8], axis=1))
    assert 0.5 <= bare < 1.0 and reranked >= 0.95 and reranked > bare


def test_opq_rotation_round_trip() -> None:
    keys = clustered_keys(600, KEY_DIM, np.random.default_rng(2).standard_normal((6, KEY_DIM), dtype=np.float32),
                          np.random.default_rng(3))
    index = build_index(keys, IndexConfig(kind="ivfpq", reduction="opq", pq_m=4, pq_nbits=6, reduce_dim=16))
    assert isinstance(faiss.downcast_VectorTransform(index.chain.at(0)), faiss.OPQMatrix)
    assert ivf_of(index).code_size == 3  # 4 codes x 6 bits
    loaded = faiss.deserialize_index(faiss.serialize_index(index))
    _, rows = index.search(keys[:50], 8)
    _, rows_loaded = loaded.search(keys[:50], 8)
    np.testing.assert_array_equal(rows, rows_loaded)
    assert np.mean([i in r for i, r in enumerate(rows)]) >= 0.9  # a stored key is among its own top 8


@pytest.mark.parametrize(("config", "n", "message"), [
    (IndexConfig(kind="ivfpq", pq_m=64, reduce_dim=16), 400, "cannot code 0 dims"),
    (IndexConfig(kind="ivfpq", pq_m=7, reduction="none"), 400, "pq_m=7 does not divide the 32-d"),
    (IndexConfig(kind="ivfpq", pq_m=8), 200, "needs at least 256 keys"),
    (IndexConfig(kind="ivfpq", pq_m=8, pq_nbits=4, ivf_nlist=500), 400, "ivf_nlist=500 cells need at least 500"),
])
def test_impossible_parameters_are_refused_clearly(config: IndexConfig, n: int, message: str) -> None:
    keys = clustered_keys(n, KEY_DIM, np.ones((1, KEY_DIM), dtype=np.float32), np.random.default_rng(0))
    with pytest.raises(UsageError, match=message):
        build_index(keys, config)


def test_coded_width_is_a_multiple_of_pq_m() -> None:
    config = IndexConfig()
    assert (config.ivfpq_params(10**6, 519).dim, config.ivfpq_params(10**6, 519).reduction) == (512, "pca")
    assert config.ivfpq_params(10**6, 4096).dim == 512 and config.ivfpq_params(10**6, 384).reduction == "none"
    assert IndexConfig(pq_m=5, reduce_dim=16).ivfpq_params(400, 32).dim == 15
    assert config.ivfpq_params(10**6, 519).nlist == 1000 and config.ivfpq_params(900, 519).nlist == 23
    # pq_m 0: one sub-quantizer per 8 coded dims, at most 64 (519 -> 64 codes of 8 dims; 64 -> 8)
    assert config.ivfpq_params(10**6, 519).m == 64 and config.ivfpq_params(10**6, 64).m == 8


def test_config_rejects_bad_values() -> None:
    with pytest.raises(UsageError, match="reduction"):
        IndexConfig(reduction="svd")  # type: ignore[arg-type]
    with pytest.raises(UsageError, match="nprobe"):
        IndexConfig(nprobe=0)


def test_reindex_command(tmp_path: Path, capsys) -> None:
    src = _store(tmp_path / "exact", IndexConfig(kind="flat"))
    out = tmp_path / "ivfpq"
    flags = ["--pq-m", "8", "--pq-nbits", "6", "--reduce-dim", "16", "--threads", "1"]
    assert heisd_main(["reindex", "--datastore", str(src), "--out", str(out), "--index", "ivfpq", *flags]) == 0
    exact, compressed = Datastore.load(src), Datastore.load(out)
    np.testing.assert_allclose(exact.keys, compressed.keys, atol=1e-7)  # normalized again: last bit may move
    for field in ("tokens", "own_tokens", "hidden", "ee_pos", "episode", "step", "task_id"):
        np.testing.assert_array_equal(getattr(exact, field), getattr(compressed, field))
    assert compressed.extras["theta"] == 0.5 and "reindexed_from" in compressed.extras
    assert {c["kind"] for c in compressed.manifest["collections"].values()} == {"ivfpq"}
    # Impossible parameters: one line, exit 2, nothing written.
    bad = ["reindex", "--datastore", str(src), "--out", str(tmp_path / "bad"), "--index", "ivfpq",
           "--reduction", "none", "--pq-m", "7"]
    assert heisd_main(bad) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "pq_m=7 does not divide" in err and not (tmp_path / "bad").exists()
