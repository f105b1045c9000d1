"""Verifier and decode loop on tiny random Llama targets, checked against no-cache greedy decoding."""

from __future__ import annotations

import copy
import functools

import pytest
import torch
from hypothesis import HealthCheck, assume, event, given, settings
from hypothesis import strategies as st
from transformers import LlamaConfig, LlamaForCausalLM

from heisd.decoding import (
    ActionVocab,
    DecodeConfig,
    DecodeState,
    DraftTree,
    ExactAcceptance,
    GroupRelaxedAcceptance,
    JacobiProposer,
    Proposal,
    Proposer,
    SpeculativeDecoder,
    TokenRelaxedAcceptance,
    Verifier,
)
from heisd.decoding.graphs import StaticVerifier

torch.set_num_threads(1)

VOCAB = 300  # base vocab: action ids 44..299
PADDED = 304  # embedding rows; 300..303 are pad ids, never actions
NON_ACTION = (7, 301)  # non-action ids the target sometimes emits
HIDDEN = 32
ACTIONS = ActionVocab(VOCAB, 256)
MARGIN = 1e-3  # skip cases whose greedy top-2 logits are closer than this (fp32 ties)


@functools.cache
def tiny_target(seed: int, attn: str = "eager") -> LlamaForCausalLM:
    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=PADDED,
        hidden_size=HIDDEN,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=64,
        attn_implementation=attn,
    )
    model = LlamaForCausalLM(config).eval()
    with torch.no_grad():  # mostly action tokens, sometimes a non-action one, wide logit margins
        w = model.lm_head.weight
        w.normal_(0.0, 1.0)
        w[: VOCAB - 256] = 0.0
        w[VOCAB:] = 0.0
        for tok in NON_ACTION:
            w[tok] = 1.3 * torch.randn(HIDDEN)
    return model


# both verifiers run every decoding test: the dynamic cache, and the static one (eagerly here; CUDA
# graphs replay its passes in test_cuda.py) with headroom for one position so that it grows often
VERIFIERS = {"dynamic": Verifier, "static": lambda model: StaticVerifier(model, headroom=1)}
each_verifier = pytest.mark.parametrize("kind", list(VERIFIERS))


def prefix(seed: int, length: int) -> torch.Tensor:
    return torch.randn(1, length, HIDDEN, generator=torch.Generator().manual_seed(1000 + seed))


@torch.no_grad()
def full_forward(model, prefix_embeds, tokens) -> tuple[torch.Tensor, torch.Tensor]:
    """No-cache forward over prefix + tokens: (lm_head input, logits) at the last position."""
    ids = torch.tensor([list(tokens)], dtype=torch.long)
    embeds = torch.cat([prefix_embeds, model.get_input_embeddings()(ids)], dim=1)
    hidden = model.model(inputs_embeds=embeds, use_cache=False).last_hidden_state[0, -1]
    return hidden, model.lm_head(hidden)


def greedy_after(model, prefix_embeds, tokens) -> tuple[int, float]:
    """Target's greedy next token after prefix + tokens, and its top-2 logit margin."""
    logits = full_forward(model, prefix_embeds, tokens)[1]
    top = logits.topk(2).values
    return int(logits.argmax()), float(top[0] - top[1])


def reference_ar(model, prefix_embeds, n) -> tuple[list[int], float]:
    tokens, margin = [], float("inf")
    for _ in range(n):
        tok, m = greedy_after(model, prefix_embeds, tokens)
        tokens.append(tok)
        margin = min(margin, m)
    return tokens, margin


class ScriptedProposer(Proposer):
    """Test proposer: drafts the rest of each candidate action; None on the listed steps. `fused`: the
    whole candidates are also the first draft, verified inside the prefill pass."""

    def __init__(self, candidates, ar_steps=(), skip=False, on_state=None, fused=False):
        self.candidates, self.ar_steps, self.skip, self.on_state = candidates, set(ar_steps), skip, on_state
        self.fused, self.calls = fused, 0

    def first_draft(self, context) -> DraftTree | None:
        return DraftTree.from_sequences(self.candidates) if self.fused and self.candidates[0] else None

    def propose(self, state: DecodeState) -> Proposal | None:
        step, self.calls = self.calls, self.calls + 1
        if self.on_state is not None:
            self.on_state(state)
        rests = [c[state.position :] for c in self.candidates if len(c) > state.position]
        if step in self.ar_steps or not rests:
            return None
        return Proposal(DraftTree.from_sequences(rests), skip_verify=self.skip)

    def reset(self) -> None:
        self.calls = 0


