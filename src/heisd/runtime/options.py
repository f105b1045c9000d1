"""`heisd bench --record-options`: per control step, what each option of the hardware-dependent
choices would have done on the same frame, so `heisd project` can re-decide them under another
device's costs (docs/design.md §5.3).

The choices: the cost switch's mode (both modes are recorded on every step, with F) and the cost
fallback's option after a rejected retrieval group (every fallback's passes on the steps that
reach one). The shadow decodes run after the step's clock stopped, on decoders of their own, so
nothing they do reaches the live switch or cost rules; they share the live skip thresholds. The
robot executes the live step's action, so the episode is the one measured: the options only say
how many target passes, of which sizes, each choice needs on this frame. Tokens are decided by
the acceptance rules; what a device changes is what those passes cost.

An AR fallback needs no decode: it emits one token per pass. The drafter shadow uses the
configured tree (`--drafter-tree cost`'s choices are not re-decided).
"""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING, Any

from heisd.runtime.passes import StepPasses, split_step

if TYPE_CHECKING:
    import torch

    from heisd.decoding import DecodeResult
    from heisd.kinematics import TrajectoryTracker
    from heisd.runtime.methods import Decoders, MethodConfig


def fallback_of(result: DecodeResult) -> tuple[int, int]:
    """(verify passes of retrieval's fallback, tokens it emitted) in a decoded step; (0, 0) if none ran."""
    stats = result.proposer_stats
    start = getattr(stats, "fallback_from", None)
    return (0, 0) if start is None else (int(stats.fallback_passes), len(result.tokens) - int(start))


def ran_fallback(result: DecodeResult, configured: str) -> str | None:
    """The fallback that finished a retrieval step: the cost rule's pick, else the configured one."""
    if fallback_of(result)[0] == 0:
        return None
    choices = getattr(result.proposer_stats, "choices", [])
    return next((c.option for c in choices if c.rule == "fallback"), configured)


class OptionRecorder:
    """Shadow decoders for one policy's method (`make_recorder`)."""

    def __init__(self, cfg: MethodConfig, target, decoders: Decoders) -> None:
        from heisd.decoding.fallback import CostFallback
        from heisd.runtime.methods import mode_decoders

        live = decoders.retrieval
        if live is None:
            raise ValueError(f"{cfg.label} has no retrieval mode: nothing to record")
        self.cfg, self.n_tokens = cfg, target.spec.n_action_tokens
        self.config = {k: v for k, v in cfg.__dict__.items() if k not in ("drafter", "datastore")}
        self.cost_switch = cfg.method == "heisd" and cfg.switch == "cost"
        fallback = live.fallback
        self.fallbacks = list(fallback.options) if isinstance(fallback, CostFallback) else [cfg.retrieval_fallback]
        decoded = [o for o in self.fallbacks if o != "ar"] or ["ar"]  # AR's passes need no decode
        self._retrieval, self._drafter = {}, None
        for option in decoded:
            shadow = replace(cfg, retrieval_fallback=option, drafter_tree="fixed")
            by_mode, proposer = mode_decoders(shadow, target, live.datastore)
            proposer.verify_skip, proposer.prefill_skip = live.verify_skip, live.prefill_skip  # the live thresholds
            self._retrieval[option] = by_mode["retrieval"]
            self._drafter = by_mode.get("drafter", self._drafter)

    def record(self, prefix: torch.Tensor, context: dict[str, Any], mode: str, result: DecodeResult,
               tracker: TrajectoryTracker | None) -> dict[str, Any]:
        """The step's options: {"F", "drafter", "retrieval"} as far as the method can choose them."""
        out: dict[str, Any] = {}
        if self.cost_switch:
            metric = tracker.fused() if tracker is not None else None
            out["F"] = None if metric is None else round(metric, 5)
            drafted = result if mode == "drafter" else self._drafter.decode(prefix, context)
            out["drafter"] = self._passes("drafter", drafted, None).to_json()
        if mode == "retrieval" or self.cost_switch:
            out["retrieval"] = self._retrieval_options(prefix, context, result if mode == "retrieval" else None)
        return out

    def _retrieval_options(self, prefix, context, live: DecodeResult | None) -> dict[str, Any]:
        if live is not None:
            base, ran = live, ran_fallback(live, self.cfg.retrieval_fallback)
        else:
            option = next(iter(self._retrieval))
            base = self._retrieval[option].decode(prefix, context)
            ran = ran_fallback(base, option)
        step = self._passes("retrieval", base, ran)
        if not step.tokens_left:
            return step.to_json()
        fallbacks = dict(step.fallbacks)
        for option in self.fallbacks:
            if option == "ar":
                fallbacks[option] = ((0, 0),) * step.tokens_left  # one token per plain pass
            elif option not in fallbacks:
                fallbacks[option] = self._passes("retrieval", self._retrieval[option].decode(prefix, context),
                                                 option).fallbacks[option]
        return replace(step, fallbacks={o: fallbacks[o] for o in self.fallbacks}).to_json()

    def _passes(self, mode: str, result: DecodeResult, fallback: str | None) -> StepPasses:
        return split_step(mode, result.target_forwards, result.accepted_lengths, result.draft_depths,
                          result.draft_sizes, fallback_of(result), fallback, self.config, self.n_tokens)


def make_recorder(cfg: MethodConfig, target, decoders: Decoders) -> OptionRecorder | None:
    """A recorder where the method makes a cost-based choice (the cost switch, the cost fallback), else None."""
    if cfg.method not in ("retrieval", "heisd"):
        return None
    if not (cfg.method == "heisd" and cfg.switch == "cost") and cfg.retrieval_fallback != "cost":
        return None
    return OptionRecorder(cfg, target, decoders)
