"""Atomic writes: a reader, a crash or an interrupt finds the old output or the new one, never a part.

New content goes to a hidden temporary sibling (`.NAME.tmp-XXXXXXXX`) that is renamed into place
once complete. The temporary is removed on any exception, KeyboardInterrupt included (and SIGTERM,
which `heisd.storage.interrupts` turns into one), so an interrupted write leaves nothing behind,
nor do the folders it made on the way. Renames that belong together run with SIGINT/SIGTERM held
back until they are done. Only a hard kill (SIGKILL, power loss) can leave a temporary: hidden,
never loaded, safe to delete. A write the system refuses (a full disk) raises a `WriteError`
naming the output (`heisd.storage.failures`).
"""

from __future__ import annotations

import errno
import json
import math
import os
import shutil
import signal
import uuid
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Any, Collection, Iterator, Sequence

from heisd.errors import OutputError
from heisd.storage.failures import naming_failures


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


def make_dirs(path: Path) -> list[Path]:
    """Make folder `path` and its missing parents; returns the ones made, deepest first."""
    made = []
    for folder in (path, *path.parents):
        if folder.exists():
            break
        made.append(folder)
    try:
        path.mkdir(parents=True, exist_ok=True)
    except BaseException:
        remove_empty(made)  # the parents made before the failure
        raise
    return made


def remove_empty(folders: Sequence[Path]) -> None:
    """Remove `folders` (deepest first) while they are empty: what a failed write made on its way."""
    for folder in folders:
        try:
            folder.rmdir()
        except OSError:  # someone's files are in it now (or it is gone): it and its parents stay
            return


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
    temps = {name: temp_sibling(directory / name) for name in names}
    output = directory / names[0] if len(names) == 1 else directory  # what a refused write names
    made: list[Path] = []
    done = False
    try:
        with naming_failures(output, {tmp: directory / name for name, tmp in temps.items()}):
            made = make_dirs(directory)
            yield temps
            for tmp in temps.values():
                fsync_path(tmp)
            with signals_deferred():
                for name, tmp in temps.items():
                    os.replace(tmp, directory / name)
            done = True
            fsync_path(directory)
    finally:
        for tmp in temps.values():
            _remove(tmp)
        if not done:
            remove_empty(made)


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


def append_text(path: Path, text: str, sync: bool = False) -> None:
    """Append `text` (whole lines) to `path`, all of it or none: a refused write (a full disk) is
    cut off again, so a log never ends in half a line, and raises a `WriteError` naming `path`.
    `sync`: on disk before this returns."""
    path = Path(path)
    data = memoryview(text.encode())
    with naming_failures(path):
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            start = os.lseek(fd, 0, os.SEEK_END)
            try:
                while data:
                    data = data[os.write(fd, data):]
                if sync:
                    os.fsync(fd)
            except BaseException:
                with suppress(OSError):
                    os.ftruncate(fd, start)
                raise
        finally:
            os.close(fd)


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
    tmp = temp_sibling(path)
    made: list[Path] = []
    done = False
    try:
        with naming_failures(path, {tmp: path}):
            made = make_dirs(path.parent)
            tmp.mkdir()
            yield tmp
            _fsync_tree(tmp)
            _install(tmp, path, replace, last)
            done = True
            fsync_path(path.parent)
    finally:
        _remove(tmp)
        if not done:
            remove_empty(made)


def _install(tmp: Path, path: Path, replace: Collection[str] | None, last: str | None) -> None:
    """Rename the finished folder `tmp` to `path`, or move its files into an existing `path` whose
    heisd files `replace` names."""
    with signals_deferred():
        if replace is not None and path.is_dir():
            _install_into(tmp, path, replace, last)
            return
        try:
            os.rename(tmp, path)
        except OSError as err:
            if err.errno in (errno.ENOTEMPTY, errno.EEXIST, errno.ENOTDIR):
                raise OutputError(f"{path} appeared while it was being written (another process?); "
                                  "it was left as it is") from err
            raise


def _install_into(staged: Path, path: Path, old: Collection[str], last: str | None) -> None:
    """Swap heisd's files `old` in `path` for every entry of `staged`, `last` out first and in last."""
    for name in old:
        if Path(name).name != name or name in ("", ".", ".."):  # names come from a manifest on disk
            raise OutputError(f"{path}: refusing to remove {name!r}, which is not a plain file name of the output")
    for name in sorted(old, key=lambda name: name != last):
        _remove(path / name)
    for name in sorted((entry.name for entry in staged.iterdir()), key=lambda name: name == last):
        os.replace(staged / name, path / name)
    fsync_path(path)