# A draft token: None = the reference greedy token, ("off", d) = d bins from it, int = that id.
@st.composite
def draft_token(draw, max_offset: int):
    kind = draw(st.sampled_from(["ref", "off", "off", "id"]))
    if kind == "ref":
        return None
    if kind == "off":
        return ("off", draw(st.integers(-max_offset, max_offset)))
    return draw(st.integers(0, PADDED - 1))


@st.composite
def scenarios(draw, max_offset=3, n=None, max_correct=None):
    n = n or draw(st.integers(1, 8))
    return dict(
        seed=draw(st.integers(0, 2)),
        prefix_len=draw(st.integers(1, 6)),
        n=n,
        # each candidate: a correct prefix of drafts, then a tail of wrong/near/correct tokens
        specs=draw(
            st.lists(
                st.builds(
                    lambda k, tail: [None] * k + tail,
                    st.integers(0, n + 3 if max_correct is None else max_correct),
                    st.lists(draft_token(max_offset), max_size=3),
                ),
                min_size=1,
                max_size=4,
            )
        ),
        ar_steps=draw(st.sets(st.integers(0, 7), max_size=3)),
        fused=draw(st.booleans()),  # the first draft verified inside the prefill pass
    )


def realize(specs, reference) -> list[list[int]]:
    """Candidate actions from specs; positions past the reference (past the action's end) stay ids."""

    def token(spec, pos):
        ref = reference[min(pos, len(reference) - 1)]
        if spec is None:
            return ref
        if isinstance(spec, tuple):
            return min(max(ref - spec[1], VOCAB - 256), VOCAB - 1) if ACTIONS.is_action(ref) else ref
        return spec

    return [[token(s, p) for p, s in enumerate(spec)] for spec in specs]


FAST = settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@each_verifier
@FAST
@given(scenarios())
def test_exact_acceptance_is_lossless(kind, case):
    model, embeds = tiny_target(case["seed"]), prefix(case["seed"], case["prefix_len"])
    reference, margin = reference_ar(model, embeds, case["n"] + 1)
    assume(margin > MARGIN)
    ref_hidden = [full_forward(model, embeds, reference[:i])[0] for i in range(case["n"])]

    def check_state(state: DecodeState) -> None:  # hidden rows are the lm_head inputs that predicted them
        m = len(state.hidden)
        assert m >= 1 and state.emitted == reference[: state.position]
        for j in range(m):
            torch.testing.assert_close(state.hidden[j], ref_hidden[state.position - m + j], atol=1e-4, rtol=0)

    proposer = ScriptedProposer(realize(case["specs"], reference), case["ar_steps"], on_state=check_state,
                                fused=case["fused"])
    config = DecodeConfig(n_tokens=case["n"], vocab_size=VOCAB, n_bins=256)
    decoder = SpeculativeDecoder(VERIFIERS[kind](model), config, proposer, ExactAcceptance())
    result = decoder.decode(embeds)
    assert result.tokens == reference[: case["n"]]
    fused = proposer.first_draft({}) is not None  # then the prefill pass is a verify pass too
    assert result.target_forwards == (not fused) + len(result.accepted_lengths)
    # each pass emits its accepted drafts + a bonus token, only the last may be cut at n
    assert 0 <= sum(result.accepted_lengths) + result.target_forwards - case["n"] <= 1
    assert result.deviation == 0
    event(f"accepted drafts: {min(sum(result.accepted_lengths), 3)}+")


def emitted_deviations(model, embeds, tokens) -> tuple[list[float], float]:
    """Per position: bin deviation of the emitted token from the target's greedy given the emitted
    prefix (inf for a mismatch involving a non-action token), and the smallest greedy logit margin."""
    devs, margin = [], float("inf")
    for i, tok in enumerate(tokens):
        greedy, m = greedy_after(model, embeds, tokens[:i])
        margin = min(margin, m)
        if tok == greedy:
            devs.append(0)
        elif ACTIONS.is_action(tok) and ACTIONS.is_action(greedy):
            devs.append(abs(ACTIONS.bin(tok) - ACTIONS.bin(greedy)))
        else:
            devs.append(float("inf"))
    return devs, margin


def require(condition: bool) -> None:
    assert condition


