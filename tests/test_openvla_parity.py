"""Losslessness on the tiny OpenVLA: the decode loop equals transformers' greedy `generate()`, and
exact-acceptance SD (drafter trees, retrieval-like drafts) returns exactly the AR tokens."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from heisd.decoding import (
    DecodeConfig,
    DecodeState,
    DraftTree,
    ExactAcceptance,
    Proposal,
    Proposer,
    SpeculativeDecoder,
    Verifier,
)
from heisd.drafter import DrafterProposer, TreeConfig
from heisd.profiling import random_drafter

INSTRUCTIONS = ("pick up the black bowl", "open the middle drawer of the cabinet", "turn on the stove")


@pytest.fixture(scope="module")
def prefixes(tiny_openvla):
    """Prefix embeddings of a few (frame, instruction) observations."""
    rng = np.random.default_rng(7)
    out = []
    with torch.no_grad():
        for i, text in enumerate(INSTRUCTIONS):
            image = torch.from_numpy(rng.integers(0, 256, (1, 200 + 20 * i, 240, 3), dtype=np.uint8))
            out.append(tiny_openvla.encode_observation(image, tiny_openvla.encode_prompt(text), None)[0])
    return out


def decoder(target, proposer=None) -> SpeculativeDecoder:
    spec = target.spec
    config = DecodeConfig(n_tokens=spec.n_action_tokens, vocab_size=spec.vocab_size, n_bins=spec.n_bins)
    return SpeculativeDecoder(Verifier(target.llm), config, proposer, ExactAcceptance())


@pytest.fixture(scope="module")
def ar_tokens(tiny_openvla, prefixes):
    return [decoder(tiny_openvla).decode(p).tokens for p in prefixes]


def test_ar_loop_equals_transformers_greedy_generate(tiny_openvla, prefixes, ar_tokens):
    llm = tiny_openvla.llm
    for prefix, ours in zip(prefixes, ar_tokens):
        with torch.no_grad():
            mask = torch.ones(prefix.shape[:2], dtype=torch.long)
            generated = llm.generate(inputs_embeds=prefix, attention_mask=mask,
                                     max_new_tokens=7, do_sample=False, pad_token_id=tiny_openvla.spec.pad_id)
        assert generated[0, -7:].tolist() == ours
        assert all(31744 <= t < 32000 for t in ours)
    assert len({tuple(t) for t in ar_tokens}) > 1  # the observation matters


def test_drafter_trees_with_exact_acceptance_give_the_ar_tokens(tiny_openvla, prefixes, ar_tokens):
    torch.manual_seed(0)
    proposer = DrafterProposer(random_drafter(tiny_openvla), TreeConfig(topk=4, depth=3, budget=12))
    sd = decoder(tiny_openvla, proposer)
    for prefix, expected in zip(prefixes, ar_tokens):
        sd.reset()
        result = sd.decode(prefix)
        assert result.tokens == expected and result.deviation == 0
        assert result.target_forwards == 1 + len(result.accepted_lengths)


class RetrievedDrafts(Proposer):
    """Retrieval-like: whole stored actions drafted as a trie of their remaining tokens."""

    def __init__(self, actions: list[list[int]]):
        self.actions = actions

    def propose(self, state: DecodeState) -> Proposal | None:
        rests = [a[state.position :] for a in self.actions if len(a) > state.position]
        return Proposal(DraftTree.from_sequences(rests)) if rests else None


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(case=st.integers(0, 2),
       edits=st.lists(st.lists(st.tuples(st.integers(0, 6), st.integers(-3, 3)), max_size=3), min_size=1, max_size=4))
def test_retrieved_drafts_with_exact_acceptance_give_the_ar_tokens(tiny_openvla, prefixes, ar_tokens, case, edits):
    reference = ar_tokens[case]
    drafts = []
    for changes in edits:  # neighbours' actions: the target's own tokens, some bins moved
        action = list(reference)
        for position, offset in changes:
            action[position] = min(max(action[position] + offset, 31744), 31999)
        drafts.append(action)
    result = decoder(tiny_openvla, RetrievedDrafts(drafts)).decode(prefixes[case])
    assert result.tokens == reference and result.deviation == 0
    if reference in drafts:  # a correct draft is accepted whole: prefill + one verify pass
        assert result.target_forwards == 2
