"""Datastore: round trip, queries, collections, validation errors, atomic writes."""

from __future__ import annotations

import json
from pathlib import Path

import faiss
import numpy as np
import pytest

from heisd.errors import OutputError
from heisd.retrieval import GLOBAL_COLLECTION, Datastore, DatastoreError, DatastoreWriter, IndexConfig, benchmark_index
from heisd.retrieval import datastore as datastore_module
from heisd.retrieval.entries import PAYLOAD_FIELDS

KEY_DIM, HIDDEN_DIM, N_TOKENS, N_SEQ = 16, 12, 8, 4
TASKS = ("reach", "push", "drawer-open")
FINGERPRINT = "tiny-vla@sha256:0123"

faiss.omp_set_num_threads(1)


def _writer(index_config: IndexConfig | None = None, **kwargs) -> DatastoreWriter:
    return DatastoreWriter(key_dim=KEY_DIM, hidden_dim=HIDDEN_DIM, n_tokens=N_TOKENS,
                           n_sequences=N_SEQ, target_fingerprint=FINGERPRINT,
                           index_config=index_config, **kwargs)


def _fill(writer: DatastoreWriter, per_task: int = 30, seed: int = 0) -> None:
    """Each task's keys cluster around their own center, as frames of one task do."""
    rng = np.random.default_rng(seed)
    for t, task in enumerate(TASKS):
        center = rng.standard_normal(KEY_DIM)
        for episode in range(2):
            n = per_task // 2
            writer.add(keys=center + 0.5 * rng.standard_normal((n, KEY_DIM)),
                       tokens=rng.integers(31744, 32000, (n, N_SEQ, N_TOKENS)),
                       own_tokens=rng.integers(31744, 32000, (n, N_TOKENS)),
                       hidden=rng.standard_normal((n, HIDDEN_DIM)),
                       ee_pos=rng.standard_normal((n, 3)), episode=10 * t + episode,
                       step=np.arange(n), task=task)


@pytest.fixture(params=["flat", "hnsw"])
def built(request, tmp_path: Path) -> tuple[Path, DatastoreWriter]:
    writer = _writer(IndexConfig(kind=request.param))
    _fill(writer)
    return writer.finalize(tmp_path / "ds", extras={"note": "test"}), writer


def test_round_trip_arrays_and_queries(built, tmp_path: Path) -> None:
    path, writer = built
    ds = Datastore.load(path, expected_fingerprint=FINGERPRINT, expected_key_dim=KEY_DIM)
    written = writer._buffer.arrays()
    for field in PAYLOAD_FIELDS:
        np.testing.assert_array_equal(getattr(ds, field), written[field])
    np.testing.assert_allclose(np.linalg.norm(ds.keys, axis=1), 1.0, rtol=1e-6)
    assert ds.tasks == TASKS and len(ds) == 90 and ds.extras == {"note": "test"}
    assert ds.collection_counts() == {GLOBAL_COLLECTION: 90, **{task: 30 for task in TASKS}}

    queries = np.random.default_rng(1).standard_normal((5, KEY_DIM))
    again = Datastore.load(path)
    for task in (None, "push"):
        for a, b in zip(ds.query_batch(queries, task), again.query_batch(queries, task)):
            np.testing.assert_array_equal(a.indices, b.indices)
            np.testing.assert_array_equal(a.similarities, b.similarities)
            np.testing.assert_array_equal(a.tokens, written["tokens"][a.indices])
            np.testing.assert_array_equal(a.hidden, written["hidden"][a.indices])


def test_top1_of_stored_key_is_itself(built) -> None:
    ds = Datastore.load(built[0])
    for i in (0, 17, 45, 89):
        result = ds.query(ds.keys[i] * 3.0, task=ds.tasks[ds.task_id[i]])  # scale: cosine
        assert result.indices[0] == i and result.similarities[0] == pytest.approx(1.0, abs=1e-5)
        assert len(result) == 8 and np.all(np.diff(result.similarities) <= 1e-6)
        assert result.step[0] == ds.step[i] and result.tasks[0] == ds.tasks[ds.task_id[i]]


