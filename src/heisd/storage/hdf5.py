"""New HDF5 files written so that a refused write (a full disk) is an ordinary error, never a crash.

HDF5 does not survive a failed write. A dataset whose close fails to write (h5py closes datasets
when their Python object is freed, where it can only print the error) stays registered inside
HDF5 after its file is freed; the next close of it, h5py's when the file closes or HDF5's own at
exit, reads freed memory and the interpreter dies of a segmentation fault (seen with h5py 3.16 and
HDF5 2.0 on a full disk). So HDF5 never sees one: it writes through `_Sink` (h5py's file-object
driver), which keeps a write the system refuses in memory and remembers the error. The writer
raises that error at its next `check()` or when the file closes; the atomic writer around it then
removes the temporary file and names the output (`heisd.storage.failures`).
"""

from __future__ import annotations

import errno
import os
from pathlib import Path


class _Sink:
    """The file HDF5 writes through: positioned reads and writes on one descriptor, plus the
    writes the system refused, kept in order and laid over what reads return, so HDF5 reads back
    what it wrote."""

    def __init__(self, path: Path) -> None:
        self._fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
        self._pos = 0
        self._size = 0  # the file's size as HDF5 made it (refused writes included)
        self._refused: list[tuple[int, bytes]] = []
        self.failure: OSError | None = None  # the first write the system refused

    def seek(self, pos: int, whence: int = os.SEEK_SET) -> int:
        self._pos = self._size + pos if whence == os.SEEK_END else pos
        return self._pos

    def tell(self) -> int:
        return self._pos

    def write(self, data) -> int:
        view = memoryview(data).cast("B")
        size, offset = len(view), self._pos
        if self.failure is None:
            try:
                while view:
                    done = os.pwrite(self._fd, view, offset)
                    if done == 0:
                        raise OSError(errno.EIO, os.strerror(errno.EIO))  # no progress: never spin
                    view, offset = view[done:], offset + done
            except OSError as err:
                self.failure = err
        if view:  # refused now or after an earlier refusal: nothing goes to the file any more
            self._refused.append((offset, bytes(view)))
        self._pos += size
        self._size = max(self._size, self._pos)
        return size

    def read(self, size: int) -> bytes:
        start, end = self._pos, self._pos + size
        data = bytearray(os.pread(self._fd, size, start).ljust(size, b"\0"))
        for offset, held in self._refused:
            lo, hi = max(offset, start), min(offset + len(held), end)
            if lo < hi:
                data[lo - start:hi - start] = held[lo - offset:hi - offset]
        self._pos = end
        return bytes(data)

    def truncate(self, size: int) -> int:
        if self.failure is None:
            try:
                os.ftruncate(self._fd, size)
            except OSError as err:
                self.failure = err
        self._size = size
        return size

    def flush(self) -> None:
        """Writes go to the file as they come (syncing to disk is the atomic writer's)."""

    def close(self) -> None:
        os.close(self._fd)


class HDF5Output:
    """A new HDF5 file at `path` (a temporary of an atomic writer), used as a context manager;
    `.file` is the h5py File. `check()` raises the system's error once a write was refused (call it
    between units of work, e.g. after each episode, so a full disk stops the work early); leaving
    the block closes the file and raises it too. After an error in the block, the block's error
    is the one raised."""

    def __init__(self, path: Path) -> None:
        import h5py

        self._sink = _Sink(Path(path))
        try:
            self.file = h5py.File(self._sink, "w")
        except BaseException:
            self._sink.close()
            raise

    def check(self) -> None:
        if self._sink.failure is not None:
            raise self._sink.failure

    def _close(self) -> None:
        try:
            self.file.close()  # HDF5 writes what it still holds, into the sink (which never fails it)
        finally:
            self._sink.close()

    def __enter__(self) -> "HDF5Output":
        return self

    def __exit__(self, kind, err, tb) -> None:
        self._close()
        if err is None:
            self.check()
