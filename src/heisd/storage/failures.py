"""A refused write (a full disk, a quota, a file-size limit, a read-only or foreign folder) ends a
command with one `WriteError` naming the output the user asked for, never the hidden temporary it
was being written to (the atomic writers remove that).

Libraries report the system's error each their own way: Python's files raise an `OSError`; torch
raises a RuntimeError while handling that OSError (its `__context__`); Rust code (safetensors)
writes "(os error N)" into its message. `os_error` finds the errno in any of them. Writers whose
library drops it (faiss's index writer, numpy's `tofile`) or cannot survive it (HDF5, see
`heisd.storage.hdf5`) write through Python's files instead.
"""

from __future__ import annotations

import errno
import os
import re
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator, Mapping

from heisd.errors import HeisdError, WriteError

_RUST_OS_ERROR = re.compile(r"\(os error (\d+)\)")  # how Rust's std::io::Error shows an errno
_HINT = "choose another output path"
_HINTS = {  # what the user can do, by errno
    errno.ENOSPC: "free space or choose another output path",
    errno.EDQUOT: "free space (the disk quota is used up) or choose another output path",
    errno.EFBIG: "the file system or a file-size limit (ulimit -f) allows no larger file: choose another output path",
    errno.EROFS: "the file system is read-only: choose another output path",
    errno.EACCES: "no permission to write there: choose another output path",
    errno.EPERM: "no permission to write there: choose another output path",
}


def write_error(path: Path, code: int) -> WriteError:
    return WriteError(f"cannot write {path}: {os.strerror(code)}; {_HINTS.get(code, _HINT)}", Path(path), code)


def os_error(err: BaseException | None) -> tuple[int, Path | None] | None:
    """(errno, the file it names or None) of the system error behind `err`; None if there is none."""
    seen = set()
    while err is not None and id(err) not in seen:
        seen.add(id(err))
        if isinstance(err, OSError) and err.errno:
            return err.errno, None if err.filename is None else Path(os.fsdecode(err.filename))
        match = _RUST_OS_ERROR.search(str(err))
        if match:
            return int(match.group(1)), None
        err = err.__cause__ or err.__context__
    return None


def _output_of(path: Path, output: Path, temps: Mapping[Path, Path]) -> Path | None:
    """The output an error on `path` is about, or None when `path` is another file (an input)."""
    for temp, final in temps.items():
        if path == temp or temp in path.parents:
            return final / path.relative_to(temp)
    if path == output or output in path.parents:
        return path
    if path in output.parents:  # a folder on the way could not be made
        return output
    return None


@contextmanager
def naming_failures(output: Path, temps: Mapping[Path, Path] | None = None) -> Iterator[None]:
    """A system error while the block writes `output` raises a `WriteError` naming it.

    `temps`: temporary -> the output it becomes (a temporary folder covers what is in it), so an
    error on a temporary names its output. An error naming no file is the block's own write and
    names `output`; one naming another file (an input the block reads) passes unchanged, as does
    any `HeisdError` (already a message for the user).
    """
    output, temps = Path(output), dict(temps or {})
    try:
        yield
    except WriteError as err:  # from a writer nested in a temporary folder: name its final place
        named = _output_of(err.path, output, temps)
        if named is None or named == err.path:
            raise
        raise write_error(named, err.errno) from err
    except HeisdError:
        raise
    except Exception as err:
        found = os_error(err)
        if found is None:
            raise
        code, filename = found
        named = output if filename is None else _output_of(filename, output, temps)
        if named is None:
            raise
        raise write_error(named, code) from err
