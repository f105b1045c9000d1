"""Loading a datastore directory with every check `Datastore.load` promises."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import faiss
import numpy as np

from heisd.retrieval.entries import GLOBAL_COLLECTION, PAYLOAD_FIELDS
from heisd.retrieval.index import set_ef_search, set_nprobe
from heisd.retrieval.manifest import MANIFEST, DatastoreError, read_manifest, verify_files

Loaded = tuple[Path, dict[str, Any], dict[str, np.ndarray], dict[str, faiss.Index], dict[str, np.ndarray | None]]


# Read through the page cache, not into the process: a big store's keys and hidden states (the two wide
# fields) would otherwise be resident whole; a query touches only the rows it re-ranks
MAPPED_FIELDS = frozenset({"keys", "hidden"})


def _load_array(path: Path, mapped: bool = False) -> np.ndarray:
    try:
        # Never unpickle: a datastore directory may come from anywhere.
        return np.load(path, allow_pickle=False, mmap_mode="r" if mapped else None)
    except (ValueError, OSError, EOFError) as err:
        raise DatastoreError(path, f"unreadable array: {err}") from err


def _load_index(path: Path, key_dim: int, count: int) -> faiss.Index:
    try:
        index = faiss.read_index(str(path))
    except RuntimeError as err:
        raise DatastoreError(path, f"unreadable FAISS index: {err}") from err
    if index.d != key_dim or index.ntotal != count:
        raise DatastoreError(
            path, f"index holds {index.ntotal} x {index.d}-d vectors, manifest says {count} x {key_dim}-d"
        )
    return index


def _check_shapes(root: Path, m: dict[str, Any], arrays: dict[str, np.ndarray]) -> None:
    n = m["n_entries"]
    expected = {
        "keys": (n, m["key_dim"]),
        "tokens": (n, m["n_sequences"], m["n_tokens"]),
        "own_tokens": (n, m["n_tokens"]),
        "hidden": (n, m["hidden_dim"]),
        "ee_pos": (n, 3),
        "episode": (n,),
        "step": (n,),
        "task_id": (n,),
    }
    for field, shape in expected.items():
        if (got := arrays[field].shape) != shape:
            raise DatastoreError(root / f"{field}.npy", f"shape {list(got)}, manifest implies {list(shape)}")
    if n and (arrays["task_id"].min() < 0 or arrays["task_id"].max() >= len(m["tasks"])):
        raise DatastoreError(root / "task_id.npy", "task ids outside the manifest's task list")


def load_validated(
    root: Path,
    expected_fingerprint: str | None,
    expected_key_dim: int | None,
    verify_checksums: bool,
    ef_search: int | None,
) -> Loaded:
    m = read_manifest(root)
    manifest_path = root / MANIFEST
    if expected_fingerprint is not None and m["target_fingerprint"] != expected_fingerprint:
        raise DatastoreError(
            manifest_path,
            f"built for target {m['target_fingerprint']!r}, "
            f"expected {expected_fingerprint!r} (rebuild it for this target)",
        )
    if expected_key_dim is not None and m["key_dim"] != expected_key_dim:
        raise DatastoreError(manifest_path, f"key_dim {m['key_dim']}, expected {expected_key_dim}")
    collections = m["collections"]
    if GLOBAL_COLLECTION not in collections or set(collections) != {GLOBAL_COLLECTION, *m["tasks"]}:
        raise DatastoreError(manifest_path, "collections do not match the task list")
    referenced = [f"{f}.npy" for f in PAYLOAD_FIELDS]
    referenced += [c[key] for c in collections.values() for key in ("index", "ids") if c[key]]
    unlisted = sorted(set(referenced) - set(m["files"]))
    if unlisted:
        raise DatastoreError(manifest_path, f"files {unlisted} have no checksum entry")
    verify_files(root, m["files"], verify_checksums)

    arrays = {field: _load_array(root / f"{field}.npy", field in MAPPED_FIELDS) for field in PAYLOAD_FIELDS}
    _check_shapes(root, m, arrays)
    indexes: dict[str, faiss.Index] = {}
    ids: dict[str, np.ndarray | None] = {}
    for name, c in collections.items():
        if c["count"] < 1:
            raise DatastoreError(manifest_path, f"collection {name!r} is empty")
        indexes[name] = _load_index(root / c["index"], m["key_dim"], c["count"])
        ids[name] = rows = _load_array(root / c["ids"]) if c["ids"] else None
        if rows is not None and (len(rows) != c["count"] or rows.max() >= m["n_entries"]):
            raise DatastoreError(root / c["ids"], f"entry ids do not fit collection {name!r}")
        if ef_search is not None:
            set_ef_search(indexes[name], ef_search)
        if params := c.get("params"):  # IVF-PQ: the nprobe it was built to search with
            set_nprobe(indexes[name], params["nprobe"])
    return root, m, arrays, indexes, ids
