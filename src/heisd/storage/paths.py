"""Paths and command lines as heisd's records keep them (train_info.json, run.json, bench
reports, datastore manifests): relative to the working directory, so a record names no
machine's folders and its command can be pasted again from where it ran.

A path inside the working directory is recorded relative to it; any other path is recorded as
the user gave it (a relative path already is; an absolute one elsewhere has no better form).
"""

from __future__ import annotations

import os
import shlex
import sys
from collections.abc import Sequence
from pathlib import Path


def recorded_path(path: str | os.PathLike[str]) -> str:
    """`path` relative to the working directory when it lies inside it, else as given."""
    text = os.fspath(path)
    if not os.path.isabs(text):
        return text
    cwd = os.getcwd()
    inside = _inside(text, cwd)
    if inside is None:  # a symlinked spelling of the same folders (e.g. /tmp -> /private/tmp)
        inside = _inside(str(Path(text).resolve()), str(Path(cwd).resolve()))
    return text if inside is None else inside


def _inside(path: str, cwd: str) -> str | None:
    try:
        rel = os.path.relpath(path, cwd)
    except ValueError:  # another drive
        return None
    return None if rel == os.pardir or rel.startswith(os.pardir + os.sep) else rel


def recorded_command(argv: Sequence[str] | None = None) -> str:
    """`heisd ARGS` for the arguments `argv` (default: this process's, after the program name),
    whatever launched it (an entry point, `python -m heisd`), each path argument as
    `recorded_path` keeps it and the whole quoted for a shell."""
    args = list(sys.argv[1:] if argv is None else argv)
    return shlex.join(["heisd", *(_recorded_arg(arg) for arg in args)])


def _recorded_arg(arg: str) -> str:
    if arg.startswith("--") and "=" in arg:  # --out=/abs/path
        flag, value = arg.split("=", 1)
        return f"{flag}={recorded_path(value)}"
    return recorded_path(arg)
