"""Acceptance rules: which path of a verified draft tree to keep.

All rules share one tree walk (``AcceptanceRule.select``); a rule only says how far a
draft token may deviate from the target's greedy token (``token_bound``, which may read the
target's own token, its confidence and the arm's phase), how far a group may deviate in sum
(``segment_bound``), and where a path may end (every position for token rules, group
boundaries for the group rule). Deviation is measured in bins, so a draft token that is not
an action token is never accepted.
"""

from __future__ import annotations

import math
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
    needs_margins = False  # token_bound reads the target's top-token margins (the verify pass computes them)
    needs_metric = False  # fine_phase reads the step's kinematic metric F (the caller computes it)

    @abstractmethod
    def token_bound(self, position: int, target_bin: int, margin: float, fine: bool) -> int:
        """The largest bin deviation a draft token at ``position`` may have from the target's greedy
        bin ``target_bin``; ``margin``: the target's top-1 minus top-2 logit there (inf when not
        computed); ``fine``: the arm is in a fine phase (`fine_phase`)."""

    def segment_bound(self, position: int, fine: bool) -> int | None:
        """The largest summed deviation of the current segment (group) up to ``position`` (None: no bound)."""
        return None

    def fine_phase(self, metric: float | None) -> bool:
        """Is the arm in a fine phase, by the kinematic metric F of this step (None: unknown)?"""
        return False

    def starts_segment(self, position: int) -> bool:
        return True

    def ends_segment(self, position: int) -> bool:
        """May an accepted path end after ``position``?"""
        return True

    def check(self, n_tokens: int) -> None:
        """Raise if the rule cannot judge an action of ``n_tokens`` tokens."""

    def select(
        self,
        tree: DraftTree,
        target_next: torch.Tensor,
        start: int,
        vocab: ActionVocab,
        margins: torch.Tensor | None = None,
        metric: float | None = None,
    ) -> Acceptance:
        """Pick the accepted path: longest, ties -> smaller total deviation, then earlier node.

        ``target_next[0]`` is the target's greedy token after the root, ``target_next[i+1]``
        after node ``i``; the children of the root sit at action position ``start``.
        ``margins``: the target's top-token logit margins in the same layout (None: not computed);
        ``metric``: the kinematic metric F of this step (None: unknown).
        """
        tokens, parents = tree.tokens.tolist(), tree.parents.tolist()
        targets, depth = target_next.tolist(), tree.depth.tolist()
        margin = margins.tolist() if margins is not None else [math.inf] * len(targets)
        fine = self.fine_phase(metric)
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
            target_bin = vocab.bin(target)
            dev = abs(vocab.bin(tok) - target_bin)
            fresh = p < 0 or self.starts_segment(pos)
            seg_sum[i] = dev + (0 if fresh else seg_sum[p])
            total[i] = dev + (0 if p < 0 else total[p])
            seg_bound = self.segment_bound(pos, fine)
            # the action's first token stays the target's own, as the paper's prefill emits it: a fused
            # prefill pass, which drafts it too, keeps what the paper's order keeps (relaxing it lost a
            # Meta-World episode AR won)
            bound = 0 if pos == 0 else self.token_bound(pos, target_bin, margin[p + 1], fine)
            alive[i] = dev <= bound and (seg_bound is None or seg_sum[i] <= seg_bound)
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

    def token_bound(self, position: int, target_bin: int, margin: float, fine: bool) -> int:
        return 0


class TokenRelaxedAcceptance(AcceptanceRule):
    """SpecVLA: keep a draft token within ``r`` bins of the target's greedy token."""

    def __init__(self, r: int):
        if r < 0:
            raise ValueError(f"r must be >= 0, got {r}")
        self.r = r

    def token_bound(self, position: int, target_bin: int, margin: float, fine: bool) -> int:
        return self.r


