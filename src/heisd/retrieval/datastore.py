"""The demonstration datastore (docs/design.md §2.2): one entry per demonstration frame, searched by
image-feature key, one collection per task plus a global fallback collection.

Build with `DatastoreWriter` (append batches, then `finalize(dir)`); read with
`Datastore.load(dir)`. Layout of a datastore directory:
  manifest.json              format, dims, collections, sha256 of every other file, extras
  <field>.npy                payload arrays over all entries (see `PAYLOAD_FIELDS`)
  index_global.faiss         FAISS index over all entries (row i = entry i)
  index_task{t}.faiss        FAISS index over the entries of task t (name in manifest "tasks")
  ids_task{t}.npy            int64 entry indices of those rows
"""

from __future__ import annotations

import datetime
import json
from collections.abc import Callable, Sequence
from contextlib import nullcontext
from dataclasses import asdict, dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import faiss
import numpy as np

import heisd
from heisd.retrieval.entries import GLOBAL_COLLECTION, PAYLOAD_FIELDS, EntryBuffer
from heisd.retrieval.index import build_index, index_kind, search, set_ef_search, set_nprobe
from heisd.retrieval.index_config import IndexConfig
from heisd.retrieval.loading import load_validated
from heisd.retrieval.manifest import (
    DATASTORE,
    FORMAT_VERSION,
    MANIFEST,
    DatastoreError,
    edit_manifest_extras,
    file_record,
)
from heisd.storage import atomic_directory, check_output, directory_lock, write_json

METRIC = "cosine"  # inner product on L2-normalized keys


@dataclass(frozen=True)
class RetrievalResult:
    """Top-K entries for one query, best first; payload rows are aligned with `indices`."""

    collection: str  # the task searched, or GLOBAL_COLLECTION
    fell_back: bool  # True when the requested task has no collection and global was searched
    indices: np.ndarray  # int64 [k] entry indices
    similarities: np.ndarray  # float32 [k] cosine similarities
    # Payload rows (left out of repr):
    tokens: np.ndarray = field(repr=False)  # int32 [k, S, n] tokens of this step and the next S-1
    own_tokens: np.ndarray = field(repr=False)  # int32 [k, n] the target's greedy tokens there
    hidden: np.ndarray = field(repr=False)  # float32 [k, Dh] lm_head input at the first action
    ee_pos: np.ndarray = field(repr=False)  # float32 [k, 3]
    episode: np.ndarray = field(repr=False)  # int32 [k]
    step: np.ndarray = field(repr=False)  # int32 [k]
    tasks: tuple[str, ...]  # task name per result

    def __len__(self) -> int:
        return len(self.indices)


