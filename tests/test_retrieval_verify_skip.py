"""Adaptive verify-skip: the skip decision, online theta updates with persistence, and the
offline calibration of theta."""

from __future__ import annotations

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
from heisd.retrieval.verify_skip import NEVER_SKIP, PrefillSkip, VerifySkip, calibrate_theta, cosine, draft_passes

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
    store.update_extras({"verify_skip": {"theta": 0.97, "calibrated_theta": 0.96}})
    adapted = VerifySkip.from_datastore(store)
    assert adapted.theta == 0.97 and adapted.theta_floor == 0.96  # never below the calibration
    assert adapted.source == {"theta": 0.97, "calibrated_theta": 0.96}
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


def test_calibrate_theta_on_constructed_data() -> None:
    s = np.array([0.99, 0.98, 0.97, 0.96, 0.95, 0.94, 0.90, 0.80])
    ok = np.array([1, 1, 1, 1, 0, 1, 0, 0], dtype=bool)
    # precision of "s >= theta": 1, 1, 1, 1, 0.8, 0.83, 0.71, 0.625
    assert calibrate_theta(s, ok, 0.95) == 0.96
    assert calibrate_theta(s, ok, 0.8) == 0.94
    assert calibrate_theta(s, ok, 0.6) == 0.80
    assert calibrate_theta(s, np.ones(8, bool)) == 0.80  # everything passes: skip everything
    assert calibrate_theta(s, np.zeros(8, bool)) == NEVER_SKIP > 1.0
    assert calibrate_theta([], []) == NEVER_SKIP
    # ties: a theta skips every tied frame, so [0.9 pass, 0.9 fail] reaches only 0.5
    assert calibrate_theta([0.95, 0.9, 0.9], [True, True, False], 0.9) == 0.95
    with pytest.raises(ValueError):
        calibrate_theta([0.9], [True, False])


@settings(max_examples=100, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 20), st.booleans()), min_size=1, max_size=30),
       st.sampled_from([0.5, 0.8, 0.95, 1.0]))
def test_calibrate_theta_is_the_smallest_precise_threshold(frames, precision) -> None:
    s = np.array([f[0] / 20 for f in frames])
    ok = np.array([f[1] for f in frames])

    def precise(theta: float) -> bool:
        return ok[s >= theta].mean() >= precision - 1e-9

    theta = calibrate_theta(s, ok, precision)
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
