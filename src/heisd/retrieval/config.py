"""How retrieval drafts are shaped (groups, Top-K, bounds, payload), importable without torch:
the command line reads these defaults before any model is loaded."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, fields
from typing import TYPE_CHECKING, Literal

import numpy as np

if TYPE_CHECKING:
    from heisd.decoding.acceptance import GroupRelaxedAcceptance
    from heisd.retrieval.datastore import RetrievalResult

Payload = Literal["own", "demo", "both"]


@dataclass(frozen=True)
class Tolerance:
    """How group-relaxed acceptance shrinks the paper's fixed bounds (`GroupRelaxedAcceptance`).

    Written on the command line as `paper` (the fixed 15/30 bins) or `key=value,...` with keys
    scale, floor, fine, fine-below, margin (e.g. `scale=0.5,floor=2`): see `TOLERANCE_HELP`.
    """

    scale: float | None = None  # (a) token bound = this fraction of the target's own action on the dimension
    floor: int = 0  # (a) the scaled bound never goes below this many bins
    fine_factor: float = 1.0  # (b) bounds are multiplied by this where F < fine_below (0: exact)
    fine_below: float = 0.0  # (b) the kinematic metric F under which the arm is in a fine phase
    max_margin: float | None = None  # (c) exact where the target's top-1 logit leads top-2 by more than this

    _KEYS = {
        "scale": "scale",
        "floor": "floor",
        "fine": "fine_factor",
        "fine-below": "fine_below",
        "margin": "max_margin",
    }

    def __post_init__(self) -> None:
        if self.scale is not None and self.scale < 0:
            raise ValueError(f"tolerance scale must be >= 0, got {self.scale}")
        if self.floor < 0 or not 0.0 <= self.fine_factor <= 1.0 or self.fine_below < 0:
            raise ValueError(
                f"tolerance needs floor >= 0, 0 <= fine <= 1, fine-below >= 0, got "
                f"{self.floor}, {self.fine_factor}, {self.fine_below}"
            )
        if self.max_margin is not None and self.max_margin < 0:
            raise ValueError(f"tolerance margin must be >= 0, got {self.max_margin}")

    @classmethod
    def parse(cls, spec: str) -> Tolerance:
        """`paper`, or `key=value` pairs joined by commas; a clear ValueError names what is wrong."""
        if spec == "paper":
            return cls()
        values: dict[str, float | int] = {}
        for item in spec.split(","):
            key, sep, text = item.partition("=")
            if not sep or key not in cls._KEYS:
                raise ValueError(
                    f"tolerance {spec!r}: {item!r} is not key=value with a key of "
                    f"{', '.join(cls._KEYS)} (or the whole spec 'paper')"
                )
            try:
                values[cls._KEYS[key]] = int(text) if key == "floor" else float(text)
            except ValueError:
                raise ValueError(f"tolerance {spec!r}: {key}={text!r} is not a number") from None
        return cls(**values)  # type: ignore[arg-type]

    def spec(self) -> str:
        """The canonical text of this tolerance (`parse(spec())` gives it back)."""
        keys = {name: key for key, name in self._KEYS.items()}
        parts = [
            f"{keys[f.name]}={getattr(self, f.name):g}" for f in fields(self) if getattr(self, f.name) != f.default
        ]
        return ",".join(parts) or "paper"


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
    tolerance: Tolerance = Tolerance()  # ours: how the bounds shrink per token (default: the paper's fixed ones)
    node_budget: int = 32  # draft tokens per tree (CPU: a 32-node tree costs ~1.15x an 8-token chain)
    payload: Payload = "own"  # draft from the target's own greedy tokens, the demonstrator's, or both
    rank_decay: float = 0.7  # weight of the r-th retrieved sequence is rank_decay**r (votes add up; untuned)
    continue_drafts: bool = True  # after a rejection, draft the rest from the agreeing retrieved sequences
    gripper_guard: bool = True  # safe skips: a draft that opens or closes the gripper is verified, never skipped
    # ours, opt-in: the step's first tree is drafted from the vision key before the target runs and
    # verified inside the prefill pass (one target pass for prefill + verify). Off (the paper's order):
    # a verify pass after the prefill, where the verify-skip (it needs the prefill's hidden state) can
    # apply. On this CPU the tree's tokens cost the prefill pass about what the pass they save costs
    # (BENCHMARKS 14); where a pass's cost is mostly fixed (a GPU's memory-bound decode) it saves one
    fused_prefill: bool = False

    def __post_init__(self) -> None:
        object.__setattr__(self, "groups", tuple(tuple(int(p) for p in g) for g in self.groups))
        object.__setattr__(self, "exact_groups", tuple(int(g) for g in self.exact_groups))
        self.acceptance([0.0] * self.n_tokens)  # validates groups and bounds
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
        """Per position, the largest bin deviation a single token may ever have (0 for grippers)."""
        exact = {p for g in self.exact_groups for p in self.groups[g]}
        return [0 if p in exact else self.max_dev for p in range(self.n_tokens)]

    def acceptance(self, zero_bins: Sequence[float] | None = None) -> GroupRelaxedAcceptance:
        """The acceptance rule these drafts are meant for (one source of the group layout).
        `zero_bins`: per position, the fractional bin of a zero action (needed by a scaled tolerance)."""
        from heisd.decoding.acceptance import GroupRelaxedAcceptance

        t = self.tolerance
        return GroupRelaxedAcceptance(
            self.groups,
            self.max_sum,
            self.max_dev,
            self.exact_groups,
            scale=t.scale,
            floor=t.floor,
            zero_bins=zero_bins,
            fine_factor=t.fine_factor,
            fine_below=t.fine_below,
            max_margin=t.max_margin,
        )

    def sequences(self, result: RetrievalResult) -> np.ndarray:
        """Draft sequences [M, n] in preference order (`both`: own and demo of each rank interleaved)."""
        if self.payload == "own":
            return np.asarray(result.own_tokens)
        if self.payload == "demo":
            return np.asarray(result.tokens[:, 0])
        return np.stack([result.own_tokens, result.tokens[:, 0]], axis=1).reshape(-1, self.n_tokens)
