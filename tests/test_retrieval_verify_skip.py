"""Adaptive verify-skip: the skip decision, online theta updates with persistence, and the
offline calibration of theta."""

from __future__ import annotations

import logging
import shutil

import faiss
import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from test_retrieval_build import built  # noqa: F401  (a fixture)

from heisd.decoding import ActionVocab, DecodeState, GroupRelaxedAcceptance
from heisd.retrieval import Datastore
from heisd.retrieval.verify_skip import (NEVER_SKIP, PrefillSkip, VerifySkip, calibrate_theta, cosine, draft_passes,
                                         wilson_lower_bound)

torch.set_num_threads(1)
faiss.omp_set_num_threads(1)

VOCAB = ActionVocab(1000, 256)  # action ids 744..999; bin b = token 999 - b
RULE = GroupRelaxedAcceptance([[0, 1, 2], [3], [4, 5, 6], [7]], max_sum=30, max_dev=15, exact_groups=[1, 3])


class Cache:
    pass


def state(emitted: list[int], prefill_hidden: torch.Tensor) -> DecodeState:
    return DecodeState(emitted, 8, prefill_hidden[None], prefill_hidden, None, Cache(), {})


def test_skip_needs_similarity_and_the_free_first_token() -> None:
    h = torch.tensor([1.0, 2.0, 3.0])
    seq = [900, 901, 902, 903, 904, 905, 906, 907]
    skip = VerifySkip(theta=0.9)
    proposal = skip.proposal(state([900], h), h.numpy() * 2, seq, VOCAB)
    assert proposal.skip_verify and proposal.tree.is_chain() and proposal.tree.tokens.tolist() == seq[1:]
    assert skip.last_similarity == pytest.approx(1.0)
    assert skip.proposal(state([899], h), h.numpy(), seq, VOCAB) is None  # guard: first token differs
    assert skip.proposal(state([900], h), np.array([3.0, -2.0, 1.0]), seq, VOCAB) is None  # dissimilar
    assert skip.proposal(state([900], h), h.numpy(), seq[:7] + [5], VOCAB) is None  # non-action token
    assert cosine(h, -h.numpy()) == -1.0 and cosine(h, np.zeros(3)) == 0.0


def test_online_update_clips_in_memory_and_leaves_the_datastore_alone(built, tmp_path) -> None:
    shutil.copytree(built["store"], tmp_path / "store")
    manifest = (tmp_path / "store" / "manifest.json").read_bytes()
    store = Datastore.load(tmp_path / "store")
    fresh = VerifySkip.from_datastore(store)
    assert fresh.theta == NEVER_SKIP and fresh.source == {}  # never calibrated: never skip
    skip = VerifySkip(0.8, eta=0.05, theta_floor=0.7)
    assert skip.update(success=False) == pytest.approx(0.9)
    assert skip.update(success=True) == pytest.approx(0.85)
    for _ in range(10):
        skip.update(success=True)
    assert skip.theta == pytest.approx(0.7)  # floor
    for _ in range(10):
        skip.update(success=False)
    assert skip.theta == 1.0 and skip.state() == {"theta": 1.0, "updates": 22}  # ceiling
    record = {"theta": 0.97, "calibrated_theta": 0.96, "support": {"skipped": 60, "passed": 60}}
    store.update_extras({"verify_skip": record})
    adapted = VerifySkip.from_datastore(store)
    assert adapted.theta == 0.97 and adapted.theta_floor == 0.96  # never below the calibration
    assert adapted.source == record
    for _ in range(5):
        adapted.update(success=True)
    assert adapted.theta == pytest.approx(0.96)
    assert Datastore.load(tmp_path / "store").extras["verify_skip"]["theta"] == 0.97  # updates stay in memory
    restored = VerifySkip.from_datastore(store)
    restored.restore(adapted.state())
    assert restored.state() == adapted.state()
    pre = PrefillSkip.from_datastore(Datastore.load(built["store"]))
    pre.update(success=True)
    assert (built["store"] / "manifest.json").read_bytes() == manifest  # a run never writes the datastore