class DatastoreWriter:
    """Accumulates entries in memory; `finalize` writes the datastore directory atomically.

    `tasks`, when given, declares the per-task collections up front: adding an entry of any
    other task is an error, and so is finalizing while a declared task has no entry (an
    empty collection is never written: it would silently fall back to global at query time).
    """

    def __init__(
        self,
        *,
        key_dim: int,
        hidden_dim: int,
        n_tokens: int,
        n_sequences: int = 4,
        target_fingerprint: str,
        index_config: IndexConfig | None = None,
        tasks: Sequence[str] | None = None,
    ) -> None:
        self.target_fingerprint = target_fingerprint
        self.index_config = index_config or IndexConfig()
        self._buffer = EntryBuffer(key_dim, hidden_dim, n_tokens, n_sequences, tasks)

    def __len__(self) -> int:
        return self._buffer.n_entries

    def add(
        self,
        *,
        keys: np.ndarray,
        tokens: np.ndarray,
        own_tokens: np.ndarray,
        hidden: np.ndarray,
        ee_pos: np.ndarray,
        episode: int | np.ndarray,
        step: np.ndarray,
        task: str | Sequence[str],
    ) -> None:
        """Append a batch of B entries (keys are L2-normalized here); scalars broadcast."""
        self._buffer.add(
            keys=keys,
            tokens=tokens,
            own_tokens=own_tokens,
            hidden=hidden,
            ee_pos=ee_pos,
            episode=episode,
            step=step,
            task=task,
        )

    def finalize(self, out_dir: str | Path, *, extras: dict[str, Any] | None = None, overwrite: bool = False) -> Path:
        """Build every index and write the directory (see the module docstring); returns it.
        `extras` seeds the manifest's free dict (calibrated thresholds, kinematic stats).
        `overwrite` replaces an existing datastore's files (never anything else), holding its lock."""
        out_dir = Path(out_dir)
        replace = check_output(out_dir, DATASTORE, overwrite)
        buf = self._buffer
        counts = buf.task_counts()
        if buf.n_entries == 0:
            raise DatastoreError(
                out_dir, f"refusing to write an empty datastore (collection {GLOBAL_COLLECTION!r} has 0 entries)"
            )
        empty = [name for name, count in zip(buf.tasks, counts, strict=True) if count == 0]
        if empty:
            raise DatastoreError(out_dir, f"refusing to write empty collections for tasks {empty}")
        arrays = buf.arrays()
        with directory_lock(out_dir) if replace else nullcontext():
            old = _own_files(out_dir) if replace else None  # read under the lock: a user's other files stay
            with atomic_directory(out_dir, old, last=MANIFEST) as tmp:
                self._write(tmp, buf, arrays, extras)
        return out_dir

    def _write(self, tmp: Path, buf: EntryBuffer, arrays: dict[str, np.ndarray], extras: dict[str, Any] | None) -> None:
        files: dict[str, dict[str, Any]] = {}

        # Both written through Python's files, whose errors keep their errno: np.save to a path
        # (ndarray.tofile) reports a full disk as "N requested and M written", and faiss's
        # write_index only prints a failure it meets on closing the file.
        def save_array(name: str, array: np.ndarray) -> None:
            with open(tmp / name, "wb") as f:
                np.save(SimpleNamespace(write=f.write), array)  # not a real file to numpy: no tofile
            files[name] = file_record(tmp / name)

        def save_index(name: str, keys: np.ndarray) -> dict[str, Any]:
            """The collection's index fields: its file, kind and (IVF-PQ) the parameters it was built with."""
            index = build_index(keys, self.index_config)
            (tmp / name).write_bytes(faiss.serialize_index(index).tobytes())
            files[name] = file_record(tmp / name)
            kind = index_kind(index)
            record: dict[str, Any] = {"index": name, "kind": kind}
            if kind == "ivfpq":
                record["params"] = asdict(self.index_config.ivfpq_params(*keys.shape))
            return record

        for name in PAYLOAD_FIELDS:
            save_array(f"{name}.npy", arrays[name])
        collections = {
            GLOBAL_COLLECTION: {
                "count": buf.n_entries,
                "ids": None,
                **save_index("index_global.faiss", arrays["keys"]),
            }
        }
        for t, name in enumerate(buf.tasks):
            ids = np.flatnonzero(arrays["task_id"] == t).astype(np.int64)
            save_array(f"ids_task{t}.npy", ids)
            collections[name] = {
                "count": int(len(ids)),
                "ids": f"ids_task{t}.npy",
                **save_index(f"index_task{t}.faiss", arrays["keys"][ids]),
            }
        manifest = {
            "format_version": FORMAT_VERSION,
            "target_fingerprint": self.target_fingerprint,
            "key_dim": buf.key_dim,
            "hidden_dim": buf.hidden_dim,
            "n_tokens": buf.n_tokens,
            "n_sequences": buf.n_sequences,
            "metric": METRIC,
            "n_entries": buf.n_entries,
            "tasks": list(buf.tasks),
            "collections": collections,
            "files": files,
            "index_config": asdict(self.index_config),
            "extras": dict(extras or {}),
            "created": _creation_info(),
        }
        write_json(tmp / MANIFEST, manifest, sort_keys=True)


def _own_files(root: Path) -> list[str]:
    """The files a datastore at `root` consists of: its manifest and the files it lists."""
    try:
        files = [str(name) for name in json.loads((root / MANIFEST).read_text())["files"]]
    except (OSError, ValueError, KeyError, TypeError) as err:
        raise DatastoreError(
            root / MANIFEST,
            f"cannot tell which files the datastore there owns ({err}); "
            "nothing was replaced: move it away or choose another --out",
        ) from err
    return [MANIFEST, *files]


def _creation_info() -> dict[str, str]:
    """When and with what versions (not on which machine: a manifest may be committed)."""
    now = datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")
    return {"utc": now, "heisd": heisd.__version__, "faiss": faiss.__version__, "numpy": np.__version__}


