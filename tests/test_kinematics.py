"""Kinematic fused metric, trajectory tracker and hybrid switch on constructed paths."""

from __future__ import annotations

import json

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from heisd.kinematics import (
    CostAwareSwitch,
    KinematicConfig,
    KinematicStats,
    KinematicSwitch,
    TrajectoryTracker,
    calibrate_threshold,
    curvature_radius,
    fused_metric,
    path_length,
)
from heisd.kinematics.cost import seed_passes

CONFIG = KinematicConfig(alpha=0.5, window=15, r_cap=1.0, threshold=0.5)


def _tilted_circle(radius: float, n: int, arc: float, center=(0.1, -0.2, 0.3)) -> np.ndarray:
    """n points over `arc` radians of a circle in a plane tilted about two axes."""
    t = np.linspace(0.0, arc, n)
    flat = np.stack([radius * np.cos(t), radius * np.sin(t), np.zeros(n)], axis=1)
    a, b = 0.7, -0.4
    rx = np.array([[1, 0, 0], [0, np.cos(a), -np.sin(a)], [0, np.sin(a), np.cos(a)]])
    ry = np.array([[np.cos(b), 0, np.sin(b)], [0, 1, 0], [-np.sin(b), 0, np.cos(b)]])
    return flat @ (ry @ rx).T + np.asarray(center)


def _line(n: int, step: float, direction=(1.0, 2.0, -0.5)) -> np.ndarray:
    d = np.asarray(direction) / np.linalg.norm(direction)
    return np.array([0.2, 0.1, 0.05]) + step * np.arange(n)[:, None] * d


@pytest.fixture(scope="module")
def stats() -> KinematicStats:
    """Demonstrations mixing straight fast reaches and small slow circles."""
    rng = np.random.default_rng(0)
    trajs = [_line(40, 0.01 + 0.01 * rng.random()) for _ in range(4)]
    trajs += [_tilted_circle(0.02 + 0.05 * rng.random(), 40, np.pi) for _ in range(4)]
    return KinematicStats.fit(trajs, CONFIG)


def test_line_hits_the_cap() -> None:
    assert curvature_radius(_line(15, 0.01), r_cap=0.7) == 0.7
    assert path_length(_line(15, 0.01)) == pytest.approx(0.14)


@pytest.mark.parametrize("arc", [np.pi / 3, np.pi, 2 * np.pi * 14 / 15])
def test_circle_radius_in_tilted_plane(arc: float) -> None:
    points = _tilted_circle(0.05, 15, arc)
    assert curvature_radius(points, r_cap=1.0) == pytest.approx(0.05, rel=0.02)


def test_jitter() -> None:
    rng = np.random.default_rng(1)
    noisy_circle = _tilted_circle(0.05, 15, np.pi) + 2e-4 * rng.standard_normal((15, 3))
    assert curvature_radius(noisy_circle, r_cap=1.0) == pytest.approx(0.05, rel=0.05)
    jitter = np.array([0.3, 0.0, 0.2]) + 1e-3 * rng.standard_normal((15, 3))  # hovering in place
    radius = curvature_radius(jitter, r_cap=1.0)
    assert np.isfinite(radius) and radius < 0.01  # tiny, i.e. fine motion, never the cap


def test_standing_still(stats: KinematicStats) -> None:
    points = np.tile([0.1, 0.6, 0.2], (15, 1))
    assert path_length(points) == 0.0
    assert curvature_radius(points, r_cap=1.0) == 0.0  # no motion: leans to the drafter
    metric = fused_metric(points, stats, CONFIG)
    assert np.isfinite(metric) and metric == 0.0


def test_tracker_needs_a_full_window(stats: KinematicStats) -> None:
    tracker = KinematicSwitch(CONFIG, stats).make_tracker()
    points = _line(20, 0.02)
    for p in points[:14]:
        tracker.update(ee_pos=p)
        assert tracker.fused() is None
    tracker.update(ee_pos=points[14])
    assert tracker.fused() is not None
    tracker.update(ee_pos=points[15])  # a new position invalidates the cached F
    assert tracker.fused() == pytest.approx(fused_metric(points[1:16], stats, CONFIG))
    tracker.reset()
    assert tracker.fused() is None and len(tracker) == 0


