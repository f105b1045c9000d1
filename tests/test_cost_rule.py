"""The cost rule shared by the retrieval fallback and the drafter's tree size: the choice from
measured costs, untried options first, and that its choices never change lossless tokens."""

from __future__ import annotations

import pytest
import torch
from helpers import save_tiny_drafter, tiny_vla, write_demo_file

from heisd.decoding.cost_rule import OptionCosts
from heisd.decoding.moving import MovingMean, MovingMedian, Staleness
from heisd.runtime.methods import MethodConfig, build_decoders
from heisd.runtime.policy import VLAPolicy
from heisd.runtime.replay import replay

torch.set_num_threads(1)


def test_moving_statistics_track_the_latest_window() -> None:
    mean, median = MovingMean(3), MovingMedian(3)
    assert median.value is None and len(mean) == 0
    for v in (0.0, 4.0, 1.0, 2.0, 9.0):
        mean.add(v)
        median.add(v)
    # the window holds 1, 2, 9
    assert (len(mean), mean.total, mean.positive) == (3, 12.0, 3)
    assert median.value == 2.0
    mean.add(0.0)  # 2, 9, 0
    assert (mean.total, mean.positive) == (11.0, 2)


def test_staleness_names_the_keys_unseen_for_after_events() -> None:
    clock = Staleness(["a", "b", "c"], after=3)
    assert clock.seen("a") == []  # event 1: b and c last seen at 0
    assert clock.seen("a") == []
    assert clock.seen("b") == ["c"]  # event 3: c unseen for 3 events, a for 1
    assert clock.seen("b") == ["c"]
    assert clock.seen("b") == ["a", "c"]  # event 5: a unseen for 3 events too


def test_untried_options_first_in_order_then_the_cheapest() -> None:
    costs = OptionCosts("fallback", ["ar", "jacobi", "drafter"])
    assert costs.choose() == ("ar", None)
    costs.record("ar", passes=6, tokens=6, ms=6 * 1.0)  # 1 pass per token at 1.0 ms
    assert costs.choose() == ("jacobi", None)
    costs.record("jacobi", passes=2, tokens=6, ms=2 * 1.5)  # 1/3 pass per token at 1.5 ms: 0.5 ms per token
    assert costs.choose() == ("drafter", None)
    costs.record("drafter", passes=3, tokens=6, ms=3 * 4.0)  # 2 ms per token
    option, per_token = costs.choose()
    assert option == "jacobi" and per_token == pytest.approx(0.5)
    for _ in range(3):  # Jacobi turns out slower: 1 pass per token at 1.6 ms (the median moves)
        costs.record("jacobi", passes=6, tokens=6, ms=6 * 1.6)
    assert costs.choose()[0] == "ar"
    costs.record("ar", passes=1, tokens=0, ms=5.0)  # a turn that emitted nothing teaches no rate
    assert costs.ms_per_token("ar") == pytest.approx(1.0)


def test_an_option_not_chosen_for_retry_after_turns_is_tried_again() -> None:
    """The lock-in of BENCHMARKS.md 18.15: Jacobi once looked dearer than AR and was never timed
    again. After `retry_after` learned turns without it, it forgets its costs and is retried; a
    cheaper turn then wins it the next choices, a dearer one leaves AR chosen until the next retry."""
    costs = OptionCosts("fallback", ["ar", "jacobi"], window=64, retry_after=4)
    costs.record("ar", passes=6, tokens=6, ms=6.0)  # 1.0 ms per token
    costs.record("jacobi", passes=6, tokens=6, ms=18.0)  # an unlucky first turn: 3.0 ms per token
    for _ in range(4):
        assert costs.choose() == ("ar", pytest.approx(1.0))
        costs.record("ar", passes=6, tokens=6, ms=6.0)
    assert costs.ms_per_token("jacobi") is None and costs.choose() == ("jacobi", None)  # 4 turns without it
    costs.record("jacobi", passes=6, tokens=6, ms=18.0)  # dearer again: back to AR, retried 4 turns on
    for _ in range(4):
        assert costs.choose()[0] == "ar"
        costs.record("ar", passes=6, tokens=6, ms=6.0)
    assert costs.choose() == ("jacobi", None)
    costs.record("jacobi", passes=2, tokens=6, ms=3.0)  # really 0.5 ms per token: chosen from now on
    for _ in range(3):
        assert costs.choose() == ("jacobi", pytest.approx(0.5))
        costs.record("jacobi", passes=2, tokens=6, ms=3.0)
    assert costs.choose() == ("ar", None)  # but for AR, unchosen for 4 turns, retried in its turn
    costs.record("ar", passes=1, tokens=0, ms=1.0)  # a turn that emitted nothing is not learned, nor counted
    assert costs.choose() == ("ar", None)
    with pytest.raises(ValueError, match="retry_after must be >= 1"):
        OptionCosts("fallback", ["ar"], retry_after=0)


def test_a_turn_records_its_prediction_for_the_tokens_it_emitted() -> None:
    costs = OptionCosts("tree", ["configured", "depth-1"])
    costs.record("configured", passes=1, tokens=2, ms=4.0)  # 2 ms per token
    costs.record("depth-1", passes=1, tokens=1, ms=3.0)  # 3 ms per token
    assert costs.open_turn(emitted=3) == "configured"
    costs.count_pass()
    choice = costs.close_turn(emitted=6)
    assert (choice.rule, choice.option, choice.tokens) == ("tree", "configured", 3)
    assert choice.expected_ms == pytest.approx(3 * 2.0) and choice.actual_ms >= 0.0
    assert costs.close_turn(emitted=7) is None  # no turn open


