"""The project's own error types: what the command line reports in one line instead of a traceback.

Raise a `HeisdError` for a problem the user can fix (a flag, an input file, an existing output);
anything else is a bug and keeps its traceback. The message says what is wrong, names the file,
key or flag, and what to do. Subclasses that replace former `ValueError`s keep `ValueError` as
a base, so callers catching that still work.
"""

from __future__ import annotations


class HeisdError(Exception):
    """A problem with the user's flags, inputs, outputs or environment (exit code 1)."""

    exit_code = 1


class UsageError(HeisdError, ValueError):
    """A flag value or a combination of flags that cannot work (exit code 2, as argparse's)."""

    exit_code = 2


class InputError(HeisdError, ValueError):
    """An input file or its content is unusable; the message names the file (and episode or key)."""


class OutputError(HeisdError):
    """An output cannot be written: it exists, is not heisd's to replace, or another process holds it."""


class WriteError(OutputError):
    """The system refused to write an output (disk full, quota, file too large, read-only, no permission).
    `path` is the output the user asked for (never a hidden temporary), `errno` why."""

    def __init__(self, message: str, path, errno: int) -> None:
        super().__init__(message)
        self.path, self.errno = path, errno


class ConfigError(HeisdError, ValueError):
    """A stored configuration field has the wrong type or value; the message names the field."""


class NonFiniteError(HeisdError):
    """A model computed NaN or inf at run time (weights poisoned after loading, or a dtype that
    overflows); the message says in which pass and control step."""
