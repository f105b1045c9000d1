"""An exclusive lock on an output heisd writes: a directory (an --out run folder, a datastore's
manifest) or any output path as a whole (a demonstration file, a datastore being built).

A directory's lock is `flock` on `DIR/heisd.lock`; an output path's is `flock` on a hidden sibling
`.NAME.lock`, so it exists before the output does. Either way the kernel drops it when its process dies: a crash
never leaves a stale lock. The file holds the holder's pid and purpose for the error message and
is removed on release. Re-entrant within one process (calibrate holds its datastore's lock and
writes the manifest under the same lock).
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
            os.ftruncate(fd, 0)
            os.pwrite(fd, f"pid {os.getpid()}: {purpose}\n".encode(), 0)
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
    holder. `purpose` (default: the command line) tells other processes who holds it.
    """
    directory = Path(directory)
    if create:
        directory.mkdir(parents=True, exist_ok=True)
    with _locked(directory / LOCK_FILE, directory, purpose, wait_s):
        yield


@contextmanager
def output_lock(path: Path, purpose: str = "", wait_s: float = 0.0) -> Iterator[None]:
    """Hold the exclusive lock of output `path` (a file or a directory, existing or not) for the
    block: one writer at a time. Same waiting and messages as `directory_lock`."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with _locked(path.parent / f".{path.name}.lock", path, purpose, wait_s):
        yield


@contextmanager
def _locked(lock: Path, output: Path, purpose: str, wait_s: float) -> Iterator[None]:
    key = lock.resolve()
    if key in _held:  # the outer holder releases it
        yield
        return
    fd = _acquire(lock, output, purpose or " ".join(["heisd", *sys.argv[1:]]), wait_s)
    _held[key] = fd
    try:
        yield
    finally:
        del _held[key]
        _release(lock, fd)
