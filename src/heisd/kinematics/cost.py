"""Cost-aware hybrid switch (ours, DESIGN 2.4 and 9): per control step, the mode with the
lowest expected decoding latency on the hardware at hand.

Expected latency of a mode at kinematic metric F:

    P(target runs | F) * prefill + (E[target passes | F] - P(target runs | F)) * verify[mode]
      + proposal cost[mode] * (drafter: per verify pass; retrieval: once per step)

- E[target passes | F] (the prefill included; 0 when a prefill skip fires) and P(target runs | F)
  come per F bin (quantiles of the calibration frames' F), seeded with `heisd calibrate`'s
  per-frame numbers and then replaced by what the steps in that bin actually did (a moving
  window of the latest `window` steps).
- The per-piece costs (prefill; one verify pass of each mode's trees, whose sizes differ; one
  drafter proposal; one retrieval step's query + trees) are moving medians of what this process measures, so the same rule sends slow
  motions to the drafter on a GPU, where a drafter pass costs a fraction of a target pass, and
  keeps them on retrieval on a CPU, where it does not.
- A mode whose proposal cost was never measured is tried first (it cannot be compared
  without it); before the kinematic window fills, all frames' estimates are pooled.

Every decision records what it expected, so reports can show how good the predictions were.
"""

from __future__ import annotations

import statistics
from collections import deque
from dataclasses import dataclass
from typing import Any

import numpy as np

from heisd.kinematics.metric import KinematicConfig, KinematicStats, TrajectoryTracker
from heisd.kinematics.switch import Decision, Mode

MODES: tuple[Mode, Mode] = ("retrieval", "drafter")


@dataclass(frozen=True)
class CostSwitchConfig:
    bins: int = 4  # F bins (quantiles of the calibration frames' F)
    window: int = 64  # steps per (mode, bin) and per piece that the estimates average over


class CostAwareSwitch:
    """Same interface as `KinematicSwitch` (`make_tracker`, `mode`), plus `observe` after each step."""

    def __init__(self, kin_config: KinematicConfig, kin_stats: KinematicStats, frames: dict[str, list],
                 n_tokens: int, config: CostSwitchConfig | None = None) -> None:
        kin_stats.check(kin_config)
        self.kin_config, self.kin_stats = kin_config, kin_stats
        self.config, self.n_tokens = config or CostSwitchConfig(), n_tokens
        f = np.array([np.nan if x is None else x for x in frames["F"]], dtype=np.float64)
        if not np.isfinite(f).any():
            raise ValueError("the calibration frames hold no kinematic metric: rerun `heisd calibrate`")
        inner = np.linspace(0.0, 1.0, self.config.bins + 1)[1:-1]
        self.edges = np.quantile(f[np.isfinite(f)], inner)  # bin b: edges[b-1] <= F < edges[b]
        # the latest `window` values of each estimate (plain Python on the hot path: numpy's
        # per-call overhead on a few dozen numbers costs more than the arithmetic)
        window = self.config.window
        self._passes = {(m, b): deque(maxlen=window) for m in MODES for b in range(self.config.bins)}
        self._pieces = {name: deque(maxlen=window) for name in ("prefill", "verify:retrieval", "verify:drafter",
                                                                  "propose:retrieval", "propose:drafter")}
        for mode, passes in seed_passes(frames, n_tokens).items():
            for fi, p in zip(f, passes):
                if np.isfinite(fi):
                    self._passes[(mode, self._bin(fi))].append(float(p))

    # ----- the KinematicSwitch interface -----
    def make_tracker(self, delta_scale: float | None = None) -> TrajectoryTracker:
        return TrajectoryTracker(self.kin_config, self.kin_stats, delta_scale)

    def mode(self, tracker: TrajectoryTracker) -> Decision:
        if (tracker.config, tracker.stats) != (self.kin_config, self.kin_stats):
            raise ValueError("tracker was built with another config or stats (use make_tracker)")
        metric = tracker.fused()
        mode, expected = self.decide(metric)
        return Decision(mode, metric, expected[mode])

    # ----- the rule -----
    def decide(self, metric: float | None) -> tuple[Mode, dict[str, float | None]]:
        """The cheaper mode at F = `metric` (None: window not full) and both expectations (ms)."""
        expected = {m: self.expected_ms(m, metric) for m in MODES}
        untried = [m for m in MODES if expected[m] is None]
        if untried:
            return untried[0], expected
        return min(MODES, key=lambda m: (expected[m], MODES.index(m))), expected

    def expected_ms(self, mode: Mode, metric: float | None) -> float | None:
        """Expected decoding latency of `mode`; None while a piece it needs was never measured."""
        bins = range(self.config.bins) if metric is None else [self._bin(metric)]
        observed = [v for b in bins for v in self._passes[(mode, b)]]
        passes = sum(observed) / len(observed) if observed else None
        runs = sum(v > 0 for v in observed) / len(observed) if observed else None  # P(the target runs)
        prefill, verify = _median(self._pieces["prefill"]), _median(self._pieces[f"verify:{mode}"])
        proposal = _median(self._pieces[f"propose:{mode}"])
        if None in (passes, runs, prefill, proposal):  # e.g. a bin no calibration frame fell into
            return None
        verifies = max(passes - runs, 0.0)
        if verify is None and verifies > 0:
            return None
        proposals = verifies if mode == "drafter" else 1.0  # a drafter pass per verify; one query per step
        return runs * prefill + verifies * (verify or 0.0) + proposals * proposal

    def observe(self, mode: Mode, metric: float | None, result: Any) -> None:
        """Learn from a decoded step (`DecodeResult`): its passes and its measured pieces."""
        t, forwards = result.timing, result.target_forwards
        if metric is not None:
            self._passes[(mode, self._bin(metric))].append(float(forwards))
        pieces = self._pieces
        if forwards > 0:
            pieces["prefill"].append(t.prefill_ms)
        if forwards > 1:
            pieces[f"verify:{mode}"].append(t.verify_ms / (forwards - 1))
            if mode == "drafter":
                pieces["propose:drafter"].append(t.draft_ms / (forwards - 1))
        if mode == "retrieval":
            pieces["propose:retrieval"].append(t.draft_ms)

    def _bin(self, metric: float) -> int:
        return int(np.searchsorted(self.edges, metric, side="right"))


def _median(values: deque) -> float | None:
    return statistics.median(values) if values else None


def seed_passes(frames: dict[str, list], n_tokens: int) -> dict[Mode, np.ndarray]:
    """Target passes per calibration frame and mode, as the methods run them: retrieval 0 when
    the prefill skip fires, else n / tokens-per-forward (a verify-skip is 1); drafter n / tpf."""
    tpf_r = np.asarray(frames["tpf_retrieval"], dtype=np.float64)
    tpf_d = np.asarray(frames["tpf_drafter"], dtype=np.float64)
    retrieval = n_tokens / tpf_r
    if "prefill_skipped" in frames:
        retrieval = np.where(np.asarray(frames["prefill_skipped"], dtype=bool), 0.0, retrieval)
    return {"retrieval": retrieval, "drafter": n_tokens / tpf_d}
