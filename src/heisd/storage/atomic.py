"""Atomic writes: a reader, a crash or an interrupt finds the old output or the new one, never a part.

New content goes to a hidden temporary sibling (`.NAME.tmp-XXXXXXXX`) that is renamed into place
once complete. The temporary is removed on any exception, KeyboardInterrupt included (and SIGTERM,
which `heisd.storage.interrupts` turns into one), so an interrupted write leaves nothing behind.
Renames that belong together run with SIGINT/SIGTERM held back until they are done. Only a hard
kill (SIGKILL, power loss) can leave a temporary: hidden, never loaded, safe to delete.
"""

from __future__ import annotations

import errno
import json
import math
import os
import shutil
import signal
import uuid
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Collection, Iterator, Sequence

from heisd.errors import OutputError


def temp_sibling(path: Path, tag: str = "tmp") -> Path:
    """A hidden, unique name next to `path`: the same filesystem, so a rename is atomic."""
    return path.with_name(f".{path.name}.{tag}-{uuid.uuid4().hex[:8]}")


def fsync_path(path: Path) -> None:
    """Flush a file (or a directory's entry table) to disk, so a rename after it is durable."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


@contextmanager
def signals_deferred() -> Iterator[None]:
    """SIGINT and SIGTERM wait until the block is done (then arrive as usual)."""
    held = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT, signal.SIGTERM})
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, held)


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    else:
        path.unlink(missing_ok=True)


@contextmanager
def atomic_files(directory: Path, names: Sequence[str]) -> Iterator[dict[str, Path]]:
    """Temporary paths for the files `names` of `directory`; once the block finishes they are
    renamed into place together (interrupts wait for the renames). Other files are left alone."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    temps = {name: temp_sibling(directory / name) for name in names}
    try:
        yield temps
        for tmp in temps.values():
            fsync_path(tmp)
        with signals_deferred():
            for name, tmp in temps.items():
                os.replace(tmp, directory / name)
    finally:
        for tmp in temps.values():
            _remove(tmp)
    fsync_path(directory)


@contextmanager
def atomic_file(path: Path) -> Iterator[Path]:
    """A temporary path to write `path`'s new content to; it replaces `path` in one rename."""
    path = Path(path)
    with atomic_files(path.parent, [path.name]) as temps:
        yield temps[path.name]


def write_text(path: Path, text: str) -> None:
    with atomic_file(path) as tmp:
        tmp.write_text(text)


def strict_json(data: Any, **kwargs: Any) -> str:
    """JSON text without NaN/Infinity literals, which are not JSON (strict parsers, `jq` and
    browsers refuse the file): an undefined number, such as a mean over no frames, is null."""
    return json.dumps(_finite(data), allow_nan=False, **kwargs)


def _finite(value: Any) -> Any:
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {key: _finite(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite(item) for item in value]
    return value


def write_json(path: Path, data: Any, sort_keys: bool = False) -> None:
    write_text(path, strict_json(data, indent=2, sort_keys=sort_keys) + "\n")


def _fsync_tree(root: Path) -> None:
    for folder, _, files in os.walk(root):
        for name in files:
            fsync_path(Path(folder) / name)
        fsync_path(Path(folder))


@contextmanager
def atomic_directory(path: Path, replace: Collection[str] | None = None, last: str | None = None) -> Iterator[Path]:
    """A hidden temporary sibling to build directory `path` in; on success it becomes `path`.

    `replace`: the file names of heisd's existing output at `path` (whether it may be replaced is
    the caller's decision, see `heisd.storage.guard`). They are removed and the new files moved in;
    any other file there (a user's notes) stays. `last` (a manifest) is removed first and moved in
    last, so a reader finds either no output or the whole new one. Without `replace`, a `path`
    that appeared while building is an error and stays untouched. On any exception the temporary
    is removed.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = temp_sibling(path)
    tmp.mkdir()
    try:
        yield tmp
        _fsync_tree(tmp)
        with signals_deferred():
            if replace is not None and path.is_dir():
                _install_into(tmp, path, replace, last)
            else:
                try:
                    os.rename(tmp, path)
                except OSError as err:
                    if err.errno in (errno.ENOTEMPTY, errno.EEXIST, errno.ENOTDIR):
                        raise OutputError(f"{path} appeared while it was being written (another process?); "
                                          "it was left as it is") from err
                    raise
    finally:
        _remove(tmp)
    fsync_path(path.parent)


def _install_into(staged: Path, path: Path, old: Collection[str], last: str | None) -> None:
    """Swap heisd's files `old` in `path` for every entry of `staged`, `last` out first and in last."""
    for name in old:
        if Path(name).name != name or name in ("", ".", ".."):  # names come from a manifest on disk
            raise OutputError(f"{path}: refusing to remove {name!r}, which is not a plain file name of the output")
    ordered = sorted(old, key=lambda name: name != last)
    for name in ordered:
        _remove(path / name)
    new = sorted((entry.name for entry in staged.iterdir()), key=lambda name: name == last)
    for name in new:
        os.replace(staged / name, path / name)
    fsync_path(path)
