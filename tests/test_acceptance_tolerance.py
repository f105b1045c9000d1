"""Acceptance tolerances on random trees: every accepted path keeps the bound its rule promises,
the accepted path is the best valid one, and an exact tolerance is greedy decoding."""

from __future__ import annotations

import math
import random

import pytest
import torch

from heisd.decoding import ActionVocab, DraftTree, ExactAcceptance, GroupRelaxedAcceptance
from heisd.retrieval.config import RetrievalConfig, Tolerance

VOCAB = ActionVocab(300, 256)  # action ids 44..299
GROUPS = [[0, 1, 2], [3], [4, 5, 6], [7]]
EXACT_GROUPS = [1, 3]
ZERO = [127.0, 130.5, 120.0, 127.0, 127.0, 130.5, 120.0, 127.0]  # per position: the bin of a zero action


def tok(b: int) -> int:
    return VOCAB.token(b)


def promised_bound(tol: Tolerance, pos: int, target_bin: int, margin: float, fine: bool) -> int:
    """The token bound as `Tolerance` documents it, written out independently of the rule."""
    if pos == 0 or any(pos in GROUPS[k] for k in EXACT_GROUPS):  # the first token is always the target's
        return 0
    if tol.max_margin is not None and margin > tol.max_margin:
        return 0
    bound = 15 if tol.scale is None else min(15, max(tol.floor, math.floor(tol.scale * abs(target_bin - ZERO[pos]))))
    return math.floor(bound * tol.fine_factor) if fine else bound


def random_tolerance(rng: random.Random) -> Tolerance:
    return Tolerance(
        scale=rng.choice([None, 0.0, 0.1, 0.25, 0.5, 1.0]),
        floor=rng.choice([0, 1, 2, 4]),
        fine_factor=rng.choice([0.0, 0.5, 1.0]),
        fine_below=rng.choice([0.0, 0.3, 0.6]),
        max_margin=rng.choice([None, 0.5, 2.0]),
    )


def random_case(rng: random.Random):
    """A random tree of action tokens (sometimes a non-action id) near random target bins, with the
    target's greedy token and top-token margin per slot, a start position and a metric F."""
    start = rng.randrange(0, 8)
    n_seq = rng.randint(1, 6)
    center = [rng.randrange(0, 256) for _ in range(8)]
    seqs = []
    for _ in range(n_seq):
        seq = []
        for pos in range(start, min(8, start + rng.randint(1, 8))):
            if rng.random() < 0.05:
                seq.append(rng.choice([7, 301]))  # a text id, a pad id
            else:
                spread = rng.choice([0, 2, 8, 20])
                seq.append(tok(min(255, max(0, center[pos] + rng.randint(-spread, spread)))))
        seqs.append(seq)
    tree = DraftTree.from_sequences(seqs)
    depth = tree.depth.tolist()
    # the target's greedy token after the root and after each node: near that position's center
    targets = [tok(min(255, max(0, center[start] + rng.randint(-3, 3))))]
    for i in range(len(tree)):
        pos = start + depth[i]  # the position this slot predicts
        near = center[pos] if pos < 8 else rng.randrange(256)
        targets.append(tok(min(255, max(0, near + rng.randint(-3, 3)))) if rng.random() > 0.03 else 7)
    margins = [rng.choice([0.1, 1.0, 3.0]) for _ in targets]
    metric = rng.choice([None, 0.1, 0.5, 0.9])
    return tree, torch.tensor(targets), torch.tensor(margins), start, metric


def valid(tree: DraftTree, node: int, targets, margins, start, tol: Tolerance, fine: bool) -> bool:
    """Brute force: may the path to `node` be accepted (every bound held, ends a group)?"""
    path, parents = tree.path(node), tree.parents.tolist()
    seg = 0
    for i in path:
        p, pos = parents[i], start + int(tree.depth[i]) - 1
        draft, target = int(tree.tokens[i]), int(targets[p + 1])
        if not (VOCAB.is_action(draft) and VOCAB.is_action(target)):
            return False
        dev = abs(VOCAB.bin(draft) - VOCAB.bin(target))
        group = next(g for g in GROUPS if pos in g)
        seg = dev if (pos == group[0] or i == path[0]) else seg + dev
        if dev > promised_bound(tol, pos, VOCAB.bin(target), float(margins[p + 1]), fine):
            return False
        if seg > (math.floor(30 * tol.fine_factor) if fine else 30):
            return False
    last = start + int(tree.depth[node]) - 1
    return any(last == g[-1] for g in GROUPS)


def rule_of(tol: Tolerance) -> GroupRelaxedAcceptance:
    config = RetrievalConfig(groups=tuple(map(tuple, GROUPS)), exact_groups=tuple(EXACT_GROUPS), tolerance=tol)
    return config.acceptance(ZERO)


