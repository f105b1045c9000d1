"""Hybrid boundary (docs/design.md §2.10): per control step, retrieval SD for large F (straight, fast,
coarse motion), drafter SD for small F (curved, slow, fine motion) and before w steps exist."""

from __future__ import annotations

from typing import Literal, NamedTuple, Protocol

import numpy as np

from heisd.decoding import DecodeResult
from heisd.kinematics.metric import KinematicConfig, KinematicStats, TrajectoryTracker

Mode = Literal["retrieval", "drafter"]


class Decision(NamedTuple):
    mode: Mode
    metric: float | None  # F the decision was made on (None before w positions)
    expected_ms: float | None = None  # the chosen mode's predicted decode time (cost-aware switch)


class Switch(Protocol):
    """What a policy asks of a hybrid switch, per episode and per control step."""

    def make_tracker(self, delta_scale: float | None = None) -> TrajectoryTracker:
        """A new episode's end-effector tracker, with the switch's window and statistics."""

    def mode(self, tracker: TrajectoryTracker) -> Decision:
        """This step's mode, from the tracked path."""

    def observe(self, mode: Mode, metric: float | None, result: DecodeResult) -> None:
        """The decoded step, to learn from (or not)."""


class KinematicSwitch:
    """The paper's fixed boundary on F (a `Switch`)."""

    def __init__(self, config: KinematicConfig, stats: KinematicStats) -> None:
        stats.check(config)
        self.config, self.stats = config, stats

    def make_tracker(self, delta_scale: float | None = None) -> TrajectoryTracker:
        """A tracker with this switch's window and statistics."""
        return TrajectoryTracker(self.config, self.stats, delta_scale)

    def decide(self, metric: float | None) -> Mode:
        if metric is None:  # fewer than w positions: no kinematic evidence yet
            return "drafter"
        return "retrieval" if metric >= self.config.threshold else "drafter"

    def mode(self, tracker: TrajectoryTracker) -> Decision:
        """This step's mode and the F it was decided on (None before w positions)."""
        if (tracker.config, tracker.stats) != (self.config, self.stats):
            raise ValueError("tracker was built with another config or stats (use make_tracker)")
        metric = tracker.fused()
        return Decision(self.decide(metric), metric)

    def observe(self, mode: Mode, metric: float | None, result: DecodeResult) -> None:
        """Nothing to learn: the boundary is fixed."""


def calibrate_threshold(
    metrics: np.ndarray,
    tokens_per_forward_retrieval: np.ndarray,
    tokens_per_forward_drafter: np.ndarray,
    n_candidates: int = 101,
) -> float:
    """Threshold on F maximizing mean expected tokens per target forward over frames.

    `metrics[i]` is F on frame i; `tokens_per_forward_retrieval[i]` / `tokens_per_forward_drafter[i]`
    the tokens per target forward each mode achieves there (offline replay under the acceptance
    rules). Candidates:
    the F quantiles at `n_candidates` evenly spaced levels (observed values) plus one value
    above every F (drafter everywhere). Ties go to the lowest threshold: retrieval runs no
    draft model.
    """
    metrics, tpf_r, tpf_d = (
        np.asarray(a, dtype=np.float64).ravel()
        for a in (metrics, tokens_per_forward_retrieval, tokens_per_forward_drafter)
    )
    if not (len(metrics) == len(tpf_r) == len(tpf_d)) or len(metrics) == 0:
        raise ValueError("metrics and both tokens-per-forward arrays need one non-zero length")
    if not all(np.all(np.isfinite(a)) for a in (metrics, tpf_r, tpf_d)):
        raise ValueError("calibration inputs must be finite (drop frames before the window fills)")
    # inverted_cdf: candidates are observed F values, so the threshold is the smallest F at
    # which retrieval is chosen, not a point interpolated between two frames.
    levels = np.linspace(0.0, 1.0, max(n_candidates, 2))
    quantiles = np.quantile(metrics, levels, method="inverted_cdf")
    above_all = np.nextafter(metrics.max(), np.inf)
    candidates = np.unique(np.maximum(np.append(quantiles, above_all), 0.0))  # thresholds are >= 0
    retrieval = metrics[None, :] >= candidates[:, None]  # [candidates, frames]
    expected = np.where(retrieval, tpf_r[None, :], tpf_d[None, :]).mean(axis=1)
    return float(candidates[int(np.argmax(expected))])