def relaxed_decode(case, acceptance, guard=assume):
    """Decode with a relaxed rule; ``guard`` skips (assume) or fails (require) on fp32 near-ties."""
    model, embeds = tiny_target(case["seed"]), prefix(case["seed"], case["prefix_len"])
    reference, _ = reference_ar(model, embeds, case["n"])
    proposer = ScriptedProposer(realize(case["specs"], reference), case["ar_steps"], fused=case.get("fused", False))
    config = DecodeConfig(n_tokens=case["n"], vocab_size=VOCAB, n_bins=256)
    result = SpeculativeDecoder(Verifier(model), config, proposer, acceptance).decode(embeds)
    assert len(result.tokens) == case["n"]
    devs, margin = emitted_deviations(model, embeds, result.tokens)
    guard(margin > MARGIN)
    assert sum(devs) == result.deviation
    return result, devs


GROUPS = [[0, 1, 2], [3], [4, 5, 6], [7]]


def check_groups(devs):
    for k, group in enumerate(GROUPS):
        group_devs = [devs[p] for p in group]
        assert sum(group_devs) <= 30 and max(group_devs) <= 15
        if k in (1, 3):  # grippers
            assert group_devs == [0] * len(group)


@FAST
@given(scenarios(max_offset=12, max_correct=2), st.integers(0, 10))
def test_token_relaxed_stays_within_r(case, r):
    result, devs = relaxed_decode(case, TokenRelaxedAcceptance(r))
    assert max(devs) <= r
    event(f"relaxed tokens emitted: {bool(result.deviation)}")


@FAST
@given(scenarios(max_offset=20, n=8, max_correct=2))
def test_group_relaxed_groups_within_bounds(case):
    result, devs = relaxed_decode(case, GroupRelaxedAcceptance(GROUPS, max_sum=30, max_dev=15, exact_groups=[1, 3]))
    check_groups(devs)
    event(f"relaxed tokens emitted: {bool(result.deviation)}")


def test_near_drafts_are_accepted_relaxed_and_bounded():
    """Drafts a few bins off the target's greedy tokens are kept by both relaxed rules."""
    group_deviations = []
    for seed in range(3):
        spec = [None, ("off", 3), ("off", -2), None, ("off", 4)]
        case = dict(seed=seed, prefix_len=4, n=8, ar_steps=(), specs=[spec])
        result, devs = relaxed_decode(case, TokenRelaxedAcceptance(9), require)
        assert result.accepted_lengths[0] >= 1 and result.deviation > 0 and max(devs) <= 9
        result, devs = relaxed_decode(case, GroupRelaxedAcceptance(GROUPS, max_sum=30, max_dev=15, exact_groups=[1, 3]), require)
        assert result.accepted_lengths[0] in (0, 2)  # positions 1, 2 (the rest of group 0) or nothing
        check_groups(devs)
        group_deviations.append(result.deviation)
    assert max(group_deviations) > 0


def test_verify_pass_margins_are_the_targets_top2_gaps():
    model, embeds = tiny_target(0), prefix(0, 3)
    verifier = Verifier(model)
    pre = verifier.prefill(embeds)
    tree = DraftTree.from_sequences([[ACTIONS.token(5), ACTIONS.token(9)], [ACTIONS.token(200)]])
    ver = verifier.verify(pre.cache, pre.token, tree, margins=True)
    assert ver.tree_margins is not None and len(ver.tree_margins) == len(tree) + 1
    for slot, path in enumerate([[], [0], [0, 1], [2]]):
        _, margin = greedy_after(model, embeds, [pre.token] + [int(tree.tokens[i]) for i in path])
        assert ver.tree_margins[slot].item() == pytest.approx(margin, abs=1e-4)
    assert verifier.verify(verifier.prefill(embeds).cache, pre.token, tree).margins is None  # only when asked


@FAST
@given(scenarios(max_offset=20, n=8, max_correct=2), st.sampled_from([0.05, 0.2, 1.0]))
def test_scaled_margin_gated_tolerance_keeps_its_bound_in_the_loop(case, max_margin):
    """Every emitted token within the scaled bound of the greedy token the target had there, and
    exact wherever the target's top-token margin exceeded the gate."""
    zero = [127.0] * 8
    rule = GroupRelaxedAcceptance(GROUPS, max_sum=30, max_dev=15, exact_groups=[1, 3], scale=0.25, floor=1,
                                  zero_bins=zero, max_margin=max_margin)
    result, devs = relaxed_decode(case, rule)
    check_groups(devs)
    model, embeds = tiny_target(case["seed"]), prefix(case["seed"], case["prefix_len"])
    for i, dev in enumerate(devs):
        greedy, margin = greedy_after(model, embeds, result.tokens[:i])
        bound = 0 if margin > max_margin + 1e-4 else min(15, max(1, int(0.25 * abs(ACTIONS.bin(greedy) - 127))))
        assert dev <= bound
    event(f"relaxed tokens emitted: {bool(result.deviation)}")