class Datastore:
    """A loaded, validated datastore held in CPU memory; answers Top-K queries per task."""

    def __init__(
        self,
        root: Path,
        manifest: dict[str, Any],
        arrays: dict[str, np.ndarray],
        indexes: dict[str, faiss.Index],
        ids: dict[str, np.ndarray | None],
    ) -> None:
        self.root = root
        self._manifest = manifest
        self._indexes = indexes
        self._ids = ids
        for array in arrays.values():
            array.flags.writeable = False
        # Payload arrays over all entries (read-only), as described in PAYLOAD_FIELDS.
        self.keys, self.tokens = arrays["keys"], arrays["tokens"]
        self.own_tokens, self.hidden = arrays["own_tokens"], arrays["hidden"]
        self.ee_pos, self.episode = arrays["ee_pos"], arrays["episode"]
        self.step, self.task_id = arrays["step"], arrays["task_id"]

    @classmethod
    def load(
        cls,
        path: str | Path,
        *,
        expected_fingerprint: str | None = None,
        expected_key_dim: int | None = None,
        verify_checksums: bool = True,
        ef_search: int | None = None,
    ) -> Datastore:
        """Load and validate; any problem raises `DatastoreError` naming the file and the fault."""
        return cls(*load_validated(Path(path), expected_fingerprint, expected_key_dim, verify_checksums, ef_search))

    # -- description -------------------------------------------------------------------
    @property
    def manifest(self) -> dict[str, Any]:
        return dict(self._manifest)

    @property
    def extras(self) -> dict[str, Any]:
        return dict(self._manifest["extras"])

    @property
    def tasks(self) -> tuple[str, ...]:
        return tuple(self._manifest["tasks"])

    @property
    def target_fingerprint(self) -> str:
        return self._manifest["target_fingerprint"]

    @property
    def key_dim(self) -> int:
        return int(self._manifest["key_dim"])

    def __len__(self) -> int:
        return int(self._manifest["n_entries"])

    def collection_counts(self) -> dict[str, int]:
        return {name: c["count"] for name, c in self._manifest["collections"].items()}

    def set_ef_search(self, ef_search: int) -> None:
        for index in self._indexes.values():
            set_ef_search(index, ef_search)

    def set_nprobe(self, nprobe: int) -> None:
        for index in self._indexes.values():
            set_nprobe(index, nprobe)

    def _rerank(self, name: str) -> int:
        """Candidates per result an IVF-PQ collection re-scores exactly; 0 for exact indexes
        (manifests older than IVF-PQ have no params: their indexes are exact)."""
        params = self._manifest["collections"][name].get("params")
        return int(params.get("rerank", 1)) if params else 0

    # -- queries -----------------------------------------------------------------------
    def resolve_collection(self, task: str | None) -> tuple[str, bool]:
        """(collection searched, fell_back). None asks for global; an unknown task falls
        back to global (e.g. an instruction the demonstrations never covered)."""
        if task is None:
            return GLOBAL_COLLECTION, False
        if task in self._indexes and task != GLOBAL_COLLECTION:
            return task, False
        return GLOBAL_COLLECTION, True

    def query(self, key: np.ndarray, task: str | None = None, k: int = 8) -> RetrievalResult:
        """Top-k entries by cosine similarity to `key` ([Dk]) within `task`'s collection."""
        return self.query_batch(np.asarray(key)[None, :], task, k)[0]

    def query_batch(self, keys: np.ndarray, task: str | None = None, k: int = 8) -> list[RetrievalResult]:
        """Top-k for each row of `keys` ([B, Dk]), e.g. held-out frames during calibration."""
        keys = np.asarray(keys, dtype=np.float32)
        if keys.ndim != 2 or keys.shape[1] != self.key_dim:
            raise ValueError(f"query keys must have shape [B, {self.key_dim}], got {keys.shape}")
        if k < 1:
            raise ValueError(f"k must be >= 1, got {k}")
        norms = np.linalg.norm(keys, axis=1, keepdims=True)
        if not np.all(np.isfinite(norms)) or np.any(norms == 0):
            raise ValueError("query keys must be finite and non-zero")
        name, fell_back = self.resolve_collection(task)
        keys = np.ascontiguousarray(keys / norms)
        rerank = self._rerank(name)
        sims, rows = search(self._indexes[name], keys, k * max(rerank, 1))
        ids = self._ids[name]
        results = []
        for key, sim, row in zip(keys, sims, rows, strict=True):
            keep = row >= 0  # faiss pads with -1 when the collection has fewer than k entries
            idx = (row[keep] if ids is None else ids[row[keep]]).astype(np.int64)
            sim = sim[keep]
            if rerank:  # compressed codes: rank the candidates by their exact cosine (the one thresholds use)
                sim = self.keys[idx] @ key
                best = np.argsort(-sim, kind="stable")[:k]
                idx, sim = idx[best], sim[best]
            results.append(self._result(name, fell_back, idx, sim))
        return results

    def _result(self, name: str, fell_back: bool, idx: np.ndarray, sims: np.ndarray) -> RetrievalResult:
        tasks = self._manifest["tasks"]
        return RetrievalResult(
            collection=name,
            fell_back=fell_back,
            indices=idx,
            similarities=sims.astype(np.float32),
            tokens=self.tokens[idx],
            own_tokens=self.own_tokens[idx],
            hidden=self.hidden[idx],
            ee_pos=self.ee_pos[idx],
            episode=self.episode[idx],
            step=self.step[idx],
            tasks=tuple(tasks[t] for t in self.task_id[idx]),
        )

    # -- persistence of calibrated values ---------------------------------------------
    def update_extras(self, values: dict[str, Any]) -> dict[str, Any]:
        """Merge `values` into the manifest's `extras` (calibrated thresholds); returns the new extras.
        A locked read-modify-write of the manifest on disk: a concurrent edit is never lost."""
        return self.edit_extras(lambda extras: {**extras, **values})

    def edit_extras(self, edit: Callable[[dict[str, Any]], dict[str, Any]]) -> dict[str, Any]:
        """Replace the extras by `edit(extras as now on disk)` under the datastore's lock."""
        self._manifest = edit_manifest_extras(self.root, self._manifest["files"], edit)
        return self.extras
