"""The static-cache verifier's own bookkeeping (its passes are checked with every decoding test in
test_decoding_model.py, and replayed as CUDA graphs in test_cuda.py): growing, rolling back, refusing."""

from __future__ import annotations

import pytest
import torch
from helpers import tiny_vla
from test_decoding_model import full_forward, prefix, tiny_target

from heisd.decoding import DraftTree, Verifier
from heisd.decoding.graphs import StaticVerifier, make_verifier
from heisd.errors import ConfigError


def test_a_pass_past_the_cache_grows_it_and_keeps_every_position():
    """A prefix near the cache's end, then a tree that does not fit: the cache is reallocated longer,
    the prefix's rows come along, and every node still sees exactly its own path."""
    model, embeds = tiny_target(0, "sdpa"), prefix(0, 120)
    verifier = StaticVerifier(model, headroom=1)
    pre = verifier.prefill(embeds)
    assert verifier.max_len == 128  # the first cache: the headroom rounded up
    tree = DraftTree.from_sequences([[50 + i for i in range(12)], [51, 60]])
    out = verifier.verify(pre.cache, [pre.token], tree)
    assert verifier.max_len == 256 and verifier.cache_length(pre.cache) == 120 + 1 + len(tree)
    expected = Verifier(model).prefill(embeds)
    assert pre.token == expected.token
    for node in (0, 11, 12, 13):
        _, logits = full_forward(model, embeds, [pre.token] + tree.tokens[tree.path(node)].tolist())
        assert int(out.next_tokens[1 + node]) == int(logits.argmax())
    verifier.commit(pre.cache, out, [12, 13])
    follow = verifier.verify(pre.cache, [90], DraftTree.empty())
    _, logits = full_forward(model, embeds, [pre.token, 51, 60, 90])
    torch.testing.assert_close(model.lm_head(follow.hidden[0]), logits, atol=1e-4, rtol=0)


def test_rollback_forgets_a_pass_and_the_next_pass_overwrites_it():
    """A timed pass rolled back (`heisd profile`) leaves the cache as it was: the next pass's outputs
    are those of a fresh prefill."""
    model, embeds = tiny_target(1), prefix(1, 5)
    verifier = StaticVerifier(model)
    pre = verifier.prefill(embeds)
    verifier.verify(pre.cache, [pre.token], DraftTree.from_sequences([[60, 70], [61]]))
    verifier.rollback(pre.cache, 4)
    assert verifier.cache_length(pre.cache) == 5
    again = verifier.verify(pre.cache, [pre.token], DraftTree.empty())
    fresh = Verifier(model)
    expected = fresh.verify(fresh.prefill(embeds).cache, [pre.token], DraftTree.empty())
    torch.testing.assert_close(again.hidden, expected.hidden, atol=1e-5, rtol=0)
    with pytest.raises(ValueError, match="cannot roll back 7 of the cache's 6 positions"):
        verifier.rollback(pre.cache, 7)


def test_a_prefill_empties_the_one_cache():
    model = tiny_target(2)
    verifier = StaticVerifier(model)
    first = verifier.prefill(prefix(2, 6))
    verifier.verify(first.cache, [first.token], DraftTree.chain([70, 71]))
    second = verifier.prefill(prefix(2, 3))
    assert second.cache is first.cache and verifier.cache_length(second.cache) == 3
    assert second.token == Verifier(model).prefill(prefix(2, 3)).token


def test_bad_uses_are_refused():
    model = tiny_target(0)
    verifier = StaticVerifier(model)
    verifier.prefill(prefix(0, 4))
    other = Verifier(model).prefill(prefix(0, 4)).cache
    with pytest.raises(ValueError, match="its own latest prefill only"):
        verifier.verify(other, [60], DraftTree.empty())
    with pytest.raises(ConfigError, match=r"CUDA graphs \(--cuda-graphs\) need the target on a CUDA device \(--device cuda\); it is on cpu"):
        make_verifier(tiny_vla(), cuda_graphs=True)
    with pytest.raises(ConfigError, match="headroom must be >= 1"):
        StaticVerifier(model, headroom=0)
    assert type(make_verifier(tiny_vla())) is Verifier
