"""Cost-aware hybrid switch (ours, docs/design.md §2.10 and §5.2): per control step, the mode with the
lowest expected decoding latency on the hardware at hand.

Expected latency of a mode at kinematic metric F:

    P(target runs | F) * prefill[mode] + (E[target passes | F] - P(target runs | F)) * verify[mode]
      + proposal cost[mode] * (drafter: per verify pass; retrieval: once per step)

- E[target passes | F] (the prefill included; 0 when a prefill skip fires) and P(target runs | F)
  come per F bin (quantiles of the calibration frames' F), seeded with the count and means of
  every `heisd calibrate` frame in that bin (the order of the frames plays no part) and then
  replaced by what the steps in that bin actually did (a moving window of the latest `window`
  steps; each step displaces one seeded slot, the seed fills at most `window`).
- The per-piece costs (each mode's prefill pass, which in retrieval mode also verifies the step's
  first tree; one verify pass of each mode's trees, whose sizes differ; one
  drafter proposal; one retrieval step's query + trees) are moving medians of what this process
  measures, so the same rule sends slow motions to the drafter on a GPU, where a drafter pass
  costs a fraction of a target pass, and keeps them on retrieval on a CPU, where it does not.
- A step during which a CUDA graph was captured (a pass shape's first run under --cuda-graphs)
  timed the capture: its pieces are not learned (its passes are), so a mode is never priced by
  its first, capturing steps.
- A mode whose proposal cost was never measured is tried first (it cannot be compared
  without it); before the kinematic window fills, all frames' estimates are pooled.
- F is computed only when it can change the decision: when the same mode is cheaper in every
  bin (and before the window fills), with both modes' estimates known, that mode runs without F
  (on a CPU its circle fit costs a fraction of a millisecond a step,
  `scripts/time_kinematic_metric.py`). Such a step's passes cannot be put in a bin, so every
  `learn_every`-th of them computes F anyway to keep learning.
- A mode that has not run in an F bin during the latest `retry_after` steps there (steps with F)
  forgets its passes in that bin, its seed included, and so is tried there again: a bin's
  estimate for a mode is learned only from that mode's steps in it, so without this a stale,
  pessimistic estimate is never corrected (on LIBERO-10 two bins stayed on the dearer drafter for
  ten episodes, BENCHMARKS.md 18.15). A switch that skips F sees fewer of a bin's steps, so it
  retries later than one computing F every step.

Every decision records what it expected, so reports can show how good the predictions were.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass

import numpy as np

from heisd.cuda_graphs import captures
from heisd.decoding import DecodeResult
from heisd.decoding.moving import MovingMean, MovingMedian, Staleness
from heisd.kinematics.metric import KinematicConfig, KinematicStats, TrajectoryTracker
from heisd.kinematics.switch import Decision, Mode

MODES: tuple[Mode, Mode] = ("retrieval", "drafter")
_PREFILL = {m: f"prefill:{m}" for m in MODES}  # piece names per mode (retrieval's prefill pass carries its first tree)
_VERIFY = {m: f"verify:{m}" for m in MODES}
_PROPOSE = {m: f"propose:{m}" for m in MODES}
PIECES = (*_PREFILL.values(), *_VERIFY.values(), *_PROPOSE.values())


@dataclass(frozen=True)
class CostSwitchConfig:
    bins: int = 4  # F bins (quantiles of the calibration frames' F)
    window: int = 64  # steps per (mode, bin) and per piece that the estimates average over
    # when no F bin could change the decision, F is not computed (a fraction of a millisecond a step
    # on a CPU); every this many such steps it is computed anyway, so the per-bin passes keep learning
    learn_every: int = 8
    # a mode that has not run in an F bin for this many of the bin's steps is tried there again
    retry_after: int = 64

    def __post_init__(self) -> None:
        for name in ("bins", "window", "learn_every", "retry_after"):
            if getattr(self, name) < 1:
                raise ValueError(f"CostSwitchConfig.{name} must be >= 1, got {getattr(self, name)}")


class CostAwareSwitch:  # a `Switch`
    """Same interface as `KinematicSwitch` (`make_tracker`, `mode`), plus `observe` after each step."""

    def __init__(
        self,
        kin_config: KinematicConfig,
        kin_stats: KinematicStats,
        frames: dict[str, list],
        n_tokens: int,
        config: CostSwitchConfig | None = None,
    ) -> None:
        kin_stats.check(kin_config)
        self.kin_config, self.kin_stats = kin_config, kin_stats
        self.config, self.n_tokens = config or CostSwitchConfig(), n_tokens
        f = np.array([np.nan if x is None else x for x in frames["F"]], dtype=np.float64)
        if not np.isfinite(f).any():
            raise ValueError("the calibration frames hold no kinematic metric: rerun `heisd calibrate`")
        inner = np.linspace(0.0, 1.0, self.config.bins + 1)[1:-1]
        self.edges = np.quantile(f[np.isfinite(f)], inner)  # bin b: edges[b-1] <= F < edges[b]
        self._edges = self.edges.tolist()  # plain floats for bisect on the hot path
        window = self.config.window
        seeds = bin_seeds(f, seed_passes(frames, n_tokens), self.edges)
        self._passes = {
            key: MovingMean(window, seeds.get(key)) for key in ((m, b) for m in MODES for b in range(self.config.bins))
        }
        self._pieces = {name: MovingMedian(window) for name in PIECES}
        # per bin, over its steps with F (a seed counts as a run at the bin's step 0)
        self._staleness = [Staleness(MODES, self.config.retry_after) for _ in range(self.config.bins)]
        self._captures = captures()  # graphs captured by the latest `observe`
        # the bins an F can land in (coinciding quantile edges leave some empty by construction)
        self._cases: list[int | None] = [None] + sorted({0} | {self._bin(e) for e in self._edges})
        self._unanimous: tuple[Mode, float] | None | bool = False  # cached verdict (False: stale)
        self._unlearned = 0  # steps in a row decided without F

    # ----- the KinematicSwitch interface -----
    def make_tracker(self, delta_scale: float | None = None) -> TrajectoryTracker:
        return TrajectoryTracker(self.kin_config, self.kin_stats, delta_scale)

    def mode(self, tracker: TrajectoryTracker) -> Decision:
        """This step's mode. F is computed only where it can change the decision (else the
        Decision's metric is None), and every `learn_every`-th such step so the bins keep learning."""
        if tracker.config is not self.kin_config or tracker.stats is not self.kin_stats:
            if (tracker.config, tracker.stats) != (self.kin_config, self.kin_stats):
                raise ValueError("tracker was built with another config or stats (use make_tracker)")
        unanimous = self.unanimous()
        if unanimous is not None and self._unlearned + 1 < self.config.learn_every:
            self._unlearned += 1
            return Decision(unanimous[0], None, unanimous[1])
        self._unlearned = 0
        metric = tracker.fused()
        mode, expected = self.decide(metric)
        return Decision(mode, metric, expected[mode])

    # ----- the rule -----
    def decide(self, metric: float | None) -> tuple[Mode, dict[Mode, float | None]]:
        """The cheaper mode at F = `metric` (None: window not full) and both expectations (ms)."""
        return self._decide(None if metric is None else self._bin(metric))

    def _decide(self, b: int | None) -> tuple[Mode, dict[Mode, float | None]]:
        return _cheapest({m: self._expected(m, b) for m in MODES})

    def unanimous(self) -> tuple[Mode, float] | None:
        """(mode, its expected ms before the window fills) when every case F could fall in (no F
        yet, each bin) picks that mode with both modes' estimates known, else None: F cannot change
        such a decision. Cached until the next `observe`."""
        if self._unanimous is False:
            self._unanimous = None
            # plain locals, no dicts: this runs every step, with the caches cold after the model's passes
            pieces_r, pieces_d = self._mode_pieces("retrieval"), self._mode_pieces("drafter")
            verdict: tuple[Mode, float] | None = None
            for b in self._cases:
                retrieval = _expected_ms("retrieval", *self._passes_in("retrieval", b), *pieces_r)
                drafter = _expected_ms("drafter", *self._passes_in("drafter", b), *pieces_d)
                if retrieval is None or drafter is None:
                    return None
                mode: Mode = "retrieval" if retrieval <= drafter else "drafter"  # as _cheapest
                ms = retrieval if mode == "retrieval" else drafter
                if verdict is not None and mode != verdict[0]:
                    return None
                verdict = verdict or (mode, ms)  # the first case is F = None
            self._unanimous = verdict
        return None if isinstance(self._unanimous, bool) else self._unanimous

    def expected_ms(self, mode: Mode, metric: float | None) -> float | None:
        """Expected decoding latency of `mode`; None while a piece it needs was never measured."""
        return self._expected(mode, None if metric is None else self._bin(metric))

    def _expected(self, mode: Mode, b: int | None) -> float | None:
        return _expected_ms(mode, *self._passes_in(mode, b), *self._mode_pieces(mode))

    def _passes_in(self, mode: Mode, b: int | None) -> tuple[int, float, float]:
        """(steps, summed passes, steps where the target ran) in bin `b` (None: all bins pooled)."""
        if b is None:  # before the window fills
            windows = [self._passes[(mode, i)] for i in range(self.config.bins)]
            return sum(len(w) for w in windows), sum(w.total for w in windows), sum(w.positive for w in windows)
        window = self._passes[(mode, b)]
        return len(window), window.total, window.positive

    def _mode_pieces(self, mode: Mode) -> tuple[float | None, float | None, float | None]:
        """(prefill, one verify pass, one proposal) of `mode`: moving medians."""
        pieces = self._pieces
        return pieces[_PREFILL[mode]].value, pieces[_VERIFY[mode]].value, pieces[_PROPOSE[mode]].value

    def observe(self, mode: Mode, metric: float | None, result: DecodeResult) -> None:
        """Learn from a decoded step (`DecodeResult`): its passes (in its F bin, when F was
        computed) and its measured pieces, unless a CUDA graph was captured since the last step."""
        t, forwards = result.timing, result.target_forwards
        if metric is not None:
            self._learn_passes(mode, self._bin(metric), forwards)
        self._unanimous = False
        seen, self._captures = self._captures, captures()
        if seen != self._captures:
            return
        pieces = self._pieces
        if forwards > 0:
            pieces[_PREFILL[mode]].add(t.prefill_ms)
        if forwards > 1:
            pieces[_VERIFY[mode]].add(t.verify_ms / (forwards - 1))
            if mode == "drafter":
                pieces["propose:drafter"].add(t.draft_ms / (forwards - 1))
        if mode == "retrieval":
            pieces["propose:retrieval"].add(t.draft_ms)

    def _learn_passes(self, mode: Mode, b: int, forwards: int) -> None:
        self._passes[(mode, b)].add(forwards)
        for other in self._staleness[b].seen(mode):
            if len(self._passes[(other, b)]):  # stale: forgotten, so the bin's next step tries it
                self._passes[(other, b)] = MovingMean(self.config.window)

    def _bin(self, metric: float) -> int:
        return bisect.bisect_right(self._edges, metric)


