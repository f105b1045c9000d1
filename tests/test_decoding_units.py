"""Draft trees and acceptance rules on plain arrays (no model)."""

from __future__ import annotations

import pytest
import torch

from heisd.decoding import (
    ActionVocab,
    DecodeConfig,
    DraftTree,
    ExactAcceptance,
    GroupRelaxedAcceptance,
    TokenRelaxedAcceptance,
)

VOCAB = ActionVocab(300, 256)  # action ids 44..299, bin b <-> token 299 - b


def tok(b: int) -> int:
    return 299 - b


def tensor(xs) -> torch.Tensor:
    return torch.tensor(xs, dtype=torch.long)


# --- DraftTree -------------------------------------------------------------------------


def test_chain_and_trie_shapes():
    chain = DraftTree.chain([5, 6, 7])
    assert chain.parents.tolist() == [-1, 0, 1] and chain.depth.tolist() == [1, 2, 3] and chain.is_chain()
    trie = DraftTree.from_sequences([[1, 2, 3], [1, 2, 4], [5], [1, 2]])
    assert trie.tokens.tolist() == [1, 2, 3, 4, 5]
    assert trie.parents.tolist() == [-1, 0, 1, 1, -1]
    assert trie.depth.tolist() == [1, 2, 3, 3, 1] and trie.max_depth == 3 and not trie.is_chain()
    assert trie.path(3) == [0, 1, 3]
    assert len(DraftTree.empty()) == 0 and DraftTree.empty().max_depth == 0


def test_ancestor_mask_sees_only_the_own_path():
    trie = DraftTree.from_sequences([[1, 2], [3]])  # slots: root, 1, 2, 3
    expected = [[1, 0, 0, 0], [1, 1, 0, 0], [1, 1, 1, 0], [1, 0, 0, 1]]
    assert trie.ancestor_mask().int().tolist() == expected


def test_truncated_drops_deep_nodes_and_reindexes():
    trie = DraftTree.from_sequences([[1, 2, 3], [4, 5]])
    cut = trie.truncated(1)
    assert cut.tokens.tolist() == [1, 4] and cut.parents.tolist() == [-1, -1]
    cut = trie.truncated(2)
    assert cut.tokens.tolist() == [1, 2, 4, 5] and cut.parents.tolist() == [-1, 0, -1, 2]
    assert trie.truncated(3) is trie


@pytest.mark.parametrize(
    ("tokens", "parents", "match"),
    [
        ([1, 2], [-1, 1], "parent 1"),  # parent index == own index
        ([1, 2], [-1, 5], "parent 5"),  # parent index > own index
        ([1, 2], [-1, -2], "parent -2"),
        ([1, 2], [-1], "differ in length"),
        ([[1]], [[-1]], "1-D"),
        ([-3], [-1], "non-negative"),
    ],
)
def test_malformed_trees_raise(tokens, parents, match):
    with pytest.raises(ValueError, match=match):
        DraftTree(tensor(tokens), tensor(parents))


def test_float_arrays_raise():
    with pytest.raises(ValueError, match="LongTensors"):
        DraftTree(torch.tensor([1.0]), tensor([-1]))


# --- acceptance rules ---------------------------------------------------------------


def targets(root_next: int, per_node: list[int]) -> torch.Tensor:
    return tensor([root_next, *per_node])


def test_exact_picks_the_matching_branch_and_bonus():
    tree = DraftTree.from_sequences([[tok(10), tok(20)], [tok(11), tok(21), tok(31)]])  # nodes 0,1 | 2,3,4
    # target greedy: after root 11, after node 2 -> 21, after node 3 -> 30, after node 4 -> 40
    target = targets(tok(11), [tok(0), tok(0), tok(21), tok(30), tok(40)])
    acc = ExactAcceptance().select(tree, target, start=1, vocab=VOCAB)
    assert acc.nodes == [2, 3] and acc.tokens == [tok(11), tok(21)] and acc.bonus == tok(30)
    assert acc.deviation == 0


def test_nothing_accepted_gives_the_roots_greedy_token():
    tree = DraftTree.chain([tok(1), tok(2)])
    acc = ExactAcceptance().select(tree, targets(tok(9), [tok(2), tok(3)]), start=1, vocab=VOCAB)
    assert acc.nodes == [] and acc.tokens == [] and acc.bonus == tok(9)


def test_non_action_drafts_are_never_accepted():
    pad, text = 301, 7  # a padded id and a base-vocab id below the action range
    for draft in (pad, text):
        tree = DraftTree.chain([draft])
        for rule in (ExactAcceptance(), TokenRelaxedAcceptance(255)):
            acc = rule.select(tree, targets(draft, [tok(0)]), start=1, vocab=VOCAB)
            assert acc.nodes == [] and acc.bonus == draft
    # a target greedy token outside the action range cannot be approximated either
    acc = TokenRelaxedAcceptance(255).select(DraftTree.chain([tok(3)]), targets(text, [0]), start=1, vocab=VOCAB)
    assert acc.nodes == [] and acc.bonus == text