@pytest.mark.parametrize("seed", range(3))
def test_accepted_paths_keep_the_promised_bound_on_random_trees(seed):
    rng = random.Random(seed)
    accepted_some = relaxed_some = 0
    for _ in range(300):
        tol = random_tolerance(rng)
        tree, targets, margins, start, metric = random_case(rng)
        rule = rule_of(tol)
        fine = metric is not None and metric < tol.fine_below
        acc = rule.select(tree, targets, start, VOCAB, margins, metric)
        parents = tree.parents.tolist()
        # every accepted token within its promised bound, every group within its sum
        for i in acc.nodes:
            pos, target = start + int(tree.depth[i]) - 1, int(targets[parents[i] + 1])
            dev = abs(VOCAB.bin(int(tree.tokens[i])) - VOCAB.bin(target))
            assert dev <= promised_bound(tol, pos, VOCAB.bin(target), float(margins[parents[i] + 1]), fine)
            relaxed_some += dev > 0
        # the path is the longest valid one (ties: the smallest deviation)
        lengths = [int(tree.depth[i]) for i in range(len(tree)) if valid(tree, i, targets, margins, start, tol, fine)]
        assert len(acc.nodes) == max(lengths, default=0)
        if acc.nodes:
            assert valid(tree, acc.nodes[-1], targets, margins, start, tol, fine)
        accepted_some += bool(acc.nodes)
        assert acc.bonus == int(targets[acc.nodes[-1] + 1 if acc.nodes else 0])
    assert accepted_some > 50 and relaxed_some > 20  # the cases exercise relaxed acceptance


@pytest.mark.parametrize("seed", range(2))
def test_an_exact_tolerance_is_greedy_decoding(seed):
    """scale=0 (no floor), fine=0 in every phase, or margin=0 with confident targets: the exact rule's path."""
    rng = random.Random(100 + seed)
    exact_tolerances = [Tolerance(scale=0.0), Tolerance(fine_factor=0.0, fine_below=1.0), Tolerance(max_margin=0.0)]
    for _ in range(300):
        tree, targets, margins, start, _ = random_case(rng)
        margins = margins + 0.01  # every target strictly confident
        greedy = ExactAcceptance().select(tree, targets, start, VOCAB)
        for tol in exact_tolerances:
            acc = rule_of(tol).select(tree, targets, start, VOCAB, margins, 0.5)
            # exact acceptance ends anywhere; group acceptance at group ends: the same tokens up to there
            assert acc.deviation == 0 and acc.tokens == greedy.tokens[: len(acc.tokens)]
            parents = tree.parents.tolist()
            assert all(int(tree.tokens[i]) == int(targets[parents[i] + 1]) for i in acc.nodes)


def test_scaled_bound_follows_the_targets_action():
    rule = rule_of(Tolerance(scale=0.5, floor=2))
    assert rule.token_bound(0, 127, math.inf, False) == 2  # a zero action: the floor
    assert rule.token_bound(0, 147, math.inf, False) == 10  # 20 bins from zero: half of it
    assert rule.token_bound(0, 255, math.inf, False) == 15  # capped by the paper's max_dev
    assert rule.token_bound(3, 255, math.inf, False) == 0  # the gripper stays exact
    fine = rule_of(Tolerance(scale=0.5, floor=2, fine_factor=0.5, fine_below=0.3))
    assert fine.fine_phase(0.2) and not fine.fine_phase(0.4) and not fine.fine_phase(None)
    assert fine.token_bound(0, 147, math.inf, True) == 5 and fine.segment_bound(0, True) == 15
    gated = rule_of(Tolerance(max_margin=2.0))
    assert gated.needs_margins and gated.token_bound(0, 0, 1.9, False) == 15 and gated.token_bound(0, 0, 2.1, False) == 0


def test_tolerance_specs_round_trip_and_bad_ones_are_named():
    for spec in ["paper", "scale=0.5,floor=2", "fine=0,fine-below=0.3", "margin=4", "scale=0.25,fine=0.5,fine-below=0.2,margin=3"]:
        assert Tolerance.parse(spec).spec() == spec
    assert Tolerance.parse("floor=2,scale=0.5").spec() == "scale=0.5,floor=2"  # one canonical text
    for bad, match in [("x=1", "'x=1' is not key=value"), ("scale=a", "scale='a' is not a number"),
                       ("fine=2", "0 <= fine <= 1"), ("margin=-1", "margin must be >= 0")]:
        with pytest.raises(ValueError, match=match):
            Tolerance.parse(bad)
    with pytest.raises(ValueError, match="floor <= max_dev"):
        rule_of(Tolerance(scale=0.5, floor=16))


def test_method_labels_name_a_tolerance_other_than_the_default():
    from heisd.runtime.methods import MethodConfig

    kw = dict(drafter="d", datastore="s")
    assert MethodConfig("heisd", **kw).label == "heisd"
    assert MethodConfig("heisd", tolerance="paper", **kw).label == "heisd+tol:paper"
    assert MethodConfig("retrieval", datastore="s", tolerance="floor=3,scale=1").label == "retrieval+tol:scale=1,floor=3"
    # exact acceptance has no tolerance to name
    assert MethodConfig("heisd", tolerance="paper", lossless=True, **kw).label == "heisd+lossless"
    with pytest.raises(ValueError, match="not key=value"):
        MethodConfig("heisd", tolerance="wide", **kw)
