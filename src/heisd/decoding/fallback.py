"""`--retrieval-fallback cost` (ours, docs/design.md §2.8): after a rejected retrieval group, the fallback
(plain AR, Jacobi iterations or the drafter) expected to finish the step's remaining tokens in the
fewest milliseconds, by the shared cost rule (`heisd.decoding.cost_rule`).

A retrieval step hands the rest of the step to its fallback once no retrieved sequence agrees
with the emitted tokens; that set only shrinks, so the fallback keeps the step to its end: one
turn per rejected step, chosen at its first pass and timed until the step ends.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from heisd.decoding.cost_rule import CostChoice, OptionCosts
from heisd.decoding.loop import DecodeState, Outcome, Proposal, Proposer


@dataclass
class FallbackStepStats:
    choices: list[CostChoice] = field(default_factory=list)  # this step's turn, then its options' own choices


class CostFallback(Proposer):
    """A proposer over several fallbacks (`options`: name -> proposer, None = a plain AR step)."""

    def __init__(self, options: dict[str, Proposer | None], window: int = 64) -> None:
        self.options = dict(options)
        self.costs = OptionCosts("fallback", list(self.options), window)
        self._option: str | None = None  # this step's fallback, once chosen
        self._n_tokens = 0

    def begin_step(self, context: dict[str, Any]) -> None:
        # every option may be chosen: each sees the step begin (e.g. Jacobi's warm start)
        for proposer in self.options.values():
            if proposer is not None:
                proposer.begin_step(context)
        self.costs.drop_turn()
        self._option = None

    def propose(self, state: DecodeState) -> Proposal | None:
        if self._option is None:
            self._option, self._n_tokens = self.costs.open_turn(len(state.emitted)), state.n_tokens
        self.costs.count_pass()
        proposer = self.options[self._option]
        return proposer.propose(state) if proposer is not None else None

    def observe(self, outcome: Outcome) -> None:
        proposer = self.options[self._option] if self._option is not None else None
        if proposer is not None:
            proposer.observe(outcome)

    def end_step(self) -> FallbackStepStats:
        stats = FallbackStepStats()
        if self._option is not None:
            choice = self.costs.close_turn(self._n_tokens)  # the step ends with all its tokens out
            if choice is not None:
                stats.choices.append(choice)
        for proposer in self.options.values():
            if proposer is not None:
                stats.choices += getattr(proposer.end_step(), "choices", [])
        return stats

    def reset(self) -> None:
        for proposer in self.options.values():
            if proposer is not None:
                proposer.reset()