def test_a_turn_that_captured_a_cuda_graph_teaches_nothing(monkeypatch) -> None:
    """Its time is mostly the capture's: learning from it would price the option many times too high."""
    from heisd import cuda_graphs

    costs = OptionCosts("fallback", ["retrieval", "drafter"])
    costs.open_turn(emitted=0)
    costs.count_pass()
    monkeypatch.setattr(cuda_graphs, "_captures", cuda_graphs.captures() + 1)  # a pass shape seen first
    choice = costs.close_turn(emitted=4)
    assert choice.option == "retrieval" and choice.tokens == 4  # reported,
    assert costs.ms_per_token("retrieval") is None and costs.choose() == ("retrieval", None)  # not learned
    costs.open_turn(emitted=0)
    costs.count_pass()
    costs.close_turn(emitted=4)
    assert costs.ms_per_token("retrieval") is not None


@pytest.fixture(scope="module")
def resources(tmp_path_factory):
    from heisd.retrieval import build_datastore

    tmp = tmp_path_factory.mktemp("cost_rule")
    vla = tiny_vla()
    save_tiny_drafter(vla, tmp / "drafter", seed=0)
    write_demo_file(tmp / "demos.hdf5", ["reach-v3", "push-v3"], episodes=2, steps=16)
    build_datastore(vla, [tmp / "demos.hdf5"], tmp / "datastore")
    write_demo_file(tmp / "heldout.hdf5", ["reach-v3", "push-v3"], episodes=1, steps=12)
    return vla, tmp


def test_cost_fallback_and_tree_keep_lossless_tokens_and_record_their_choices(resources) -> None:
    """Lossless retrieval with the cost fallback (AR, Jacobi, the drafter with the cost tree rule)
    emits AR's tokens on every frame; each fallback and tree shape is tried, and the choices land
    in the step records and the run's switch metrics. (Demonstrator payloads: random actions, so
    groups are rejected and the fallback runs.)"""
    vla, tmp = resources
    cfg = MethodConfig("retrieval", drafter=str(tmp / "drafter"), datastore=str(tmp / "datastore"), lossless=True,
                       retrieval_fallback="cost", drafter_tree="cost", payload="demo")
    assert cfg.label == "retrieval+lossless+cost-tree"  # the cost fallback is the default
    policy = VLAPolicy(vla, build_decoders(cfg, vla))
    reference = VLAPolicy(vla, build_decoders(MethodConfig("ar"), vla))
    result = replay(policy, reference, cfg.label, [tmp / "heldout.hdf5"], frames=12, progress=False)
    assert result["token_mismatch_rate"] == 0.0 and result["max_bin_deviation"] == 0
    rules = result["switch"]["rules"]
    assert set(rules["fallback"]) == {"ar", "jacobi", "drafter"}  # every option tried
    assert set(rules["tree"]) == {"configured", "depth-1"}
    fallback = policy.decoders.retrieval.fallback
    assert all(fallback.costs.ms_per_token(o) is not None for o in ("ar", "jacobi", "drafter"))


def test_cost_fallback_sends_rejected_steps_to_the_cheapest_option(resources) -> None:
    """With measured costs making Jacobi the cheapest, every rejected step goes to Jacobi."""
    vla, tmp = resources
    cfg = MethodConfig("retrieval", drafter=str(tmp / "drafter"), datastore=str(tmp / "datastore"), lossless=True,
                       retrieval_fallback="cost", payload="demo")
    policy = VLAPolicy(vla, build_decoders(cfg, vla))
    costs = policy.decoders.retrieval.fallback.costs
    for _ in range(64):  # fill every window: AR 1.0 ms, Jacobi 0.5 ms, drafter 2.0 ms per token
        costs.record("ar", passes=4, tokens=4, ms=4.0)
        costs.record("jacobi", passes=1, tokens=4, ms=2.0)
        costs.record("drafter", passes=2, tokens=4, ms=8.0)
    reference = VLAPolicy(vla, build_decoders(MethodConfig("ar"), vla))
    result = replay(policy, reference, cfg.label, [tmp / "heldout.hdf5"], frames=6, progress=False)
    assert result["token_mismatch_rate"] == 0.0
    assert list(result["switch"]["rules"]["fallback"]) == ["jacobi"]


@pytest.mark.parametrize("cheaper", ["configured", "depth-1"])
def test_cost_tree_proposes_the_shape_measured_cheaper(resources, cheaper) -> None:
    """SpecVLA with the tree rule, its costs measured: every proposal is the cheaper shape (a
    depth-1 tree has only root children, the configured one is deeper), and the tokens stay AR's
    (exact acceptance)."""
    vla, tmp = resources
    policy = VLAPolicy(vla, build_decoders(MethodConfig("specvla", drafter=str(tmp / "drafter"),
                                                        drafter_tree="cost"), vla))
    proposer = policy.decoders.by_mode["drafter"].proposer
    for _ in range(64):  # 1 ms per token for the cheaper shape, 3 ms for the other
        for shape in ("configured", "depth-1"):
            proposer.tree_costs.record(shape, passes=1, tokens=2, ms=2.0 if shape == cheaper else 6.0)
    trees, propose = [], proposer.propose
    proposer.propose = lambda state: trees.append(propose(state)) or trees[-1]
    reference = VLAPolicy(vla, build_decoders(MethodConfig("ar"), vla))
    result = replay(policy, reference, "specvla+cost-tree", [tmp / "heldout.hdf5"], frames=4, progress=False)
    assert result["token_mismatch_rate"] == 0.0
    assert list(result["switch"]["rules"]["tree"]) == [cheaper]
    shallow = [bool((p.tree.parents < 0).all()) for p in trees if p is not None]
    # the configured tree (depth 3) is shallow only where one token is left to draft
    assert shallow and (all(shallow) if cheaper == "depth-1" else not all(shallow))