class GroupRelaxedAcceptance(AcceptanceRule):
    """HeiSD (docs/design.md §2.4): a group of action positions is accepted or rejected as a whole.

    A group is kept when its bin deviations sum to <= ``max_sum`` and each is <= its token bound;
    the ``exact_groups`` (grippers) must match exactly. Groups are contiguous, in order, and
    cover positions 0..n-1, e.g. ``[[0, 1, 2], [3], [4, 5, 6], [7]]`` with exact groups [1, 3].

    The paper's token bound is ``max_dev`` everywhere. Ours may shrink it (every option off by default):
    - ``scale``: the bound follows the size of the target's own action on that dimension,
      ``clamp(floor(scale * |target bin - zero bin|), floor, max_dev)``; ``zero_bins[p]`` is the
      (fractional) bin of a zero action at position p, so the bound is a fraction of the action
      in action units, whatever the dimension's bin width;
    - ``fine_factor`` / ``fine_below``: where the kinematic metric F < ``fine_below`` (the arm slows
      into a fine phase), every bound, the group sum's too, is multiplied by ``fine_factor`` (0: exact);
    - ``max_margin``: a token where the target's top-1 logit leads its top-2 by more than this
      (a confident target) must match exactly.
    """

    def __init__(
        self,
        groups: Sequence[Sequence[int]],
        max_sum: int,
        max_dev: int,
        exact_groups: Sequence[int] = (),
        *,
        scale: float | None = None,
        floor: int = 0,
        zero_bins: Sequence[float] | None = None,
        fine_factor: float = 1.0,
        fine_below: float = 0.0,
        max_margin: float | None = None,
    ):
        flat = [int(p) for g in groups for p in g]
        if any(len(g) == 0 for g in groups) or flat != list(range(len(flat))):
            raise ValueError(f"groups must be non-empty, contiguous and cover positions 0..n-1 in order, got {groups}")
        if max_sum < 0 or max_dev < 0:
            raise ValueError(f"max_sum and max_dev must be >= 0, got {max_sum}, {max_dev}")
        if any(not 0 <= g < len(groups) for g in exact_groups):
            raise ValueError(f"exact_groups {list(exact_groups)} index outside the {len(groups)} groups")
        if scale is not None and (scale < 0 or zero_bins is None or len(zero_bins) != len(flat)):
            raise ValueError(
                f"scale needs scale >= 0 and one zero bin per position ({len(flat)}), got {scale}, "
                f"{None if zero_bins is None else len(zero_bins)}"
            )
        if not 0 <= floor <= max_dev or not 0.0 <= fine_factor <= 1.0 or (max_margin is not None and max_margin < 0):
            raise ValueError(
                f"need 0 <= floor <= max_dev, 0 <= fine_factor <= 1, max_margin >= 0, got {floor}, "
                f"{fine_factor}, {max_margin}"
            )
        self.n_positions = len(flat)
        self.max_sum, self.max_dev = max_sum, max_dev
        self.scale, self.floor = scale, floor
        self.zero_bins = [float(z) for z in zero_bins] if zero_bins is not None else None
        self.fine_factor, self.fine_below, self.max_margin = fine_factor, fine_below, max_margin
        self.needs_margins = max_margin is not None
        self.needs_metric = fine_factor < 1.0 and fine_below > 0.0
        self._first = {int(g[0]) for g in groups}
        self._last = {int(g[-1]) for g in groups}
        self._exact = {int(p) for k in exact_groups for p in groups[k]}

    def check(self, n_tokens: int) -> None:
        if n_tokens != self.n_positions:
            raise ValueError(f"groups cover {self.n_positions} positions but the action has {n_tokens} tokens")

    def fine_phase(self, metric: float | None) -> bool:
        return metric is not None and metric < self.fine_below

    def token_bound(self, position: int, target_bin: int, margin: float, fine: bool) -> int:
        if position in self._exact or (self.max_margin is not None and margin > self.max_margin):
            return 0
        bound = self.max_dev
        if self.scale is not None and self.zero_bins is not None:
            size = abs(target_bin - self.zero_bins[position])
            bound = min(self.max_dev, max(self.floor, math.floor(self.scale * size)))
        return math.floor(bound * self.fine_factor) if fine else bound

    def segment_bound(self, position: int, fine: bool) -> int:
        return math.floor(self.max_sum * self.fine_factor) if fine else self.max_sum

    def starts_segment(self, position: int) -> bool:
        return position in self._first

    def ends_segment(self, position: int) -> bool:
        return position in self._last