@each_verifier
@pytest.mark.parametrize("attn", ["eager", "sdpa"])
def test_tree_pass_matches_sequential_forwards(attn, kind):
    """Every node's output equals a no-cache forward over its own path: the 4-D mask is honoured."""
    model, embeds = tiny_target(0, attn), prefix(0, 5)
    verifier = VERIFIERS[kind](model)
    cache = verifier.prefill(embeds).cache
    tree = DraftTree.from_sequences([[50, 60, 70], [50, 61], [51, 60, 72, 80], [299]])
    roots = [100, 200]
    out = verifier.verify(cache, roots, tree)
    assert verifier.cache_length(cache) == 5 + len(roots) + len(tree)
    for slot in range(len(roots) + len(tree)):
        path = roots[: slot + 1] if slot < len(roots) else roots + tree.tokens[tree.path(slot - 2)].tolist()
        hidden, logits = full_forward(model, embeds, path)
        torch.testing.assert_close(out.hidden[slot], hidden, atol=1e-4, rtol=0)
        assert int(out.next_tokens[slot]) == int(logits.argmax())


@each_verifier
@pytest.mark.parametrize("attn", ["eager", "sdpa"])
@pytest.mark.parametrize("branch", [[0, 1, 2], [3, 4], []])
def test_fused_prefill_pass_is_a_prefill_and_a_tree_pass(attn, branch, kind):
    """`prefill_verify`: one forward over [prefix, tree] gives the prefill's token and hidden state and
    every node's output over its own path; committed, the cache holds prefix + the accepted path."""
    model, embeds = tiny_target(1, attn), prefix(1, 5)
    plain = VERIFIERS[kind](model).prefill(embeds)
    verifier = VERIFIERS[kind](model)
    tree = DraftTree.from_sequences([[50, 60, 70], [51, 61], [50, 62, 72]])
    pre, out = verifier.prefill_verify(embeds, tree)
    assert pre.token == plain.token and out.n_roots == 1 and out.past_len == 4
    torch.testing.assert_close(pre.hidden, plain.hidden, atol=1e-5, rtol=0)
    assert len(out.hidden) == len(out.next_tokens) == 1 + len(tree)  # no prefix row but the last
    for node in range(len(tree)):
        hidden, logits = full_forward(model, embeds, tree.tokens[tree.path(node)].tolist())
        torch.testing.assert_close(out.hidden[1 + node], hidden, atol=1e-4, rtol=0)
        assert int(out.tree_next[1 + node]) == int(logits.argmax())
    verifier.commit(pre.cache, out, branch)
    path = tree.tokens[branch].tolist()
    assert verifier.cache_length(pre.cache) == 5 + len(path)
    follow = verifier.verify(pre.cache, [90], DraftTree.chain([92]))
    for slot, tail in enumerate([[90], [90, 92]]):
        _, logits = full_forward(model, embeds, path + tail)
        torch.testing.assert_close(model.lm_head(follow.hidden[slot]), logits, atol=1e-4, rtol=0)


@each_verifier
@pytest.mark.parametrize("extra_roots", [[], [95, 96]])  # several roots: tokens a verify-skip emitted unseen
@pytest.mark.parametrize("branch", [[0, 1, 2], [3, 4], []])  # a leading chain (crop), a side branch, nothing
def test_commit_compacts_to_the_accepted_path(branch, extra_roots, kind):
    model, embeds = tiny_target(1), prefix(1, 4)
    verifier = VERIFIERS[kind](model)
    pre = verifier.prefill(embeds)
    tree = DraftTree.from_sequences([[60, 70, 80], [61, 71, 81]])
    roots = [pre.token] + extra_roots
    out = verifier.verify(pre.cache, roots, tree)
    verifier.commit(pre.cache, out, branch)
    path = roots + tree.tokens[branch].tolist()
    assert verifier.cache_length(pre.cache) == 4 + len(path)
    # decoding continues as if the target had processed only prefix + accepted path
    follow = verifier.verify(pre.cache, [90, 91], DraftTree.chain([92]))
    for slot, tail in enumerate([[90], [90, 91], [90, 91, 92]]):
        hidden, logits = full_forward(model, embeds, path + tail)
        torch.testing.assert_close(model.lm_head(follow.hidden[slot]), logits, atol=1e-4, rtol=0)


