"""Type checks for dataclass configs read from files (a checkpoint's config.json), by field name.

JSON gives any type for any key; without this check a "256" or 256.0 where an int belongs fails
deep inside model construction, or silently changes a computation.
"""

from __future__ import annotations

import dataclasses
import math
import types
import typing
from typing import Any

from heisd.errors import ConfigError


def _fits(value: Any, hint: Any) -> bool:
    origin = typing.get_origin(hint)
    if origin in (typing.Union, types.UnionType):
        return any(_fits(value, arg) for arg in typing.get_args(hint))
    if hint is type(None):
        return value is None
    if hint is bool:
        return isinstance(value, bool)
    if hint is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if hint is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    if hint is str:
        return isinstance(value, str)
    if origin is tuple:
        item = typing.get_args(hint)[0]  # tuple[X, ...]: a JSON list of X
        return isinstance(value, (list, tuple)) and all(_fits(v, item) for v in value)
    return True  # other annotations (nested objects) are checked by whoever builds them


def check_types(cls: type, data: dict[str, Any], where: str) -> None:
    """Raise `ConfigError` naming `where` and the field when a value in `data` does not fit its
    field of dataclass `cls` (floats must be finite; a bool is not an int)."""
    hints = typing.get_type_hints(cls)
    for field in dataclasses.fields(cls):
        if field.name in data and not _fits(data[field.name], hints[field.name]):
            raise ConfigError(f"{where}: field {field.name!r} must be {_name(hints[field.name])}, "
                              f"got {data[field.name]!r}")


def _name(hint: Any) -> str:
    return hint.__name__ if isinstance(hint, type) else str(hint).replace("typing.", "")