def test_task_collections_are_isolated(built) -> None:
    ds = Datastore.load(built[0])
    push_key = ds.keys[ds.task_id == TASKS.index("push")][0]
    for task in TASKS:
        result = ds.query(push_key, task=task, k=30)
        assert result.collection == task and not result.fell_back
        assert set(result.tasks) == {task} and len(result) == 30
    assert len(ds.query(push_key, task="reach", k=50)) == 30  # never padded with other tasks


def test_unknown_task_falls_back_to_global(built) -> None:
    ds = Datastore.load(built[0])
    result = ds.query(ds.keys[3], task="no-such-task")
    assert result.fell_back and result.collection == GLOBAL_COLLECTION
    assert result.indices[0] == 3
    plain = ds.query(ds.keys[3])
    assert not plain.fell_back and plain.collection == GLOBAL_COLLECTION


def test_fingerprint_and_key_dim_mismatch(built) -> None:
    with pytest.raises(DatastoreError, match="other-vla"):
        Datastore.load(built[0], expected_fingerprint="other-vla")
    with pytest.raises(DatastoreError, match="key_dim 16, expected 32"):
        Datastore.load(built[0], expected_key_dim=32)


def test_truncated_file(built) -> None:
    path = built[0]
    data = (path / "hidden.npy").read_bytes()
    (path / "hidden.npy").write_bytes(data[:-40])
    with pytest.raises(DatastoreError, match="truncated") as err:
        Datastore.load(path)
    assert err.value.path == path / "hidden.npy"


def test_checksum_mismatch_and_missing_file(built) -> None:
    path = built[0]
    data = bytearray((path / "index_task1.faiss").read_bytes())
    data[-5] ^= 0xFF  # same size, different content
    (path / "index_task1.faiss").write_bytes(bytes(data))
    with pytest.raises(DatastoreError, match="checksum"):
        Datastore.load(path)
    (path / "index_task1.faiss").unlink()
    with pytest.raises(DatastoreError, match="missing file"):
        Datastore.load(path)


def test_format_version_and_broken_manifest(built) -> None:
    path = built[0]
    manifest = json.loads((path / "manifest.json").read_text())
    (path / "manifest.json").write_text(json.dumps({**manifest, "format_version": 99}))
    with pytest.raises(DatastoreError, match="format_version 99"):
        Datastore.load(path)
    (path / "manifest.json").write_text("{not json")
    with pytest.raises(DatastoreError, match="corrupted manifest"):
        Datastore.load(path)
    with pytest.raises(DatastoreError, match="not a directory"):
        Datastore.load(path.parent / "absent")


def test_empty_collections_are_refused(tmp_path: Path) -> None:
    with pytest.raises(DatastoreError, match="empty datastore"):
        _writer().finalize(tmp_path / "empty")
    writer = _writer(tasks=[*TASKS, "never-demonstrated"])
    _fill(writer)
    with pytest.raises(DatastoreError, match="never-demonstrated"):
        writer.finalize(tmp_path / "partial")
    assert list(tmp_path.iterdir()) == []


