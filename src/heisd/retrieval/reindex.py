"""Re-indexing a datastore: the same entries under another vector index, without the target."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from heisd.retrieval.datastore import Datastore, DatastoreWriter
from heisd.retrieval.index_config import IndexConfig
from heisd.retrieval.manifest import files_fingerprint
from heisd.storage import recorded_path

REINDEXED_KEY = "reindexed_from"  # extras: the datastore whose entries were copied


def reindex_datastore(src: str | Path, out: str | Path, config: IndexConfig, overwrite: bool = False) -> dict[str, Any]:
    """Write a copy of the datastore at `src` to `out` with every collection indexed by `config`:
    entries, payload and extras (calibrated thresholds too) unchanged (keys are normalized again,
    which may move their last bit). Returns the new manifest's
    collections (kind and parameters of each index)."""
    store = Datastore.load(src)
    m = store.manifest
    writer = DatastoreWriter(
        key_dim=store.key_dim,
        hidden_dim=int(m["hidden_dim"]),
        n_tokens=int(m["n_tokens"]),
        n_sequences=int(m["n_sequences"]),
        target_fingerprint=store.target_fingerprint,
        index_config=config,
        tasks=store.tasks,
    )
    writer.add(
        keys=store.keys,
        tokens=store.tokens,
        own_tokens=store.own_tokens,
        hidden=store.hidden,
        ee_pos=store.ee_pos,
        episode=store.episode,
        step=store.step,
        task=[store.tasks[t] for t in store.task_id],
    )
    extras = {**store.extras, REINDEXED_KEY: {"path": recorded_path(src), "files_sha256": files_fingerprint(m)}}
    writer.finalize(out, extras=extras, overwrite=overwrite)
    return Datastore.load(out, verify_checksums=False).manifest["collections"]
