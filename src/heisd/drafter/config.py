"""The drafter's tree shape, importable without torch (the command line reads its defaults)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class TreeConfig:
    topk: int = 4  # children per expanded node, and frontier width
    depth: int = 3  # draft tokens along the deepest path (one drafter pass per level)
    budget: int = 8  # nodes in the final tree

    def __post_init__(self) -> None:
        for name in ("topk", "depth", "budget"):
            if getattr(self, name) < 1:
                raise ValueError(f"TreeConfig.{name} must be >= 1, got {getattr(self, name)}")