def test_finalize_is_atomic(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    writer = _writer()
    _fill(writer)
    calls = {"n": 0}
    real_serialize = faiss.serialize_index  # what finalize writes each index with

    def failing_serialize(index):  # fail on the third index, after files were written
        calls["n"] += 1
        if calls["n"] == 3:
            raise OSError("disk full")
        return real_serialize(index)

    monkeypatch.setattr(datastore_module.faiss, "serialize_index", failing_serialize)
    with pytest.raises(OSError, match="disk full"):
        writer.finalize(tmp_path / "ds")
    assert list(tmp_path.iterdir()) == []  # no target, no leftover temporary directory
    with pytest.raises(DatastoreError):
        Datastore.load(tmp_path / "ds")

    monkeypatch.setattr(datastore_module.faiss, "serialize_index", real_serialize)
    path = writer.finalize(tmp_path / "ds")
    with pytest.raises(OutputError, match="already holds"):
        writer.finalize(path)
    writer.finalize(path, overwrite=True, extras={"v": 2})
    assert Datastore.load(path).extras == {"v": 2}
    assert [p.name for p in tmp_path.iterdir()] == ["ds"]


def test_overwrite_replaces_only_the_datastores_files(tmp_path: Path) -> None:
    """A user's notes and analysis folder beside the datastore survive --overwrite; the old
    datastore's files that the new one lacks (a task fewer) go."""
    writer = _writer()
    _fill(writer)
    path = writer.finalize(tmp_path / "ds")
    (path / "notes.txt").write_text("mine")
    (path / "analysis").mkdir()
    (path / "analysis" / "plot.png").write_bytes(b"png")
    smaller = _writer(tasks=TASKS[:2])
    rng = np.random.default_rng(3)
    for task in TASKS[:2]:
        smaller.add(keys=rng.standard_normal((4, KEY_DIM)), tokens=np.full((4, N_SEQ, N_TOKENS), 31800),
                    own_tokens=np.full((4, N_TOKENS), 31800), hidden=rng.standard_normal((4, HIDDEN_DIM)),
                    ee_pos=np.zeros((4, 3)), episode=0, step=np.arange(4), task=task)
    smaller.finalize(path, overwrite=True)
    ds = Datastore.load(path)
    assert ds.tasks == TASKS[:2] and len(ds) == 8
    assert (path / "notes.txt").read_text() == "mine" and (path / "analysis" / "plot.png").is_file()
    manifest = json.loads((path / "manifest.json").read_text())
    ours = {"manifest.json", *manifest["files"]}
    assert {p.name for p in path.iterdir()} == ours | {"notes.txt", "analysis"}  # index_task2 etc. gone
    assert [p.name for p in tmp_path.iterdir()] == ["ds"]  # no temporaries left beside it


def test_update_extras_persists(built) -> None:
    path = built[0]
    ds = Datastore.load(path)
    ds.update_extras({"verify_skip_theta": 0.93, "kinematics": {"r_p95": 0.4}})
    ds.update_extras({"verify_skip_theta": 0.91})
    expected = {"note": "test", "verify_skip_theta": 0.91, "kinematics": {"r_p95": 0.4}}
    assert ds.extras == expected
    assert Datastore.load(path).extras == expected  # checksums still valid after the rewrite
    assert sorted(p.name for p in path.iterdir() if p.name.startswith(".")) == []


def test_bad_batches_are_refused() -> None:
    writer = _writer()
    good = dict(keys=np.ones((2, KEY_DIM)), tokens=np.zeros((2, N_SEQ, N_TOKENS), int),
                own_tokens=np.zeros((2, N_TOKENS), int), hidden=np.zeros((2, HIDDEN_DIM)),
                ee_pos=np.zeros((2, 3)), episode=0, step=np.arange(2), task="reach")
    with pytest.raises(ValueError, match="tokens must have shape"):
        writer.add(**{**good, "tokens": np.zeros((2, N_TOKENS), int)})
    with pytest.raises(ValueError, match="non-zero"):
        writer.add(**{**good, "keys": np.zeros((2, KEY_DIM))})
    with pytest.raises(ValueError, match="invalid task"):
        writer.add(**{**good, "task": GLOBAL_COLLECTION})
    assert len(writer) == 0
    writer.add(**good)
    assert len(writer) == 2


def test_index_choice_and_benchmark_smoke() -> None:
    config = IndexConfig()
    assert config.resolve(4096, 256) == "flat" and config.resolve(4097, 256) == "hnsw"
    assert IndexConfig(kind="flat").resolve(10**6, 256) == "flat"
    with pytest.raises(ValueError, match="kind"):
        IndexConfig(kind="ivf")  # type: ignore[arg-type]
    result = benchmark_index(3000, 16, n_queries=20, config=IndexConfig(kind="hnsw"))
    assert result["kind"] == "hnsw" and 0.9 <= result["recall_at_k"] <= 1.0
    assert result["bytes_per_entry"] > 16 * 4 and result["query_p50_ms"] > 0