@each_verifier
@pytest.mark.parametrize("n", [1, 5, 8])
def test_ar_is_the_loop_without_proposer(n, kind):
    model, embeds = tiny_target(2), prefix(2, 6)
    result = SpeculativeDecoder(VERIFIERS[kind](model), DecodeConfig(n_tokens=n, vocab_size=VOCAB, n_bins=256)).decode(embeds)
    assert result.tokens == reference_ar(model, embeds, n)[0]
    assert result.target_forwards == n and result.accepted_lengths == [0] * (n - 1)
    assert result.tokens_per_forward == 1.0
    assert min(vars(result.timing).values()) >= 0.0 and result.timing.prefill_ms > 0.0


def test_correct_chain_draft_takes_two_forwards_and_skip_takes_one():
    model, embeds = tiny_target(0), prefix(0, 3)
    reference = reference_ar(model, embeds, 8)[0]
    config = DecodeConfig(n_tokens=8, vocab_size=VOCAB, n_bins=256)
    drafted = SpeculativeDecoder(Verifier(model), config, ScriptedProposer([reference])).decode(embeds)
    stop = next((i for i in range(1, 8) if not ACTIONS.is_action(reference[i])), 8)
    assert drafted.tokens == reference and drafted.accepted_lengths[0] == stop - 1
    actions = [t if ACTIONS.is_action(t) else VOCAB - 1 for t in reference]
    skipped = SpeculativeDecoder(Verifier(model), config, ScriptedProposer([actions], skip=True)).decode(embeds)
    assert skipped.tokens == [reference[0]] + actions[1:]
    assert skipped.target_forwards == 1 and skipped.skipped_tokens == 7 and skipped.tokens_per_forward == 8.0


def test_partial_skip_then_verify_continues_from_skipped_tokens():
    """After a skipped draft, the next pass feeds the skipped tokens as roots."""
    model, embeds = tiny_target(1), prefix(1, 4)
    wrong = [0, 250, 251, 252]  # positions 1..3 skipped (position 0 comes from the prefill)

    class SkipThenAR(Proposer):
        def propose(self, state):
            return Proposal(DraftTree.chain(wrong[1:]), skip_verify=True) if state.position == 1 else None

    config = DecodeConfig(n_tokens=7, vocab_size=VOCAB, n_bins=256)
    result = SpeculativeDecoder(Verifier(model), config, SkipThenAR()).decode(embeds)
    assert result.tokens[1:4] == wrong[1:] and result.target_forwards == 1 + 3
    for i in range(4, 7):
        assert result.tokens[i] == greedy_after(model, embeds, result.tokens[:i])[0]


def test_bad_skip_proposals_raise():
    model, embeds = tiny_target(0), prefix(0, 3)
    config = DecodeConfig(n_tokens=4, vocab_size=VOCAB, n_bins=256)
    for tree in [DraftTree.from_sequences([[100], [101]]), DraftTree.chain([7])]:

        class Bad(Proposer):
            def propose(self, state, tree=tree):
                return Proposal(tree, skip_verify=True)

        with pytest.raises(ValueError, match="skip_verify"):
            SpeculativeDecoder(Verifier(model), config, Bad()).decode(embeds)


def test_decoder_rejects_groups_of_another_action_size():
    with pytest.raises(ValueError, match="positions"):
        SpeculativeDecoder(
            Verifier(tiny_target(0)), DecodeConfig(n_tokens=7, vocab_size=VOCAB, n_bins=256), None, GroupRelaxedAcceptance(GROUPS, max_sum=30, max_dev=15)
        )


@each_verifier
@FAST
@given(seed=st.integers(0, 2), prefix_len=st.integers(1, 6), n=st.integers(1, 8),
       warm=st.sampled_from(["none", "exact", "noisy"]))
