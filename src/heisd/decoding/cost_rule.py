"""The cost rule shared by the retrieval fallback and the drafter's tree size (ours, docs/design.md §2.13):
among a few ways to decode the next tokens, take the one with the lowest expected milliseconds,
from what each measurably cost in this process; an option never measured is tried first.

Expected ms for `t` tokens = t x (target passes per token) x (ms per pass, the proposal and
everything the loop does around the pass included): both moving medians over the latest `window`
turns of that option. A turn is a stretch of consecutive passes one option drafted: it opens
when the option is chosen and closes when the caller knows how many tokens those passes emitted.
Each turn is kept as a `CostChoice` (expected and actual ms), so reports can show how often each
option was chosen and how good the predictions were. A turn during which a CUDA graph was captured
(the first time a pass shape runs under --cuda-graphs) timed the capture, so it teaches nothing:
else the option it chose could look many times too slow, and go untried until its retry.

An option not chosen during the latest `retry_after` learned turns forgets its measurements and
so is tried again at the next choice: each estimate is learned only from its own option's turns,
so without this a stale, pessimistic estimate is never corrected (on LIBERO-10 the fallback kept AR
for 1,255 turns after 27 Jacobi turns, BENCHMARKS.md 18.15). Retries cost at most one turn per
unchosen option in every `retry_after`.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass

from heisd.cuda_graphs import captures
from heisd.decoding.moving import MovingMedian, Staleness


@dataclass(frozen=True)
class CostChoice:
    rule: str  # which rule chose: "fallback" (after a rejected retrieval group) or "tree" (drafter tree size)
    option: str  # what it chose
    expected_ms: float | None  # the prediction for the tokens the turn emitted (None: option untried)
    actual_ms: float  # what the turn took
    tokens: int  # tokens the turn emitted


class OptionCosts:
    """Moving medians per option and the choice they imply (one turn open at a time)."""

    def __init__(self, rule: str, options: Sequence[str], window: int = 64, retry_after: int = 64) -> None:
        if not options:
            raise ValueError(f"the {rule} rule needs at least one option")
        if retry_after < 1:
            raise ValueError(f"the {rule} rule's retry_after must be >= 1 turn, got {retry_after}")
        self.rule, self.options = rule, tuple(options)
        self.window = window
        self._passes_per_token = {o: MovingMedian(window) for o in self.options}
        self._ms_per_pass = {o: MovingMedian(window) for o in self.options}
        self._staleness = Staleness(self.options, retry_after)  # over learned turns
        # option, ms per token, tokens before, start, graphs captured before
        self._turn: tuple[str, float | None, int, float, int] | None = None
        self._passes = 0

    def ms_per_token(self, option: str) -> float | None:
        """Expected ms per emitted token of `option`; None while it was never measured."""
        ppt, mpp = self._passes_per_token[option].value, self._ms_per_pass[option].value
        return None if ppt is None or mpp is None else ppt * mpp

    def choose(self) -> tuple[str, float | None]:
        """(option, its expected ms per token): the first untried option, else the cheapest
        (ties: the earlier option)."""
        costs = [(self.ms_per_token(o), i, o) for i, o in enumerate(self.options)]
        untried = [o for cost, _, o in costs if cost is None]
        if untried:
            return untried[0], None
        cost, _, option = min(costs)
        return option, cost

    def record(self, option: str, passes: int, tokens: int, ms: float) -> None:
        """A finished turn: `passes` target passes emitted `tokens` tokens in `ms`."""
        if passes < 1 or tokens < 1:
            return  # nothing was emitted (or nothing ran): no rate to learn
        self._passes_per_token[option].add(passes / tokens)
        self._ms_per_pass[option].add(ms / passes)
        for other in self._staleness.seen(option):
            if len(self._ms_per_pass[other]):  # stale: forgotten, so the next choice tries it again
                self._passes_per_token[other] = MovingMedian(self.window)
                self._ms_per_pass[other] = MovingMedian(self.window)

    # ----- turns -----
    @property
    def turn_open(self) -> bool:
        return self._turn is not None

    def open_turn(self, emitted: int) -> str:
        """Choose an option for the passes to come (`emitted`: tokens emitted so far) and time them."""
        option, per_token = self.choose()
        self._turn, self._passes = (option, per_token, emitted, time.perf_counter(), captures()), 0
        return option

    def count_pass(self) -> None:
        self._passes += 1

    def close_turn(self, emitted: int) -> CostChoice | None:
        """End the open turn (`emitted`: tokens emitted by now), learn from it, and return it."""
        if self._turn is None:
            return None
        option, per_token, before, start, captured = self._turn
        ms, tokens = (time.perf_counter() - start) * 1e3, emitted - before
        self._turn = None
        if captures() == captured:
            self.record(option, self._passes, tokens, ms)
        expected = None if per_token is None else per_token * tokens
        return CostChoice(self.rule, option, expected, ms, tokens)

    def drop_turn(self) -> None:
        """Forget the open turn unlearned (its end cannot be told apart from others' passes)."""
        self._turn = None