def _cheapest(expected: dict[Mode, float | None]) -> tuple[Mode, dict[Mode, float | None]]:
    """The first untried mode (no estimate), else the cheaper (ties: retrieval), and the expectations."""
    for mode in MODES:
        if expected[mode] is None:
            return mode, expected
    return min(MODES, key=lambda m: (expected[m], MODES.index(m))), expected


def _expected_ms(
    mode: Mode,
    count: int,
    total: float,
    positive: float,
    prefill: float | None,
    verify: float | None,
    proposal: float | None,
) -> float | None:
    """The formula (module docstring) from a bin's passes and the mode's piece costs; None while
    something it needs was never measured (e.g. a bin no calibration frame fell into)."""
    if not count or proposal is None:
        return None
    passes, runs = total / count, positive / count  # runs: P(the target runs)
    verifies = max(passes - runs, 0.0)
    if (prefill is None and runs > 0) or (verify is None and verifies > 0):
        return None
    proposals = verifies if mode == "drafter" else 1.0  # a drafter pass per verify; one query per step
    return runs * (prefill or 0.0) + verifies * (verify or 0.0) + proposals * proposal


def seed_passes(frames: dict[str, list], n_tokens: int) -> dict[Mode, np.ndarray]:
    """Target passes per calibration frame and mode, as the methods run them: retrieval 0 when
    the prefill skip fires, else n / tokens-per-forward (a verify-skip is 1); drafter n / tokens per forward."""
    tpf_r = np.asarray(frames["tokens_per_forward_retrieval"], dtype=np.float64)
    tpf_d = np.asarray(frames["tokens_per_forward_drafter"], dtype=np.float64)
    retrieval = n_tokens / tpf_r
    if "prefill_skipped" in frames:
        retrieval = np.where(np.asarray(frames["prefill_skipped"], dtype=bool), 0.0, retrieval)
    return {"retrieval": retrieval, "drafter": n_tokens / tpf_d}


def bin_seeds(
    metrics: np.ndarray, passes: dict[Mode, np.ndarray], edges: np.ndarray
) -> dict[tuple[Mode, int], tuple[int, float, float]]:
    """(frames, mean passes, share with a target pass) per (mode, F bin) over every calibration
    frame with F: order-free summaries (`MovingMean`'s seed)."""
    has_f = np.isfinite(metrics)
    bins = np.searchsorted(np.asarray(edges, dtype=np.float64), metrics[has_f], side="right")  # as _bin
    seeds: dict[tuple[Mode, int], tuple[int, float, float]] = {}
    for mode, values in passes.items():
        values = np.asarray(values, dtype=np.float64)[has_f]
        for b in np.unique(bins).tolist():
            in_bin = values[bins == b]
            seeds[(mode, int(b))] = (len(in_bin), float(in_bin.mean()), float((in_bin > 0).mean()))
    return seeds
