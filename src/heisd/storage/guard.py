"""The output guard: an existing output is replaced only when the user says so (`--overwrite`)
and only when heisd made it; anything else at that path is never touched.

Each writer describes its output with an `OutputKind` next to its file names: what it is called
and how to recognize it (a datastore by its manifest, a demonstration file by its HDF5
attributes, a run folder by its run.json).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from heisd.errors import OutputError
from heisd.storage.lock import LOCK_FILE


@dataclass(frozen=True)
class OutputKind:
    noun: str  # what heisd writes there, for messages ("datastore", "demonstration file")
    recognize: Callable[[Path], bool]  # True when the existing path is this kind of heisd output
    files: tuple[str, ...] = ()  # a directory's own files: what `clear_output` removes
    reusable: tuple[str, ...] = ()  # files that may be there without being a result to protect (caches)


def has_file(*names: str) -> Callable[[Path], bool]:
    """Recognize a directory by any one of its files."""
    return lambda path: path.is_dir() and any((path / name).is_file() for name in names)


def json_file_with(*keys: str) -> Callable[[Path], bool]:
    """Recognize a JSON object file by its keys."""
    def recognize(path: Path) -> bool:
        try:
            data = json.loads(path.read_text())
        except (OSError, ValueError):
            return False
        return isinstance(data, dict) and all(key in data for key in keys)
    return recognize


class json_with:  # noqa: N801 (used like the other recognizers, which are functions)
    """Recognize a directory by a JSON object file `name` holding all of `keys`. `name` is the
    directory's marker: when it is there but unreadable, the error says so instead of calling
    the directory foreign."""

    def __init__(self, name: str, *keys: str) -> None:
        self.marker, self._is_record = name, json_file_with(*keys)

    def __call__(self, path: Path) -> bool:
        return self._is_record(path / self.marker)


def hdf5_with_attr(group: str, attr: str) -> Callable[[Path], bool]:
    """Recognize an HDF5 file by an attribute of one of its groups."""
    def recognize(path: Path) -> bool:
        import h5py

        if not path.is_file():
            return False
        try:
            with h5py.File(path, "r") as f:
                return group in f and attr in f[group].attrs
        except OSError:  # not HDF5 at all
            return False
    return recognize


def is_free(path: Path, kind: OutputKind) -> bool:
    """Nothing to protect at `path`: missing, an empty directory, or one holding only reusable files."""
    path = Path(path)
    if not path.exists():
        return not path.is_symlink()  # a dangling link is not ours to replace
    if not path.is_dir():
        return False
    return all(child.name in (*kind.reusable, LOCK_FILE) for child in path.iterdir())


def check_output(path: Path, kind: OutputKind, overwrite: bool, resume_flag: str | None = None) -> bool:
    """May `path` be written? False: it is free. True: it holds a heisd output and `overwrite`
    allows replacing it. Otherwise `OutputError`: the output exists and `--overwrite` was not
    given, or something heisd did not make is there (refused whatever the flags)."""
    path = Path(path)
    if is_free(path, kind):
        return False
    if not kind.recognize(path):
        marker = getattr(kind.recognize, "marker", None)
        if marker is not None and (path / marker).is_file():
            raise OutputError(f"{path / marker} is corrupt or incomplete, so heisd cannot tell whether {path} holds "
                              f"its {kind.noun}; nothing was touched: repair or remove that file, or choose another "
                              "output path")
        raise OutputError(f"{path} exists and is not a heisd {kind.noun}; heisd never replaces it: "
                          "choose another output path or move it away")
    if not overwrite:
        resume = f" or {resume_flag} to continue it" if resume_flag else ""
        raise OutputError(f"{path} already holds a heisd {kind.noun}; pass --overwrite to replace it{resume}")
    return True


def clear_output(path: Path, kind: OutputKind) -> None:
    """Remove a recognized output directory's own files (other files in it stay)."""
    for name in kind.files:
        (Path(path) / name).unlink(missing_ok=True)


def refuse_foreign(path: Path, kind: OutputKind) -> None:
    """For outputs that resume instead of being replaced: `path` must be free or heisd's own `kind`."""
    check_output(path, kind, overwrite=True)