@settings(max_examples=30, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), scale=st.floats(1e-4, 0.05), curl=st.floats(0.0, 1.0))
def test_incremental_tracker_equals_the_batch_metric(stats: KinematicStats, seed: int, scale: float,
                                                     curl: float) -> None:
    """The tracker's running sums give F equal to `fused_metric` over the same window, at every
    step of a long episode (the sums are rebuilt every window, so rounding does not drift)."""
    rng = np.random.default_rng(seed)
    steps = rng.normal(0, scale, size=(400, 3))
    for t in range(1, 400):  # some curl: circles of every radius, straight and still stretches
        steps[t] = curl * steps[t - 1] @ _rotation(rng.uniform(-0.5, 0.5)) + (1 - curl) * steps[t]
    steps[100:130] = 0.0  # standing still
    steps[200:240] = steps[200]  # a straight line
    path = np.array([0.3, -0.2, 0.1]) + np.cumsum(steps, axis=0)
    tracker = TrajectoryTracker(CONFIG, stats)
    for t, p in enumerate(path):
        tracker.update(ee_pos=p)
        expected = fused_metric(path[t - 14 : t + 1], stats, CONFIG) if t >= 14 else None
        got = tracker.fused()
        assert (got is None) == (expected is None)
        if expected is not None:
            assert got == pytest.approx(expected, abs=1e-9), t


def _rotation(angle: float) -> np.ndarray:
    c, s = np.cos(angle), np.sin(angle)
    return np.array([[c, -s, 0.0], [s, c, 0.0], [0.0, 0.0, 1.0]])


def test_tracker_integrates_delta_actions(stats: KinematicStats) -> None:
    switch = KinematicSwitch(CONFIG, stats)
    by_pos, by_delta = switch.make_tracker(), switch.make_tracker(delta_scale=0.01)
    points = _tilted_circle(0.04, 20, np.pi)
    by_delta.reset(points[0])
    by_pos.update(ee_pos=points[0])
    for prev, p in zip(points[:-1], points[1:]):
        by_pos.update(ee_pos=p)
        by_delta.update(delta=np.append((p - prev) / 0.01, 1.0))  # gripper value ignored
        f_pos, f_delta = by_pos.fused(), by_delta.fused()
    assert f_pos == pytest.approx(f_delta, abs=1e-9)
    with pytest.raises(ValueError, match="delta_scale"):
        by_pos.update(delta=np.zeros(4))


def test_switch_straight_fast_vs_small_slow_circle(stats: KinematicStats) -> None:
    switch = KinematicSwitch(CONFIG, stats)
    fast, slow = switch.make_tracker(), switch.make_tracker()
    assert switch.mode(fast)[:2] == ("drafter", None)  # no positions yet
    for p in _line(15, 0.03):
        fast.update(ee_pos=p)
    for p in _tilted_circle(0.015, 15, np.pi / 2):
        slow.update(ee_pos=p)
    mode, metric, expected = switch.mode(fast)
    assert mode == "retrieval" and metric == pytest.approx(1.0) and expected is None  # no cost model
    mode, metric, _ = switch.mode(slow)
    assert mode == "drafter" and metric < 0.1


@pytest.mark.parametrize("field, value", [("alpha", 1.5), ("alpha", -0.1), ("window", 2),
                                          ("threshold", -0.01), ("r_cap", 0.0)])
def test_bad_config_values_are_refused(field: str, value: float) -> None:
    with pytest.raises(ValueError, match=field):
        KinematicConfig(**{field: value})


def test_stats_json_round_trip(stats: KinematicStats) -> None:
    restored = KinematicStats.from_dict(json.loads(json.dumps(stats.to_dict())))
    assert restored == stats
    assert stats.r_min < stats.r_p95 <= CONFIG.r_cap and stats.d_min < stats.d_p95
    with pytest.raises(ValueError, match="window"):
        KinematicSwitch(KinematicConfig(window=10), stats)


