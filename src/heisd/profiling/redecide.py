"""The cost-based choices of a recorded run, made again under a profile's costs (docs/design.md §5.3).

The rules are the ones that run (`CostAwareSwitch`, the fallback's `OptionCosts`), replayed over
the run's steps in order. Each step offers what `heisd bench --record-options` recorded on its
frame: F, both modes' passes and every fallback's passes. Where the live rules learn from measured
milliseconds, the replay feeds them the profile's price of the passes the chosen option needs;
the passes they learn per F bin and per token are the recorded ones. So the replay asks: with
these frames and these acceptance outcomes, what would the rules pick on that device?

What it cannot see: a re-decided choice that would have changed the tokens (group-relaxed
retrieval against exact drafter mode) and so the rest of the episode; the executed actions are
the recorded ones.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from heisd.decoding import DecodeResult
from heisd.decoding.cost_rule import OptionCosts
from heisd.decoding.loop import Timing
from heisd.kinematics import CostAwareSwitch
from heisd.profiling.projection import PieceCosts, Priced, ProjectedStep, RecordedStep
from heisd.runtime.passes import StepPasses

FALLBACK_ORDER = ("ar", "jacobi", "drafter")  # the order `CostFallback` tries them (runtime.methods)


class _RecordedWindow:
    """Stands in for the live `TrajectoryTracker`: the F recorded on this step's frame."""

    def __init__(self, switch: CostAwareSwitch, metric: float | None) -> None:
        self.config, self.stats, self._metric = switch.kin_config, switch.kin_stats, metric

    def fused(self) -> float | None:
        return self._metric


def redecide(steps: Sequence[RecordedStep], config: dict[str, Any], costs: PieceCosts,
             switch: CostAwareSwitch | None, n_tokens: int) -> list[ProjectedStep]:
    """Each step's mode (by `switch`, else as recorded) and fallback (by the cost rule when the
    method uses it, else the configured one), and its projected ms."""
    if any(s.options is None for s in steps):
        raise ValueError("re-deciding needs every step's options (heisd bench --record-options)")
    offered = {o for s in steps for o in s.options.get("retrieval", {}).get("fallbacks", {})}
    rule = None
    if config.get("retrieval_fallback") == "cost" and offered:
        rule = OptionCosts("fallback", [o for o in FALLBACK_ORDER if o in offered])
    out = []
    for step in steps:
        options = step.options
        mode, metric = step.mode, None
        if switch is not None:
            decision = switch.mode(_RecordedWindow(switch, options.get("F")))  # type: ignore[arg-type]
            mode, metric = decision.mode, decision.metric
        fallback = None
        if mode == "retrieval":
            passes = StepPasses.from_json(options["retrieval"])
            if passes.tokens_left:
                fallback = rule.choose()[0] if rule is not None else str(config["retrieval_fallback"])
                if rule is not None:  # the turn: the fallback's passes, the tokens they emitted, their price
                    tail = passes.fallbacks[fallback]
                    rule.record(fallback, len(tail), passes.tokens_left, sum(costs.passes_ms(tail)))
        elif "drafter" in options:
            passes = StepPasses.from_json(options["drafter"])
        else:  # a threshold switch's drafter step: not an option, as it ran
            passes = step.passes
        priced = costs.step(mode, passes.prefill, passes.passes(fallback), passes.fused)
        if switch is not None:
            switch.observe(mode, metric, _as_result(priced, n_tokens))  # type: ignore[arg-type]
        out.append(ProjectedStep(mode, fallback, priced.total + step.host_ms, step.host_ms))  # host time as measured
    return out


def _as_result(priced: Priced, n_tokens: int) -> DecodeResult:
    """What the switch learns from: the step's target passes and its pieces at the profile's prices
    (the query is part of retrieval's proposal time, as in the loop's draft time)."""
    timing = Timing(prefill_ms=priced.prefill, draft_ms=priced.draft + priced.query, verify_ms=priced.verify)
    return DecodeResult([0] * n_tokens, priced.forwards, [], [], 0, 0, timing)