def test_jacobi_decoding_is_ar(kind, seed, prefix_len, n, warm):
    """PD-VLA's Jacobi iterations with exact acceptance return AR's tokens, warm-started or not,
    and a correct warm start needs a single pass after the prefill, or none when the prefill verifies it."""
    model, embeds = tiny_target(seed), prefix(seed, prefix_len)
    config = DecodeConfig(n_tokens=n, vocab_size=VOCAB, n_bins=256)
    ar = SpeculativeDecoder(Verifier(model), config).decode(embeds)
    previous = {"none": None, "exact": ar.tokens, "noisy": [min(t + 1, VOCAB - 1) for t in ar.tokens]}[warm]
    for fused in (False, True):
        decoder = SpeculativeDecoder(VERIFIERS[kind](model), config, JacobiProposer(fused), ExactAcceptance())
        result = decoder.decode(embeds, {"previous_action": previous})
        assert result.tokens == ar.tokens
        assert result.target_forwards <= ar.target_forwards
        assert result.proposer_stats.iterations == result.target_forwards - (previous is None or not fused)
        if warm == "exact" and all(ACTIONS.is_action(t) for t in ar.tokens):
            assert result.target_forwards == (1 if fused else min(n, 2))  # (acceptance keeps no non-action draft)


def test_jacobi_next_guess_is_the_targets_output_on_the_previous_guess():
    """The fixed-point update: each guessed position takes the target's greedy token given the
    emitted tokens and the previous guess before it (one no-cache forward per position here)."""
    model, embeds, n = tiny_target(0), prefix(0, 4), 8
    config = DecodeConfig(n_tokens=n, vocab_size=VOCAB, n_bins=256)
    ar = SpeculativeDecoder(Verifier(model), config).decode(embeds)
    proposer, chains = JacobiProposer(fused=True), []
    propose, first_draft = proposer.propose, proposer.first_draft

    def recording(state):
        proposal = propose(state)
        if proposal is not None:
            chains.append((list(state.emitted), proposal.tree.tokens.tolist()))
        return proposal

    def recording_first(context):  # the warm start, verified in the prefill pass
        tree = first_draft(context)
        chains.append(([], tree.tokens.tolist()))
        return tree

    proposer.propose, proposer.first_draft = recording, recording_first
    noisy = [min(t + 3, VOCAB - 1) for t in ar.tokens]
    SpeculativeDecoder(Verifier(model), config, proposer, ExactAcceptance()).decode(embeds, {"previous_action": noisy})
    assert len(chains) >= 2 and chains[0] == ([], noisy)
    for (emitted, chain), (emitted_next, chain_next) in zip(chains, chains[1:]):
        start = len(emitted)
        for i, token in enumerate(chain_next):
            p = len(emitted_next) + i  # position of this guess
            context = emitted + chain[: p - start]  # what the previous pass saw before position p
            assert token == greedy_after(model, embeds, context)[0]


class _WrongFirst(Proposer):
    """A tree of wrong drafts on the first call of a step, then Jacobi: a fallback after a rejection."""

    def __init__(self, wrong: int):
        self.jacobi, self.wrong, self.calls = JacobiProposer(), wrong, 0

    def begin_step(self, context):
        self.calls = 0
        self.jacobi.begin_step(context)

    def propose(self, state):
        self.calls += 1
        if self.calls == 1:
            return Proposal(DraftTree.from_sequences([[self.wrong] * 3, [self.wrong, self.wrong - 1]]))
        return self.jacobi.propose(state)

    def observe(self, outcome):
        if self.calls > 1:  # the outcome of Jacobi's chain is Jacobi's to learn from
            self.jacobi.observe(outcome)


def test_jacobi_as_a_fallback_ignores_other_proposers_trees():
    """After another proposer's rejected tree, Jacobi starts from its warm start, not from the
    predictions made on that foreign tree: with the exact previous action it needs one pass."""
    model, embeds, n = tiny_target(0), prefix(0, 4), 8
    config = DecodeConfig(n_tokens=n, vocab_size=VOCAB, n_bins=256)
    ar = SpeculativeDecoder(Verifier(model), config).decode(embeds)
    assume_actions = all(ACTIONS.is_action(t) for t in ar.tokens[2:])
    wrong = next(t for t in range(VOCAB - 256, VOCAB) if t not in ar.tokens)
    decoder = SpeculativeDecoder(Verifier(model), config, _WrongFirst(wrong), ExactAcceptance())
    result = decoder.decode(embeds, {"previous_action": ar.tokens})
    assert result.tokens == ar.tokens
    if assume_actions:
        assert result.target_forwards == 3  # prefill, the rejected tree, one Jacobi chain


