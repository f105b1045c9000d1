"""Acceptance rules: which path of a verified draft tree to keep.

All rules share one tree walk (``AcceptanceRule.select``); a rule only says how far a
draft token may deviate from the target's greedy token, and where a path may end
(every position for token rules, group boundaries for the group rule). Deviation is
measured in bins, so a draft token that is not an action token is never accepted.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from heisd.decoding.tree import DraftTree
from heisd.decoding.vocab import ActionVocab


@dataclass
class Acceptance:
    nodes: list[int]  # accepted node indices, root's child first
    tokens: list[int]  # their (draft) tokens
    bonus: int  # the target's greedy token after the accepted path
    deviation: int  # summed bin deviation of the accepted tokens


class AcceptanceRule(ABC):
    @abstractmethod
    def token_ok(self, deviation: int, position: int) -> bool:
        """May a draft token ``deviation`` bins from the target's greedy token be kept at ``position``?"""

    def segment_ok(self, deviation_sum: int, position: int) -> bool:
        """May the current segment (group) sum to ``deviation_sum`` up to ``position``?"""
        return True

    def starts_segment(self, position: int) -> bool:
        return True

    def ends_segment(self, position: int) -> bool:
        """May an accepted path end after ``position``?"""
        return True

    def check(self, n_tokens: int) -> None:
        """Raise if the rule cannot judge an action of ``n_tokens`` tokens."""

    def select(self, tree: DraftTree, target_next: torch.Tensor, start: int, vocab: ActionVocab) -> Acceptance:
        """Pick the accepted path: longest, ties -> smaller total deviation, then earlier node.

        ``target_next[0]`` is the target's greedy token after the root, ``target_next[i+1]``
        after node ``i``; the children of the root sit at action position ``start``.
        """
        tokens, parents = tree.tokens.tolist(), tree.parents.tolist()
        targets, depth = target_next.tolist(), tree.depth.tolist()
        alive = [False] * len(tree)
        seg_sum = [0] * len(tree)  # deviation summed over the current segment
        total = [0] * len(tree)  # deviation summed over the whole path
        best, best_key = -1, (0, 0)  # key: (length, -deviation); -1 = accept nothing
        for i, (tok, p) in enumerate(zip(tokens, parents, strict=True)):
            if p >= 0 and not alive[p]:
                continue
            target, pos = targets[p + 1], start + depth[i] - 1
            if not (vocab.is_action(tok) and vocab.is_action(target)):
                continue
            dev = abs(vocab.bin(tok) - vocab.bin(target))
            fresh = p < 0 or self.starts_segment(pos)
            seg_sum[i] = dev + (0 if fresh else seg_sum[p])
            total[i] = dev + (0 if p < 0 else total[p])
            alive[i] = self.token_ok(dev, pos) and self.segment_ok(seg_sum[i], pos)
            key = (depth[i], -total[i])
            if alive[i] and self.ends_segment(pos) and key > best_key:
                best, best_key = i, key
        nodes = tree.path(best) if best >= 0 else []
        return Acceptance(
            nodes=nodes,
            tokens=[tokens[n] for n in nodes],
            bonus=targets[best + 1],
            deviation=total[best] if best >= 0 else 0,
        )


class ExactAcceptance(AcceptanceRule):
    """Greedy match: lossless, the output equals plain greedy decoding."""

    def token_ok(self, deviation: int, position: int) -> bool:
        return deviation == 0


class TokenRelaxedAcceptance(AcceptanceRule):
    """SpecVLA: keep a draft token within ``r`` bins of the target's greedy token."""

    def __init__(self, r: int):
        if r < 0:
            raise ValueError(f"r must be >= 0, got {r}")
        self.r = r

    def token_ok(self, deviation: int, position: int) -> bool:
        return deviation <= self.r


class GroupRelaxedAcceptance(AcceptanceRule):
    """HeiSD (docs/design.md §2.4): a group of action positions is accepted or rejected as a whole.

    A group is kept when its bin deviations sum to <= ``max_sum`` and each is <= ``max_dev``;
    the ``exact_groups`` (grippers) must match exactly. Groups are contiguous, in order, and
    cover positions 0..n-1, e.g. ``[[0, 1, 2], [3], [4, 5, 6], [7]]`` with exact groups [1, 3].
    """

    def __init__(
        self,
        groups: Sequence[Sequence[int]],
        max_sum: int,
        max_dev: int,
        exact_groups: Sequence[int] = (),
    ):
        flat = [int(p) for g in groups for p in g]
        if any(len(g) == 0 for g in groups) or flat != list(range(len(flat))):
            raise ValueError(f"groups must be non-empty, contiguous and cover positions 0..n-1 in order, got {groups}")
        if max_sum < 0 or max_dev < 0:
            raise ValueError(f"max_sum and max_dev must be >= 0, got {max_sum}, {max_dev}")
        if any(not 0 <= g < len(groups) for g in exact_groups):
            raise ValueError(f"exact_groups {list(exact_groups)} index outside the {len(groups)} groups")
        self.n_positions = len(flat)
        self.max_sum, self.max_dev = max_sum, max_dev
        self._first = {int(g[0]) for g in groups}
        self._last = {int(g[-1]) for g in groups}
        self._exact = {int(p) for k in exact_groups for p in groups[k]}

    def check(self, n_tokens: int) -> None:
        if n_tokens != self.n_positions:
            raise ValueError(f"groups cover {self.n_positions} positions but the action has {n_tokens} tokens")

    def token_ok(self, deviation: int, position: int) -> bool:
        return deviation == 0 if position in self._exact else deviation <= self.max_dev

    def segment_ok(self, deviation_sum: int, position: int) -> bool:
        return deviation_sum <= self.max_sum

    def starts_segment(self, position: int) -> bool:
        return position in self._first

    def ends_segment(self, position: int) -> bool:
        return position in self._last
