"""PD-VLA's parallel (Jacobi) decoding (arXiv 2503.02310) as a proposer of the one loop.

Every remaining action token is guessed at once as a chain; the target verifies the chain in
one pass, exact acceptance keeps the longest correct prefix plus the target's bonus token,
and the next guess for the positions after it is what that same pass predicted there (the
fixed-point iteration: each position takes the target's output given the previous guess).
Each iteration is one target pass, so the worst case is AR's pass count; the result is AR's
tokens exactly. No draft model, no training.

The first guess of a control step is the previous step's action (`context["previous_action"]`,
ours: consecutive actions of a smooth motion are alike), with `fused` verified inside the prefill
pass (`first_draft`: it is known before the target runs); the episode's first step guesses the
prefill's token repeated.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from heisd.decoding.loop import DecodeState, Outcome, Proposal, Proposer
from heisd.decoding.tree import DraftTree


@dataclass
class JacobiStepStats:
    iterations: int = 0  # chains proposed (a fused warm start's rides in the prefill pass)
    warm_start: bool = False  # the first guess came from the previous action


class JacobiProposer(Proposer):
    def __init__(self, fused: bool = False) -> None:
        self.fused = fused  # the warm start is verified inside the prefill pass (`first_draft`)
        self._previous: list[int] | None = None  # this step's warm start
        self._guess: dict[int, int] = {}  # action position -> current guess
        self._stats = JacobiStepStats()

    def begin_step(self, context: dict[str, Any]) -> None:
        previous = context.get("previous_action")
        self._previous = [int(t) for t in previous] if previous is not None else None
        self._guess = {}
        self._stats = JacobiStepStats(warm_start=previous is not None)

    def end_step(self) -> JacobiStepStats:
        return self._stats

    def observe(self, outcome: Outcome) -> None:
        # target_next[j] is the target's token for position `position + j` given the guesses
        # before it: past the kept prefix and the bonus, that is the fixed-point update
        start = outcome.position + len(outcome.accepted) + 1
        for i, token in enumerate(outcome.target_next[len(outcome.accepted) + 1 :].tolist()):
            self._guess[start + i] = int(token)

    def first_draft(self, context: dict[str, Any]) -> DraftTree | None:
        if not self.fused or self._previous is None:
            return None
        self._stats.iterations += 1
        return DraftTree.chain(self._previous)

    def propose(self, state: DecodeState) -> Proposal | None:
        start, n = state.position, state.n_tokens
        if start >= n:
            return None
        fill = self._previous if self._previous is not None and len(self._previous) == n else None
        chain = [self._guess.get(p, fill[p] if fill is not None else state.emitted[-1]) for p in range(start, n)]
        self._stats.iterations += 1
        return Proposal(DraftTree.chain(chain))