def test_calibration_picks_the_obvious_threshold() -> None:
    # Retrieval wins (5 vs 2 tokens per forward) exactly on frames with F >= 0.6.
    metrics = np.linspace(0.0, 1.0, 51)
    tokens_per_forward_retrieval = np.where(metrics >= 0.6, 5.0, 1.2)
    tokens_per_forward_drafter = np.full_like(metrics, 2.0)
    assert calibrate_threshold(metrics, tokens_per_forward_retrieval, tokens_per_forward_drafter) == pytest.approx(0.6)
    assert calibrate_threshold(metrics, np.ones(51), tokens_per_forward_drafter) > metrics.max()  # never retrieve
    assert calibrate_threshold(metrics, np.full(51, 3.0), tokens_per_forward_drafter) == 0.0  # always retrieve
    with pytest.raises(ValueError):
        calibrate_threshold(metrics, tokens_per_forward_retrieval[:-1], tokens_per_forward_drafter)


@settings(max_examples=60, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(seed=st.integers(0, 2**32 - 1), scale=st.floats(1e-6, 1.0), still=st.integers(0, 14),
       alpha=st.floats(0.0, 1.0))
def test_metric_is_the_weighted_sum_of_its_parts(stats: KinematicStats, seed: int, scale: float,
                                                 still: int, alpha: float) -> None:
    """F = alpha Norm(R) + (1 - alpha) Norm(D), each part recomputed here from its definition."""
    rng = np.random.default_rng(seed)
    points = np.cumsum(scale * rng.standard_normal((15, 3)), axis=0)
    points[:still] = points[still]  # a stretch without motion
    config = KinematicConfig(alpha=alpha, window=15, r_cap=1.0, threshold=0.5)
    norm = lambda v, lo, hi: min(max((v - lo) / (hi - lo), 0.0), 1.0)  # noqa: E731
    norm_r = norm(curvature_radius(points, 1.0), stats.r_min, stats.r_p95)
    norm_d = norm(np.linalg.norm(np.diff(points, axis=0), axis=1).sum(), stats.d_min, stats.d_p95)
    assert fused_metric(points, stats, config) == pytest.approx(alpha * norm_r + (1 - alpha) * norm_d, abs=1e-12)
    rotation, _ = np.linalg.qr(rng.standard_normal((3, 3)))
    moved = points @ rotation.T + rng.standard_normal(3)
    assert curvature_radius(moved, 1.0) == pytest.approx(curvature_radius(points, 1.0),
                                                         rel=1e-6, abs=1e-9)


def test_alpha_weighs_radius_against_path_length(stats: KinematicStats) -> None:
    # a big slow arc: a large radius over a short path, so alpha and 1 - alpha pull apart
    arc = _tilted_circle(0.5, 15, 0.02)  # radius 0.5, 1 cm of path
    norm_r = (0.5 - stats.r_min) / (stats.r_p95 - stats.r_min)
    radius_only = fused_metric(arc, stats, KinematicConfig(alpha=1.0, window=15, r_cap=1.0))
    length_only = fused_metric(arc, stats, KinematicConfig(alpha=0.0, window=15, r_cap=1.0))
    assert radius_only == pytest.approx(norm_r, rel=0.02) and norm_r > 0.3
    assert length_only < 0.05
    quarter = fused_metric(arc, stats, KinematicConfig(alpha=0.25, window=15, r_cap=1.0))
    assert quarter == pytest.approx(0.25 * radius_only + 0.75 * length_only)


def test_refinement_reaches_the_geometric_fit() -> None:
    # On a short noisy arc Kasa's algebraic center is biased; the refinement lowers the
    # geometric cost sum (|p - c| - r)^2 step by step.
    from heisd.kinematics.metric import _kasa_center, _refine_center

    def cost(xy, c):
        d = np.linalg.norm(xy - c, axis=1)
        return float(((d - d.mean()) ** 2).sum())

    rng = np.random.default_rng(3)
    t = np.linspace(0.0, np.pi / 5, 15)
    xy = 0.1 * np.stack([np.cos(t), np.sin(t)], axis=1) + 3e-3 * rng.standard_normal((15, 2))
    kasa = _kasa_center(xy)
    costs = [cost(xy, _refine_center(xy, kasa, i)) for i in range(11)]
    assert all(b <= a + 1e-15 for a, b in zip(costs, costs[1:]))  # a descent method
    assert costs[10] < 0.99 * costs[0]
    # from a wrong start on a clean half circle it walks to the true center
    t = np.linspace(0.0, np.pi, 15)
    clean = 0.1 * np.stack([np.cos(t), np.sin(t)], axis=1) + np.array([0.3, -0.2])
    center = _refine_center(clean, np.array([0.32, -0.17]), 300)
    np.testing.assert_allclose(center, [0.3, -0.2], atol=1e-6)


# ----- cost-aware switch -----
def _frames(n: int = 8) -> dict:
    """Calibration frames: F from 0 to 1; retrieval drafts pay off on fast motion (high F) only,
    the drafter gives 2 tokens per forward everywhere."""
    f = np.linspace(0.0, 1.0, 40)
    return {"F": f.tolist(), "tokens_per_forward_retrieval": np.where(f >= 0.5, float(n), 1.0).tolist(),
            "tokens_per_forward_drafter": [2.0] * 40, "prefill_skipped": [False] * 40}


def _step(mode_forwards: int, prefill: float, verify_each: float, draft: float):
    from heisd.decoding import DecodeResult, Timing

    timing = Timing(prefill_ms=prefill, draft_ms=draft, verify_ms=verify_each * max(mode_forwards - 1, 0))
    return DecodeResult([0] * 8, mode_forwards, accepted_lengths=[], draft_depths=[], skipped_tokens=0, deviation=0,
                        timing=timing)


@pytest.mark.parametrize("drafter_pass_ms, slow_motion_mode", [(0.2, "drafter"), (30.0, "retrieval")])
def test_cost_switch_sends_slow_motion_where_it_is_cheaper(stats, drafter_pass_ms, slow_motion_mode) -> None:
    """GPU-like costs (a drafter pass is cheap next to a target pass): slow motion goes to the drafter;
    CPU-like costs (a drafter pass costs more than the pass it saves): retrieval everywhere."""
    switch = CostAwareSwitch(CONFIG, stats, _frames(), n_tokens=8)
    assert switch.decide(0.9)[0] == "retrieval"  # nothing measured yet: try retrieval first ...
    switch.observe("retrieval", 0.9, _step(1, prefill=10.0, verify_each=10.0, draft=0.3))
    assert switch.decide(0.9)[0] == "drafter"  # ... then the drafter, whose pieces are unmeasured
    switch.observe("drafter", 0.1, _step(4, prefill=10.0, verify_each=10.0, draft=3 * drafter_pass_ms))
    switch.observe("retrieval", 0.1, _step(8, prefill=10.0, verify_each=10.0, draft=0.3))
    assert switch.decide(0.9)[0] == "retrieval"  # fast motion: one pass
    mode, expected = switch.decide(0.1)
    assert mode == slow_motion_mode
    # the formula, by hand: drafter at F=0.1: 4 passes (n / tokens per forward) = prefill + 3 verifies + 3 drafter passes
    assert expected["drafter"] == pytest.approx(10.0 + 3 * 10.0 + 3 * drafter_pass_ms)
    assert expected["retrieval"] == pytest.approx(10.0 + 7 * 10.0 + 0.3, rel=0.1)


def test_cost_switch_learns_the_passes_it_observes(stats) -> None:
    switch = CostAwareSwitch(CONFIG, stats, _frames(), n_tokens=8)
    for mode in ("retrieval", "drafter"):
        switch.observe(mode, 0.2, _step(2, prefill=10.0, verify_each=10.0, draft=1.0))
    before = switch.expected_ms("retrieval", 0.1)
    for _ in range(64):  # retrieval turns out to need one verify pass at slow motion too
        switch.observe("retrieval", 0.1, _step(2, prefill=10.0, verify_each=10.0, draft=1.0))
    after = switch.expected_ms("retrieval", 0.1)
    assert after == pytest.approx(10.0 + 10.0 + 1.0) and after < before
    assert switch.expected_ms("retrieval", None) is not None  # before the window fills: pooled over bins


def test_a_step_that_captured_a_cuda_graph_prices_no_mode(stats, monkeypatch) -> None:
    """The drafter's first step under --cuda-graphs captures its pass shapes, many times a pass:
    priced by it, the drafter would look too slow to be tried again."""
    from heisd import cuda_graphs

    switch = CostAwareSwitch(CONFIG, stats, _frames(), n_tokens=8)
    switch.observe("retrieval", 0.9, _step(1, prefill=10.0, verify_each=10.0, draft=0.3))
    monkeypatch.setattr(cuda_graphs, "_captures", cuda_graphs.captures() + 3)
    switch.observe("drafter", 0.1, _step(4, prefill=300.0, verify_each=300.0, draft=90.0))
    assert switch.expected_ms("drafter", 0.1) is None and switch.decide(0.9)[0] == "drafter"  # still untried
    switch.observe("drafter", 0.1, _step(4, prefill=10.0, verify_each=10.0, draft=0.6))
    assert switch.expected_ms("drafter", 0.1) == pytest.approx(10.0 + 3 * 10.0 + 0.6)


def test_cost_switch_retries_a_mode_not_run_in_a_bin_for_retry_after_steps(stats) -> None:
    """The lock-in of BENCHMARKS.md 18.15: slow motion went to the drafter after retrieval looked
    dear there, and retrieval was never tried there again. After `retry_after` drafter steps in the
    bin, retrieval's estimate there (its calibration seed included) is forgotten and it runs the
    bin's next step; other bins keep theirs."""
    from heisd.kinematics import CostSwitchConfig

    switch = CostAwareSwitch(CONFIG, stats, _frames(), n_tokens=8, config=CostSwitchConfig(retry_after=5))
    switch.observe("retrieval", 0.9, _step(2, prefill=10.0, verify_each=10.0, draft=0.3))
    switch.observe("drafter", 0.9, _step(4, prefill=10.0, verify_each=10.0, draft=0.6))
    # the seed: retrieval drafts 1 token per forward at F < 0.5 (8 passes), the drafter 2 (4 passes)
    assert switch.decide(0.1)[0] == "drafter" and switch._passes_in("retrieval", 0)[0] == 10
    for step in range(5):
        switch.observe("drafter", 0.1, _step(4, prefill=10.0, verify_each=10.0, draft=0.6))
        assert switch.decide(0.1)[0] == ("drafter" if step < 4 else "retrieval")
    assert switch.expected_ms("retrieval", 0.1) is None and switch.unanimous() is None  # F is computed again
    assert switch._passes_in("retrieval", 1)[0] > 0  # the other bins keep their estimates
    switch.observe("retrieval", 0.1, _step(2, prefill=10.0, verify_each=10.0, draft=0.3))  # cheaper now
    assert switch.expected_ms("retrieval", 0.1) == pytest.approx(10.0 + 10.0 + 0.3)
    assert switch.decide(0.1)[0] == "retrieval"
    with pytest.raises(ValueError, match="retry_after must be >= 1"):
        CostSwitchConfig(retry_after=0)


def test_cost_switch_with_an_empty_bin_tries_the_mode_there(stats) -> None:
    """Calibration F all equal (a straight demonstration path): the quantile edges coincide and
    every bin but one is empty; a step in an empty bin tries a mode instead of failing."""
    frames = {**_frames(), "F": [0.5] * 40}
    switch = CostAwareSwitch(CONFIG, stats, frames, n_tokens=8)
    assert switch.expected_ms("retrieval", 0.0) is None
    assert switch.decide(0.0)[0] == "retrieval"


def test_cost_switch_counts_prefill_skips_as_no_target_pass(stats) -> None:
    frames = {**_frames(), "prefill_skipped": [True] * 40}
    switch = CostAwareSwitch(CONFIG, stats, frames, n_tokens=8)
    switch.observe("retrieval", 0.9, _step(0, prefill=0.0, verify_each=0.0, draft=0.5))
    switch.observe("drafter", 0.9, _step(2, prefill=10.0, verify_each=10.0, draft=1.0))
    assert switch.expected_ms("retrieval", 0.9) == pytest.approx(0.5)  # the query only: no prefill, no verify
    assert switch.decide(0.9)[0] == "retrieval" and switch.expected_ms("drafter", 0.9) > 10.0


def test_cost_switch_seeds_do_not_depend_on_frame_order(stats) -> None:
    """512 frames, 128 per F bin (more than a bin's 64-step window), grouped by task as a
    calibration file is: every order gives each bin the mean over all its frames."""
    rng = np.random.default_rng(0)
    tasks = np.repeat(np.arange(8), 64)  # 8 tasks in file order; later tasks retrieve better
    f = rng.uniform(0.0, 1.0, 512)
    frames = {"F": f.tolist(), "tokens_per_forward_retrieval": (1.0 + tasks * rng.uniform(0.5, 1, 512)).tolist(),
              "tokens_per_forward_drafter": rng.uniform(1.0, 4.0, 512).tolist(),
              "prefill_skipped": (rng.uniform(size=512) < 0.1).tolist()}
    shuffled = rng.permutation(512)
    reordered = {key: [values[i] for i in shuffled] for key, values in frames.items()}
    switches = [CostAwareSwitch(CONFIG, stats, fr, n_tokens=8) for fr in (frames, reordered)]
    np.testing.assert_allclose(switches[0].edges, switches[1].edges)
    passes = seed_passes(frames, 8)
    for mode in ("retrieval", "drafter"):
        for b in range(4):
            a, c = switches[0]._passes_in(mode, b), switches[1]._passes_in(mode, b)
            assert a[0] == c[0] == 64 and a[1:] == pytest.approx(c[1:])  # the seed fills the window
            in_bin = passes[mode][np.searchsorted(switches[0].edges, f, side="right") == b]
            assert len(in_bin) > 64 and a[1] / a[0] == pytest.approx(in_bin.mean())
            assert a[2] / a[0] == pytest.approx((in_bin > 0).mean())
    # each observed step displaces one seeded slot: 64 steps replace the seed
    switch = switches[0]
    for _ in range(64):
        switch.observe("retrieval", 0.01, _step(3, prefill=1.0, verify_each=1.0, draft=0.1))
        assert switch._passes_in("retrieval", 0)[0] == 64
    assert switch._passes_in("retrieval", 0) == (64, 3.0 * 64, 64)


def _mixed_path(steps: int) -> np.ndarray:
    """Two env steps per control step: straight fast stretches alternating with small slow circles."""
    pieces, start = [], np.zeros(3)
    for k in range(0, 2 * steps, 30):
        seg = _line(30, 0.03) if (k // 30) % 2 == 0 else _tilted_circle(0.015, 30, np.pi)
        seg = seg - seg[0] + start
        pieces.append(seg)
        start = seg[-1]
    return np.concatenate(pieces)[: 2 * steps]


def _retrieval_verify_ms(step: int) -> float:
    """Retrieval's verify passes turn expensive for a while (slow motion then pays on the drafter), then cheap again."""
    return 50.0 if 150 <= step < 300 else 10.0


def test_cost_switch_computes_f_only_where_it_can_change_the_decision(stats, monkeypatch) -> None:
    """Fed the same steps, a switch that skips F where every bin agrees decides exactly as one that
    computes F every step, and computes F far less often where the drafter does not pay."""
    from heisd.kinematics import CostSwitchConfig
    from heisd.kinematics import metric as metric_module

    exact_metric, computed, calls = metric_module.fused_metric, metric_module.TrajectoryTracker._compute, []
    monkeypatch.setattr(metric_module.TrajectoryTracker, "_compute", lambda self: calls.append(1) or computed(self))
    # no retries: they count a bin's steps with F, which the lazy switch sees fewer of (it retries later)
    lazy = CostAwareSwitch(CONFIG, stats, _frames(), n_tokens=8, config=CostSwitchConfig(learn_every=8,
                                                                                        retry_after=10**6))
    eager = CostAwareSwitch(CONFIG, stats, _frames(), n_tokens=8, config=CostSwitchConfig(learn_every=1,
                                                                                         retry_after=10**6))
    trackers = {"lazy": lazy.make_tracker(), "eager": eager.make_tracker()}
    path, counts, modes = _mixed_path(450), {"lazy": 0, "eager": 0}, []
    for step in range(450):
        window = path[max(0, 2 * step - 13): 2 * step + 2]
        truth = exact_metric(window, stats, CONFIG) if len(window) == 15 else None
        decisions = {}
        for name, switch in (("lazy", lazy), ("eager", eager)):
            for p in path[2 * step: 2 * step + 2]:
                trackers[name].update(ee_pos=p)
            before = len(calls)
            decisions[name] = switch.mode(trackers[name])
            counts[name] += len(calls) > before
        assert decisions["lazy"].mode == decisions["eager"].mode, step
        assert decisions["eager"].metric == pytest.approx(truth, abs=1e-9)
        assert decisions["lazy"].metric is None or decisions["lazy"].metric == pytest.approx(truth, abs=1e-9)
        mode = decisions["lazy"].mode
        modes.append(mode)
        slow = truth is not None and truth < 0.5
        if mode == "drafter":
            result = _step(4, prefill=10.0, verify_each=10.0, draft=3 * 30.0)
        else:
            result = _step(6 if slow else 2, prefill=10.0, verify_each=_retrieval_verify_ms(step), draft=0.3)
        for switch in (lazy, eager):  # both learn the same thing: only the decision rule is compared
            switch.observe(mode, truth, result)
    assert "drafter" in modes[150:300] and "retrieval" in modes[150:300]  # F mattered there ...
    assert set(modes[100:150]) == set(modes[400:]) == {"retrieval"}  # ... not here
    assert counts["eager"] == 450 - 7  # every step once the window is full (7 steps to fill it)
    assert counts["lazy"] < 0.6 * counts["eager"]


def test_cost_switch_skips_f_while_every_bin_agrees(stats, monkeypatch) -> None:
    """With retrieval cheaper in every bin, F is computed on one step in `learn_every` only (its
    passes go to their bin); the other steps record no F and the pooled expectation."""
    from heisd.kinematics import CostSwitchConfig
    from heisd.kinematics import metric as metric_module

    computed, calls = metric_module.TrajectoryTracker._compute, []
    monkeypatch.setattr(metric_module.TrajectoryTracker, "_compute", lambda self: calls.append(1) or computed(self))
    switch = CostAwareSwitch(CONFIG, stats, _frames(), n_tokens=8, config=CostSwitchConfig(learn_every=4))
    switch.observe("retrieval", 0.9, _step(2, prefill=10.0, verify_each=10.0, draft=0.3))
    switch.observe("drafter", 0.1, _step(4, prefill=10.0, verify_each=10.0, draft=90.0))
    assert switch.unanimous() == ("retrieval", switch.expected_ms("retrieval", None))
    tracker = switch.make_tracker()
    for p in _line(15, 0.03):
        tracker.update(ee_pos=p)
    decisions = [switch.mode(tracker) for _ in range(8)]
    assert [d.mode for d in decisions] == ["retrieval"] * 8
    assert [d.metric is None for d in decisions] == [True, True, True, False] * 2
    assert len(calls) == 1  # the tracker caches F until it moves
    assert decisions[0].expected_ms == pytest.approx(switch.expected_ms("retrieval", None))
