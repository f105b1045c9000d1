"""On-disk plumbing of a datastore directory: manifest, checksums, atomic writes."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import uuid
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator

FORMAT_VERSION = 1
MANIFEST = "manifest.json"


class DatastoreError(Exception):
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


def fsync_path(path: Path) -> None:
    """Flush a file (or a directory entry table) to disk, so a rename after it is durable."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


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
            raise DatastoreError(path, f"truncated or altered: {size} bytes, "
                                 f"manifest says {record['bytes']}")
        if checksums and sha256_file(path) != record["sha256"]:
            raise DatastoreError(path, "sha256 checksum mismatch (file corrupted)")


def write_json_atomic(path: Path, data: dict[str, Any]) -> None:
    """Replace `path` in one rename: readers see the old or the new file, never a partial one."""
    tmp = path.with_name(f".{path.name}.tmp-{uuid.uuid4().hex[:8]}")
    try:
        with open(tmp, "w") as f:
            json.dump(data, f, indent=2, sort_keys=True)
            f.write("\n")
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    fsync_path(path.parent)


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
    required = ("target_fingerprint", "key_dim", "hidden_dim", "n_tokens", "n_sequences",
                "n_entries", "tasks", "collections", "files", "extras")
    missing = [key for key in required if key not in manifest]
    if missing:
        raise DatastoreError(path, f"manifest lacks fields {missing}")
    return manifest


@contextmanager
def atomic_directory(out_dir: Path, overwrite: bool) -> Iterator[Path]:
    """Yield a temporary sibling of `out_dir` to build in; rename it to `out_dir` on success.

    On any exception the temporary directory is removed, so nothing loadable or leftover
    remains. A hard crash (kill -9) can leave a hidden `.name.tmp-*` sibling, which has no
    valid manifest at `out_dir` and is never loaded.
    """
    out_dir = Path(out_dir)
    if out_dir.exists() and not overwrite:
        raise DatastoreError(out_dir, "already exists (pass overwrite=True to replace it)")
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    tmp = out_dir.with_name(f".{out_dir.name}.tmp-{uuid.uuid4().hex[:8]}")
    tmp.mkdir()
    try:
        yield tmp
        fsync_path(tmp)
        if out_dir.exists():
            # A directory cannot be replaced in one rename: move the old one aside first.
            old = out_dir.with_name(f".{out_dir.name}.old-{uuid.uuid4().hex[:8]}")
            os.rename(out_dir, old)
            os.rename(tmp, out_dir)
            shutil.rmtree(old)
        else:
            os.rename(tmp, out_dir)
        fsync_path(out_dir.parent)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