def test_prefill_skip_needs_key_similarity_and_a_whole_action() -> None:
    seq = [900, 901, 902, 903, 904, 905, 906, 907]
    pre = PrefillSkip(theta=0.9)
    assert pre.tokens(0.95, np.array(seq), VOCAB) == seq and pre.last_similarity == 0.95
    assert pre.tokens(0.9, seq, VOCAB) == seq  # theta itself skips
    assert pre.tokens(0.89, seq, VOCAB) is None
    assert pre.tokens(0.99, seq[:7] + [5], VOCAB) is None  # a non-action token is never emitted blind
    assert PrefillSkip(NEVER_SKIP).tokens(1.0, seq, VOCAB) is None
    assert PrefillSkip(NEVER_SKIP).tokens(np.float32(1.0000001), seq, VOCAB) is None  # float32 rounding


def empirical_theta(s, ok, precision: float = 0.95) -> float:
    """The plain observed-precision rule: no minimum support, no confidence bound."""
    return calibrate_theta(s, ok, precision, min_support=1, confidence=0.5).theta


def test_calibrate_theta_on_constructed_data() -> None:
    s = np.array([0.99, 0.98, 0.97, 0.96, 0.95, 0.94, 0.90, 0.80])
    ok = np.array([1, 1, 1, 1, 0, 1, 0, 0], dtype=bool)
    # precision of "s >= theta": 1, 1, 1, 1, 0.8, 0.83, 0.71, 0.625
    assert empirical_theta(s, ok, 0.95) == 0.96
    assert empirical_theta(s, ok, 0.8) == 0.94
    assert empirical_theta(s, ok, 0.6) == 0.80
    assert empirical_theta(s, np.ones(8, bool)) == 0.80  # everything passes: skip everything
    assert empirical_theta(s, np.zeros(8, bool)) == NEVER_SKIP > 1.0
    assert empirical_theta([], []) == NEVER_SKIP
    # ties: a theta skips every tied frame, so [0.9 pass, 0.9 fail] reaches only 0.5
    assert empirical_theta([0.95, 0.9, 0.9], [True, True, False], 0.9) == 0.95
    with pytest.raises(ValueError):
        calibrate_theta([0.9], [True, False])


def test_one_passing_frame_supports_no_skip() -> None:
    """The issue's case: the top frame alone has precision 1, which the plain rule accepted."""
    assert empirical_theta([0.99, 0.9, 0.8], [True, False, False]) == 0.99
    fit = calibrate_theta([0.99, 0.9, 0.8], [True, False, False])
    assert fit.theta == NEVER_SKIP and fit.skipped == 0 and fit.lower_bound is None
    assert "3 held-out frames can skip" in fit.reason and "below 0.95" in fit.reason


def test_a_large_clean_sample_supports_a_skip() -> None:
    rng = np.random.default_rng(0)
    s = rng.uniform(0.5, 1.0, 400)
    ok = s > 0.7  # drafts pass exactly above 0.7
    fit = calibrate_theta(s, ok, 0.95)
    # a few failures below 0.7 still fit under the bound; the plain rule lets in more of them
    assert fit.reason is None and empirical_theta(s, ok) < fit.theta < 0.7
    skipped = s >= fit.theta
    assert fit.skipped == skipped.sum() >= 20 and fit.passed == ok[skipped].sum()
    assert fit.lower_bound == pytest.approx(wilson_lower_bound(fit.passed, fit.skipped)) and fit.lower_bound >= 0.95
    # 52 clean frames are the fewest whose 95% bound reaches 0.95 (n / (n + 1.645^2) >= 0.95)
    assert calibrate_theta(np.linspace(0.9, 1, 52), np.ones(52, bool)).theta == 0.9
    assert calibrate_theta(np.linspace(0.9, 1, 51), np.ones(51, bool)).theta == NEVER_SKIP
    # the minimum support binds on its own: 10 clean frames at a low precision target
    assert calibrate_theta(np.linspace(0.9, 1, 10), np.ones(10, bool), 0.5).theta == NEVER_SKIP
    assert calibrate_theta(np.linspace(0.9, 1, 10), np.ones(10, bool), 0.5, min_support=10).theta == 0.9