def test_the_loop_reports_each_verify_pass_to_the_proposer():
    """`observe` follows every verify pass with the verified tree, the accepted path and where the
    tree started; a skipped draft has no pass and no outcome. `draft_depths` records each pass."""
    model, embeds = tiny_target(0), prefix(0, 3)
    reference = reference_ar(model, embeds, 8)[0]
    seen = []

    class Recording(ScriptedProposer):
        def observe(self, outcome):
            seen.append((outcome.position, len(outcome.tree), list(outcome.accepted)))

    wrong = [t + 1 if t < VOCAB - 1 else t - 1 for t in reference]
    config = DecodeConfig(n_tokens=8, vocab_size=VOCAB, n_bins=256)
    result = SpeculativeDecoder(Verifier(model), config, Recording([reference[:3] + wrong[3:]], ar_steps=range(1, 9))).decode(embeds)
    assert result.tokens == reference
    first = next((i for i in range(1, 3) if not ACTIONS.is_action(reference[i])), 3) - 1  # accepted of 7 drafted
    assert seen[0] == (1, 7, list(range(first))) and result.draft_depths[0] == 7
    assert len(seen) == result.target_forwards - 1 == len(result.draft_depths) == len(result.accepted_lengths)
    assert all(nodes == 0 and accepted == [] for _, nodes, accepted in seen[1:])  # plain AR passes after it
    assert result.draft_depths[1:] == [0] * (len(seen) - 1)


def test_commit_moves_only_the_accepted_rows_in_place():
    """A side branch is compacted inside the same storage: no new tensors, the prefix untouched."""
    model, embeds = tiny_target(1), prefix(1, 6)
    verifier = Verifier(model)
    pre = verifier.prefill(embeds)
    out = verifier.verify(pre.cache, [pre.token], DraftTree.from_sequences([[60, 70, 80], [61, 71, 81]]))
    before = [(layer.keys.data_ptr(), layer.keys[:, :, :6].clone()) for layer in pre.cache.layers]
    stored = [layer.keys[:, :, 7 + 3 : 7 + 5].clone() for layer in pre.cache.layers]  # nodes 3, 4
    verifier.commit(pre.cache, out, [3, 4])
    assert pre.cache.get_seq_length() == 6 + 1 + 2
    for layer, (pointer, prefix_keys), rows in zip(pre.cache.layers, before, stored):
        assert layer.keys.data_ptr() == pointer  # the same storage: a view cut to length
        assert torch.equal(layer.keys[:, :, :6], prefix_keys) and torch.equal(layer.keys[:, :, 7:9], rows)


def test_a_cache_the_commit_would_corrupt_is_refused():
    from transformers import MistralConfig, MistralForCausalLM

    from heisd.errors import ConfigError

    torch.manual_seed(0)
    model = MistralForCausalLM(MistralConfig(vocab_size=PADDED, hidden_size=HIDDEN, intermediate_size=64,
                                             num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                                             sliding_window=4, max_position_embeddings=64)).eval()
    with pytest.raises(ConfigError, match="DynamicSlidingWindowLayer layers; heisd's tree verification commits"):
        Verifier(model).prefill(prefix(0, 6))


@pytest.mark.parametrize("branch", [[0, 1], [3, 4]])
def test_bfloat16_tree_pass_and_commit_follow_float32(branch):
    """The same tree pass and commit in bf16 (OpenVLA's GPU dtype) stay close to fp32, here on CPU:
    the mask's finfo.min and the in-place row moves hold in the lower precision too."""
    results = {}
    for dtype in (torch.float32, torch.bfloat16):
        model = copy.deepcopy(tiny_target(1)).to(dtype)  # (the cached target stays fp32 for other tests)
        verifier = Verifier(model)
        pre = verifier.prefill(prefix(1, 5).to(dtype))
        out = verifier.verify(pre.cache, [pre.token], DraftTree.from_sequences([[60, 70, 80], [61, 71, 81]]))
        verifier.commit(pre.cache, out, branch)
        follow = verifier.verify(pre.cache, [90], DraftTree.chain([92]))
        results[dtype] = (out.hidden.float(), follow.hidden.float())
    for full, low in zip(results[torch.float32], results[torch.bfloat16]):
        torch.testing.assert_close(low, full, atol=0.1, rtol=0.05)