def test_token_relaxed_bound_and_tie_break():
    rule = TokenRelaxedAcceptance(r=9)
    # two one-node branches, 9 and 4 bins from the target's bin 50: both accepted, the closer wins
    tree = DraftTree.from_sequences([[tok(59)], [tok(46)], [tok(60)]])
    acc = rule.select(tree, targets(tok(50), [tok(1), tok(2), tok(3)]), start=1, vocab=VOCAB)
    assert acc.nodes == [1] and acc.deviation == 4 and acc.bonus == tok(2)
    # 10 bins off is rejected
    acc = rule.select(DraftTree.chain([tok(60)]), targets(tok(50), [tok(0)]), start=1, vocab=VOCAB)
    assert acc.nodes == []
    # longer beats closer
    tree = DraftTree.from_sequences([[tok(50)], [tok(55), tok(70)]])
    acc = rule.select(tree, targets(tok(50), [tok(0), tok(75), tok(0)]), start=1, vocab=VOCAB)
    assert acc.nodes == [1, 2] and acc.deviation == 10


GROUPS = [[0, 1, 2], [3], [4, 5, 6], [7]]


def group_rule() -> GroupRelaxedAcceptance:
    return GroupRelaxedAcceptance(GROUPS, max_sum=30, max_dev=15, exact_groups=[1, 3])


def test_group_accepted_as_a_whole_or_not_at_all():
    # draft positions 1..4; target greedy bins 100 everywhere
    t = targets(tok(100), [tok(100)] * 4)
    ok = DraftTree.chain([tok(110), tok(115), tok(100), tok(90)])  # group 0 rest: 10+15; gripper exact
    acc = group_rule().select(ok, t, start=1, vocab=VOCAB)
    assert acc.nodes == [0, 1, 2] and acc.deviation == 25  # position 4 opens group 2: incomplete -> cut
    assert acc.bonus == tok(100)
    too_far = DraftTree.chain([tok(100), tok(116), tok(100)])  # 16 > max_dev rejects the whole group 0
    assert group_rule().select(too_far, t, start=1, vocab=VOCAB).nodes == []
    gripper_off = DraftTree.chain([tok(100), tok(100), tok(101)])  # group 0 fine, gripper off by one
    acc = group_rule().select(gripper_off, t, start=1, vocab=VOCAB)
    assert acc.nodes == [0, 1] and acc.bonus == tok(100)


def test_group_sum_bound():
    t = targets(tok(100), [tok(100)] * 3)
    over = DraftTree.chain([tok(115), tok(101), tok(115)])  # positions 4,5,6: each <= 15, sum 31
    assert group_rule().select(over, t, start=4, vocab=VOCAB).nodes == []
    at = DraftTree.chain([tok(115), tok(100), tok(115)])  # sum 30
    assert group_rule().select(at, t, start=4, vocab=VOCAB).nodes == [0, 1, 2]


def test_group_tree_prefers_longer_then_closer():
    t = targets(tok(100), [tok(100)] * 7)
    # positions 1, 2 (the rest of group 0), then 3 (the gripper)
    two_far, two_close = [tok(105), tok(100)], [tok(101), tok(100)]
    acc = group_rule().select(DraftTree.from_sequences([two_far, two_close]), t, start=1, vocab=VOCAB)
    assert acc.nodes == [2, 3] and acc.deviation == 1
    three = [tok(102), tok(100), tok(100)]
    acc = group_rule().select(DraftTree.from_sequences([two_far, two_close, three]), t, start=1, vocab=VOCAB)
    assert acc.nodes == [4, 5, 6] and acc.deviation == 2


def test_decoded_groups_cover_the_action():
    group_rule().check(8)
    with pytest.raises(ValueError, match="8 positions but the action has 7"):
        group_rule().check(7)


@pytest.mark.parametrize(
    ("groups", "kwargs", "match"),
    [
        ([[0, 1], [3]], {}, "cover positions"),  # position 2 missing
        ([[0, 2], [1]], {}, "contiguous"),
        ([[0], []], {}, "non-empty"),
        ([[0], [1]], {"exact_groups": [2]}, "exact_groups"),
        ([[0], [1]], {"max_sum": -1}, "max_sum"),
    ],
)
def test_bad_groups_raise(groups, kwargs, match):
    with pytest.raises(ValueError, match=match):
        GroupRelaxedAcceptance(groups, **{"max_sum": 30, "max_dev": 15, **kwargs})


def test_bad_parameters_raise():
    with pytest.raises(ValueError, match="r must be >= 0"):
        TokenRelaxedAcceptance(-1)
    with pytest.raises(ValueError, match="n_tokens"):
        DecodeConfig(n_tokens=0, vocab_size=300, n_bins=256)
    with pytest.raises(ValueError, match="n_bins"):
        DecodeConfig(n_tokens=8, vocab_size=100, n_bins=256)