def test_wilson_lower_bound_is_monotone() -> None:
    n = np.arange(1, 200)
    for rate in (0.5, 0.9, 1.0):  # more frames at the same rate: a tighter (higher) bound
        bound = wilson_lower_bound(np.round(rate * n), n)
        assert np.all(np.diff(bound[n % 10 == 0]) > 0) and np.all(bound <= rate + 1e-12)
    bound = wilson_lower_bound(np.arange(0, 51), 50)  # more passes of the same frames: higher
    assert np.all(np.diff(bound) > 0) and bound[0] == 0.0
    # a higher confidence: a lower bound; 0.5: the observed rate
    assert wilson_lower_bound(45, 50, 0.99) < wilson_lower_bound(45, 50, 0.95) < wilson_lower_bound(45, 50, 0.5)
    assert wilson_lower_bound(45, 50, 0.5) == pytest.approx(0.9)
    assert wilson_lower_bound(0, 0) == 0.0


def test_an_older_calibration_is_rechecked_on_its_stored_frames(built, tmp_path, caplog) -> None:
    """Records without a stored support (older calibrations): their theta is kept only if the
    stored frames support it under today's rule; else never skip, and the log says why."""
    shutil.copytree(built["store"], tmp_path / "store")
    store = Datastore.load(tmp_path / "store")
    sims = np.linspace(0.9, 1.0, 80)
    frames = {"similarity": sims.tolist(), "passes": [True] * 80, "guard": [True] * 80,
              "key_similarity": sims.tolist(), "passes_full": [i % 2 == 0 for i in range(80)]}
    store.update_extras({"calibration_frames": frames,
                         "verify_skip": {"theta": 0.95, "calibrated_theta": 0.93, "precision_target": 0.95},
                         "prefill_skip": {"theta": 0.95, "calibrated_theta": 0.93, "precision_target": 0.95}})
    with caplog.at_level(logging.INFO, logger="heisd"):
        kept = VerifySkip.from_datastore(store)
        dropped = PrefillSkip.from_datastore(store)
    assert kept.theta == 0.95 and kept.theta_floor == 0.93
    assert dropped.theta == dropped.theta_floor == NEVER_SKIP
    assert "verify_skip: calibrated before support was stored; theta 0.9300 is kept (56/56" in caplog.text
    assert "prefill_skip: calibrated before support was stored and theta 0.9300 is not supported" in caplog.text
    dropped.update(success=True)  # online updates keep an unsupported skip off
    assert dropped.theta == NEVER_SKIP and dropped.tokens(1.0, [900] * 8, VOCAB) is None


@settings(max_examples=100, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 20), st.booleans()), min_size=1, max_size=30),
       st.sampled_from([0.5, 0.8, 0.95, 1.0]))
def test_calibrate_theta_is_the_smallest_precise_threshold(frames, precision) -> None:
    s = np.array([f[0] / 20 for f in frames])
    ok = np.array([f[1] for f in frames])

    def precise(theta: float) -> bool:
        return ok[s >= theta].mean() >= precision - 1e-9

    theta = empirical_theta(s, ok, precision)
    candidates = sorted(set(s.tolist()))
    if theta == NEVER_SKIP:
        assert not any(precise(c) for c in candidates)
    else:
        assert precise(theta) and not any(precise(c) for c in candidates if c < theta)


def test_draft_passes_is_the_group_rule() -> None:
    greedy = [999 - 100] * 8
    assert draft_passes(greedy, greedy, RULE, VOCAB)
    near = [999 - b for b in (100, 110, 115, 100, 85, 100, 100, 100)]  # group sums 25, 0, 15, 0
    assert draft_passes(near, greedy, RULE, VOCAB)
    assert not draft_passes([999 - 116] + greedy[1:], greedy, RULE, VOCAB)  # one token 16 bins off
    assert not draft_passes(greedy[:4] + [999 - 111] * 3 + greedy[7:], greedy, RULE, VOCAB)  # sum 33
    assert not draft_passes(greedy[:7] + [999 - 101], greedy, RULE, VOCAB)  # gripper off by one
