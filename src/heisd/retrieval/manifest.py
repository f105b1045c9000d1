"""On-disk plumbing of a datastore directory: manifest, checksums, the locked manifest edit.

A datastore is read-only at run time: the manifest changes only through `edit_manifest_extras`,
under the directory's lock (`heisd calibrate`, or eval/bench with `--persist-thresholds`).
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from heisd.errors import HeisdError
from heisd.storage import OutputKind, directory_lock, fsync_path, write_json
from heisd.storage.guard import json_with

FORMAT_VERSION = 1
MANIFEST = "manifest.json"
DATASTORE = OutputKind("datastore", json_with(MANIFEST, "format_version", "target_fingerprint"))
LOCK_WAIT_S = 10.0  # a manifest edit waits this long for another writer (edits take milliseconds)


class DatastoreError(HeisdError):
    """A datastore directory cannot be written or loaded; says which path and what is wrong."""

    def __init__(self, path: str | os.PathLike[str], problem: str) -> None:
        self.path = Path(path)
        self.problem = problem
        super().__init__(f"{self.path}: {problem}")


def sha256_file(path: Path, chunk: int = 1 << 20) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            digest.update(block)
    return digest.hexdigest()


def file_record(path: Path) -> dict[str, Any]:
    fsync_path(path)
    return {"sha256": sha256_file(path), "bytes": path.stat().st_size}


def verify_files(root: Path, files: dict[str, dict[str, Any]], checksums: bool) -> None:
    """Every listed file exists with its recorded size (and sha256 when `checksums`)."""
    for name, record in files.items():
        path = root / name
        if not path.is_file():
            raise DatastoreError(path, "missing file listed in the manifest")
        size = path.stat().st_size
        if size != record["bytes"]:
            raise DatastoreError(path, f"truncated or altered: {size} bytes, manifest says {record['bytes']}")
        if checksums and sha256_file(path) != record["sha256"]:
            raise DatastoreError(path, "sha256 checksum mismatch (file corrupted)")


def read_manifest(root: Path) -> dict[str, Any]:
    if not root.is_dir():
        raise DatastoreError(root, "not a directory (no datastore here)")
    path = root / MANIFEST
    if not path.is_file():
        raise DatastoreError(path, "missing manifest (an unfinished or foreign directory)")
    try:
        manifest = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise DatastoreError(path, f"corrupted manifest: {err}") from err
    if not isinstance(manifest, dict):
        raise DatastoreError(path, "corrupted manifest: not a JSON object")
    version = manifest.get("format_version")
    if version != FORMAT_VERSION:
        raise DatastoreError(path, f"format_version {version!r}, this code reads {FORMAT_VERSION}")
    required = (
        "target_fingerprint",
        "key_dim",
        "hidden_dim",
        "n_tokens",
        "n_sequences",
        "n_entries",
        "tasks",
        "collections",
        "files",
        "extras",
    )
    missing = [key for key in required if key not in manifest]
    if missing:
        raise DatastoreError(path, f"manifest lacks fields {missing}")
    return manifest


def files_fingerprint(manifest: dict[str, Any]) -> str:
    """sha256 over the manifest's file records: identifies the stored data (not the extras)."""
    return hashlib.sha256(json.dumps(manifest["files"], sort_keys=True).encode()).hexdigest()


def edit_manifest_extras(
    root: Path, expected_files: dict[str, Any], edit: Callable[[dict[str, Any]], dict[str, Any]]
) -> dict[str, Any]:
    """Read the manifest fresh under the directory lock, replace its extras by `edit(extras)`,
    write it atomically; returns the new manifest. Concurrent writers queue on the lock, so none
    loses another's edit. `expected_files`: the file records the caller loaded, so an edit never
    lands on a datastore rebuilt in the meantime."""
    with directory_lock(root, wait_s=LOCK_WAIT_S, create=False):
        manifest = read_manifest(root)
        if manifest["files"] != expected_files:
            raise DatastoreError(
                root / MANIFEST, "the datastore was rebuilt since it was loaded; nothing was written (load it again)"
            )
        manifest["extras"] = edit(dict(manifest["extras"]))
        write_json(root / MANIFEST, manifest, sort_keys=True)
    return manifest
