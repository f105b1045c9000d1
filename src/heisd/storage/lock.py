"""An exclusive lock on an output heisd writes: a directory (an --out run folder, a datastore's
manifest) or any output path as a whole (a demonstration file, a datastore being built).

A directory's lock is `flock` on `DIR/heisd.lock`; an output path's is `flock` on a hidden sibling
`.NAME.lock`, so it exists before the output does. Either way the kernel drops it when its process
dies: a crash never leaves a stale lock. The file holds the holder's pid and purpose for the error message and
is removed on release; so is the directory, when the lock made it and the block failed leaving it
empty (a refused run leaves no empty folder behind). Re-entrant within one process (calibrate
holds its datastore's lock and writes the manifest under the same lock).
"""

from __future__ import annotations

import fcntl
import os
import sys
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

from heisd.errors import OutputError
from heisd.storage.atomic import make_dirs, remove_empty
from heisd.storage.failures import naming_failures

LOCK_FILE = "heisd.lock"
_POLL_S = 0.05  # between attempts while waiting for a lock

_held: dict[Path, int] = {}  # resolved lock file -> fd of each lock this process holds


def _holder(fd: int) -> str:
    try:
        return os.pread(fd, 512, 0).decode(errors="replace").strip() or "unknown"
    except OSError:
        return "unknown"


def _acquire(path: Path, output: Path, purpose: str, wait_s: float) -> int:
    deadline = time.monotonic() + wait_s
    while True:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = _holder(fd)
            os.close(fd)
            if time.monotonic() >= deadline:
                raise OutputError(f"{output} is in use by another heisd process ({holder}); "
                                  "wait for it to finish or use another output") from None
            time.sleep(_POLL_S)
            continue
        try:
            same = os.fstat(fd).st_ino == os.stat(path).st_ino
        except FileNotFoundError:
            same = False
        if same:  # else its last holder removed the file between our open and flock: try again
            try:
                os.ftruncate(fd, 0)
                os.pwrite(fd, f"pid {os.getpid()}: {purpose}\n".encode(), 0)
            except BaseException:  # a full disk: not even the holder's line fits
                _release(path, fd)
                raise
            return fd
        os.close(fd)


def _release(path: Path, fd: int) -> None:
    try:
        if os.stat(path).st_ino == os.fstat(fd).st_ino:  # never remove a file another process now holds
            path.unlink()
    except FileNotFoundError:
        pass  # the directory was replaced (e.g. a datastore rebuilt with --overwrite)
    finally:
        os.close(fd)


@contextmanager
def directory_lock(directory: Path, purpose: str = "", wait_s: float = 0.0, create: bool = True) -> Iterator[None]:
    """Hold the exclusive lock of `directory` for the block (`create`: make the directory if missing).

    Held by another process: wait up to `wait_s` seconds, then raise `OutputError` naming the
    holder. `purpose` (default: the command line) tells other processes who holds it. A directory
    the lock made is removed again when the block fails and leaves it empty.
    """
    directory = Path(directory)
    with _locked(directory / LOCK_FILE, directory, purpose, wait_s, directory if create else None):
        yield


@contextmanager
def output_lock(path: Path, purpose: str = "", wait_s: float = 0.0) -> Iterator[None]:
    """Hold the exclusive lock of output `path` (a file or a directory, existing or not) for the
    block: one writer at a time. Same waiting and messages as `directory_lock`."""
    path = Path(path)
    with _locked(path.parent / f".{path.name}.lock", path, purpose, wait_s, path.parent):
        yield


@contextmanager
def _locked(lock: Path, output: Path, purpose: str, wait_s: float, folder: Path | None) -> Iterator[None]:
    """Hold `lock` (making `folder` first, removed again if the block fails and leaves it empty)."""
    made: list[Path] = []
    try:
        with naming_failures(output):
            made = make_dirs(folder) if folder is not None else []
            key = lock.resolve()
            fd = None if key in _held else _acquire(lock, output, purpose or " ".join(["heisd", *sys.argv[1:]]),
                                                    wait_s)
    except BaseException:
        remove_empty(made)
        raise
    if fd is None:  # held by an outer block of this process: that one releases it
        yield
        return
    _held[key] = fd
    failed = True
    try:
        yield
        failed = False
    finally:
        del _held[key]
        _release(lock, fd)
        if failed:
            remove_empty(made)  # only while empty: what the block wrote stays
