"""Package namespaces that import their modules on first use.

`from heisd.drafter import Drafter` keeps working, but importing `heisd.drafter.config` (a torch-free
dataclass the command line reads its defaults from) no longer drags in torch and transformers
through the package's `__init__`.
"""

from __future__ import annotations

from collections.abc import Callable
from importlib import import_module
from typing import Any


def lazy_exports(package: str, exports: dict[str, str]) -> Callable[[str], Any]:
    """A module-level `__getattr__` for `package`: name -> the submodule (relative) that defines it."""

    def __getattr__(name: str) -> Any:
        if name not in exports:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        return getattr(import_module(f"{package}.{exports[name]}"), name)

    return __getattr__
