"""How retrieval drafts are shaped (groups, Top-K, bounds, payload), importable without torch:
the command line reads these defaults before any model is loaded."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

import numpy as np

if TYPE_CHECKING:
    from heisd.decoding.acceptance import GroupRelaxedAcceptance
    from heisd.retrieval.datastore import RetrievalResult

Payload = Literal["own", "demo", "both"]


def action_groups(action_dim: int, chunk: int) -> tuple[list[list[int]], list[int]]:
    """(groups, exact gripper groups) for `chunk` actions of `action_dim` dims, gripper last:
    the arm dims split into runs of 3 (xyz, then rx ry rz), the gripper alone.
    mw (4, 2): [[0,1,2],[3],[4,5,6],[7]], exact [1, 3]; OpenVLA (7, 1): [[0,1,2],[3,4,5],[6]], [2]."""
    groups: list[list[int]] = []
    exact: list[int] = []
    for c in range(chunk):
        base = c * action_dim
        groups += [list(range(base + i, min(base + i + 3, base + action_dim - 1))) for i in range(0, action_dim - 1, 3)]
        exact.append(len(groups))
        groups.append([base + action_dim - 1])
    return groups, exact


@dataclass(frozen=True)
class RetrievalConfig:
    groups: tuple[tuple[int, ...], ...]  # the robot's action groups (`for_action`; mw: xyz | g | xyz' | g')
    exact_groups: tuple[int, ...]  # gripper groups: must match exactly, stay with their result
    k: int = 8  # Top-K entries retrieved per step (paper: unstated)
    max_sum: int = 30  # group-relaxed bounds (paper, 256 bins); also judge first-token consistency
    max_dev: int = 15
    node_budget: int = 32  # draft tokens per tree (CPU: a 32-node tree costs ~1.15x an 8-token chain)
    payload: Payload = "own"  # draft from the target's own greedy tokens, the demonstrator's, or both
    rank_decay: float = 0.7  # weight of the r-th retrieved sequence is rank_decay**r (votes add up; untuned)
    continue_drafts: bool = True  # after a rejection, draft the rest from the agreeing retrieved sequences
    gripper_guard: bool = True  # safe skips: a draft that opens or closes the gripper is verified, never skipped

    def __post_init__(self) -> None:
        object.__setattr__(self, "groups", tuple(tuple(int(p) for p in g) for g in self.groups))
        object.__setattr__(self, "exact_groups", tuple(int(g) for g in self.exact_groups))
        self.acceptance()  # validates groups and bounds
        if self.k < 1 or self.node_budget < 1:
            raise ValueError(f"k and node_budget must be >= 1, got {self.k}, {self.node_budget}")
        if self.payload not in ("own", "demo", "both"):
            raise ValueError(f"payload must be own, demo or both, got {self.payload!r}")
        if not 0.0 < self.rank_decay <= 1.0:
            raise ValueError(f"rank_decay must be in (0, 1], got {self.rank_decay}")

    @classmethod
    def for_action(cls, action_dim: int, chunk: int, **kwargs) -> RetrievalConfig:
        groups, exact = action_groups(action_dim, chunk)
        return cls(groups=tuple(map(tuple, groups)), exact_groups=tuple(exact), **kwargs)

    @property
    def n_tokens(self) -> int:
        return sum(len(g) for g in self.groups)

    def token_bounds(self) -> list[int]:
        """Per position, the largest bin deviation a single token may have (0 for grippers)."""
        exact = {p for g in self.exact_groups for p in self.groups[g]}
        return [0 if p in exact else self.max_dev for p in range(self.n_tokens)]

    def acceptance(self) -> GroupRelaxedAcceptance:
        """The acceptance rule these drafts are meant for (one source of the group layout)."""
        from heisd.decoding.acceptance import GroupRelaxedAcceptance

        return GroupRelaxedAcceptance(self.groups, self.max_sum, self.max_dev, self.exact_groups)

    def sequences(self, result: RetrievalResult) -> np.ndarray:
        """Draft sequences [M, n] in preference order (`both`: own and demo of each rank interleaved)."""
        if self.payload == "own":
            return np.asarray(result.own_tokens)
        if self.payload == "demo":
            return np.asarray(result.tokens[:, 0])
        return np.stack([result.own_tokens, result.tokens[:, 0]], axis=1).reshape(-1, self.n_tokens)
