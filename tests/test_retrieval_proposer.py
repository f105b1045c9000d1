"""RetrievalProposer: the sequence-wise group tree, the decode loop with group-relaxed
acceptance, verify-skip, fallbacks and per-step stats."""

from __future__ import annotations

import dataclasses
from types import SimpleNamespace

import faiss
import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_retrieval_build import built, tiny_vla  # noqa: F401  (built is a fixture)

from heisd.data.dataset import DemoFile
from heisd.decoding import ActionVocab, DecodeConfig, DecodeState, Proposal, Proposer, SpeculativeDecoder, Verifier
from heisd.retrieval import Datastore, DatastoreWriter
from heisd.retrieval.build import encode_frames, open_datastore
from heisd.retrieval.config import RetrievalConfig, action_groups
from heisd.retrieval.proposer import RetrievalProposer, group_tree
from heisd.retrieval.verify_skip import NEVER_SKIP, PrefillSkip, VerifySkip

torch.set_num_threads(1)
faiss.omp_set_num_threads(1)

GROUPS, EXACT = [[0, 1, 2], [3], [4, 5, 6], [7]], [1, 3]
FAST = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def test_action_groups_layouts() -> None:
    assert action_groups(4, 2) == (GROUPS, EXACT)
    assert action_groups(7, 1) == ([[0, 1, 2], [3, 4, 5], [6]], [2])
    cfg = RetrievalConfig.for_action(4, 2)
    assert cfg.groups == ((0, 1, 2), (3,), (4, 5, 6), (7,)) and cfg.exact_groups == (1, 3) and cfg.n_tokens == 8


def paths_by_group(tree, start: int) -> list[list[tuple[int, ...]]]:
    """Every root-to-node path that ends at a group boundary, cut into group values."""
    ends = {g[-1] for g in GROUPS}
    out = []
    for node in range(len(tree)):
        path = tree.path(node)
        if start + len(path) - 1 not in ends:
            continue
        toks = tree.tokens[path].tolist()
        values, i = [], 0
        for g in GROUPS:
            pos = [p for p in g if p >= start]
            if pos and i < len(toks):
                values.append(tuple(toks[i : i + len(pos)]))
                i += len(pos)
        out.append(values)
    return out


@FAST
@given(st.lists(st.lists(st.integers(0, 2), min_size=8, max_size=8), min_size=1, max_size=8),
       st.integers(1, 3), st.integers(1, 40))
def test_group_tree_properties(sequences, start, budget) -> None:
    seqs = np.array(sequences)
    tree = group_tree(seqs, 0.7 ** np.arange(len(seqs)), start, GROUPS, EXACT, budget)
    assert len(tree) <= budget
    # deduplicated: a trie, no two siblings hold the same token
    siblings = list(zip(tree.parents.tolist(), tree.tokens.tolist()))
    assert len(set(siblings)) == len(siblings)
    # every leaf ends a whole group
    ends = {g[-1] for g in GROUPS}
    leaves = set(range(len(tree))) - set(tree.parents.tolist())
    assert all(start + int(tree.depth[leaf]) - 1 in ends for leaf in leaves)
    segs = [[p for p in g if p >= start] for g in GROUPS]
    segs = [(g, pos) for g, pos in enumerate(segs) if pos]
    for values in paths_by_group(tree, start):
        for level, value in enumerate(values):
            g, pos = segs[level]
            owners = [j for j in range(len(seqs)) if tuple(seqs[j, pos]) == value]
            assert owners, "every group value comes from a retrieved sequence"
            if g in EXACT and level > 0:  # the gripper stays with the result of its parent group
                _, prev = segs[level - 1]
                assert any(tuple(seqs[j, prev]) == values[level - 1] for j in owners)
    # the best sequence's own path is always in, as far as whole groups fit
    best = seqs[0, start:].tolist()
    fitting = max((p - start + 1 for g in GROUPS for p in g[-1:] if p - start + 1 <= budget and p >= start),
                  default=0)
    node, found = -1, 0
    for tok in best[:fitting]:
        match = [i for i, (p, t) in enumerate(siblings) if p == node and t == tok]
        if not match:
            break
        node, found = match[0], found + 1
    assert found == fitting


def test_gripper_stays_with_its_result_but_arm_groups_combine() -> None:
    a = [10, 11, 12, 1, 20, 21, 22, 1]
    b = [10, 13, 14, 2, 23, 24, 25, 2]
    tree = group_tree(np.array([a, b]), np.ones(2), 1, GROUPS, EXACT, 100)
    paths = {tuple(v for vals in p for v in vals) for p in paths_by_group(tree, 1)}
    assert (11, 12, 1) in paths and (13, 14, 2) in paths
    assert (11, 12, 2) not in paths and (13, 14, 1) not in paths
    # xyz' of either result may follow either (group boundary), each with its own gripper
    assert {(11, 12, 1, 23, 24, 25, 2), (13, 14, 2, 20, 21, 22, 1), (11, 12, 1, 20, 21, 22, 1)} <= paths
    assert (11, 12, 1, 23, 24, 25, 1) not in paths
    # identical sequences collapse into one chain
    assert len(group_tree(np.array([a, a, a]), np.ones(3), 1, GROUPS, EXACT, 100)) == 7


# ----- with a tiny target and the decode loop -----
def frame(built, episode: int, t: int):
    vla = built["vla"]
    with DemoFile(built["demos"]) as f:
        ep = f.episode(f"demo_{episode}")
    with torch.no_grad():
        embeds = vla.prefix_embeds(torch.from_numpy(ep.images[t : t + 1]), vla.encode_prompt(ep.instruction),
                                   torch.from_numpy(ep.state[t : t + 1]))
    enc = encode_frames(vla, ep.images[t : t + 1], ep.instruction, ep.state[t : t + 1])
    # the previous action: the target's own on this frame (same gripper state as its drafts)
    return embeds, {"key": enc.keys[0], "task": ep.task, "previous_action": enc.own_tokens[0].tolist()}


def decoder_for(vla, proposer, cfg: RetrievalConfig) -> SpeculativeDecoder:
    return SpeculativeDecoder(Verifier(vla.llm), DecodeConfig(8, vla.config.vocab_size, 256), proposer, cfg.acceptance())


def test_own_tokens_give_one_verify_and_skip_gives_none(built) -> None:
    """The paper's order: a prefill, then one verify pass (or none, skipped); fused: the prefill pass
    verifies the whole stored action, one target pass in all and no skip needed."""
    vla = built["vla"]
    store = open_datastore(built["store"], vla)
    # the random target's own actions move the gripper within the chunk: the guard would veto every skip
    vocab = ActionVocab(vla.config.vocab_size, vla.config.n_bins)
    for fused, skip, forwards in ((False, None, 2), (False, VerifySkip(theta=0.99), 1), (True, None, 1),
                                  (True, VerifySkip(theta=0.99), 1)):
        cfg = RetrievalConfig.for_action(4, 2, gripper_guard=False, fused_prefill=fused)
        proposer = RetrievalProposer(store, cfg, vocab=vocab, verify_skip=skip)
        decoder = decoder_for(vla, proposer, cfg)
        for episode, t in ((0, 3), (2, 17)):
            embeds, context = frame(built, episode, t)
            result = decoder.decode(embeds, context)
            stats = result.proposer_stats
            assert result.tokens == store.own_tokens[(store.episode == episode) & (store.step == t)][0].tolist()
            assert stats.top1_similarity > 0.9999 and not stats.fell_back and stats.retrieval_ms > 0
            assert result.target_forwards == forwards and result.tokens_per_forward == 8 / forwards
            skipped = skip is not None and not fused  # fused, nothing is left to skip
            assert stats.skipped == skipped and (stats.hidden_similarity is not None) == skipped
            assert result.accepted_lengths == ([] if skipped else [8 if fused else 7])
            if skipped:
                assert stats.hidden_similarity > 0.9999


class Recorder(Proposer):
    def __init__(self) -> None:
        self.positions: list[int] = []

    def propose(self, state: DecodeState) -> Proposal | None:
        self.positions.append(state.position)
        return None


def near_store(vla, greedy: list[int], key: np.ndarray, path, seed: int) -> Datastore:
    """8 entries around `key` whose tokens lie within 12 bins of `greedy`, grippers (mostly) exact."""
    rng = np.random.default_rng(seed)
    vocab = ActionVocab(vla.config.vocab_size, vla.config.n_bins)
    writer = DatastoreWriter(key_dim=len(key), hidden_dim=32, n_tokens=8, n_sequences=1, target_fingerprint="t")
    for _ in range(8):
        bins = np.clip(np.array([vocab.bin(t) for t in greedy]) + rng.integers(-12, 13, 8), 0, 255)
        bins[[3, 7]] = [vocab.bin(greedy[3]), (vocab.bin(greedy[7]) + rng.integers(0, 2)) % 256]
        toks = vla.config.vocab_size - 1 - bins
        writer.add(keys=key[None] + rng.normal(0, 0.05, (1, len(key))), tokens=toks[None, None],
                   own_tokens=toks[None], hidden=rng.normal(size=(1, 32)), ee_pos=np.zeros((1, 3)),
                   episode=0, step=np.array([0]), task="push")
    return Datastore.load(writer.finalize(path))


@pytest.mark.parametrize("continue_drafts", [False, True])
def test_emitted_groups_stay_in_bounds_and_later_calls_delegate(built, tmp_path, continue_drafts) -> None:
    """Drafts near (not at) the target's greedy tokens: whatever is emitted must be within the
    group bounds of the target's greedy token given the emitted prefix."""
    vla = built["vla"]
    vocab, cfg = ActionVocab(vla.config.vocab_size, vla.config.n_bins), RetrievalConfig.for_action(4, 2, node_budget=24, continue_drafts=continue_drafts)
    embeds, context = frame(built, 1, 5)
    greedy = decoder_for(vla, None, cfg).decode(embeds).tokens
    deviation = 0
    for seed in (0, 1):
        fallback = Recorder()
        proposer = RetrievalProposer(near_store(vla, greedy, context["key"], tmp_path / f"s{seed}", seed), cfg,
                                     fallback, vocab=vocab)
        result = decoder_for(vla, proposer, cfg).decode(embeds, context)
        emitted, deviation = result.tokens, deviation + result.deviation
        for g, group in enumerate(GROUPS):
            devs = []
            for p in group:
                with torch.no_grad():
                    ids = torch.tensor([emitted[:p]], dtype=torch.long)
                    full = torch.cat([embeds, vla.llm.get_input_embeddings()(ids)], dim=1)
                    target = int(vla.llm(inputs_embeds=full).logits[0, -1].argmax())
                devs.append(abs(vocab.bin(emitted[p]) - vocab.bin(target)))
            assert (sum(devs) == 0) if g in EXACT else (sum(devs) <= 30 and max(devs) <= 15), (g, devs)
        assert result.proposer_stats.tree_nodes > 7 and result.proposer_stats.n_results == 8
        # one retrieval tree per step (fused: verified in the prefill pass, from position 0), then the fallback
        assert all(p > 0 for p in fallback.positions)
        continued = result.proposer_stats.continuations
        assert continued == 0 or continue_drafts
        retried = result.proposer_stats.first_retry  # the paper's first tree after a fused tree kept nothing
        assert len(fallback.positions) + continued + retried == len(result.accepted_lengths) - 1
    assert deviation > 0  # relaxed acceptance did accept inexact drafts


def test_unknown_task_searches_global_and_empty_result_falls_back(built, monkeypatch) -> None:
    vla = built["vla"]
    store = open_datastore(built["store"], vla)
    vocab, cfg = ActionVocab(vla.config.vocab_size, vla.config.n_bins), RetrievalConfig.for_action(4, 2, payload="both", k=3)
    proposer = RetrievalProposer(store, cfg, vocab=vocab)
    decoder = decoder_for(vla, proposer, cfg)
    embeds, context = frame(built, 0, 4)
    stats = decoder.decode(embeds, {**context, "task": "open the window"}).proposer_stats
    assert stats.fell_back and stats.collection == "__global__"
    assert stats.n_results == 3 and stats.tree_nodes > 0

    empty = store.query(context["key"], None, 1)
    empty = type(empty)(**{**{f: getattr(empty, f)[:0] for f in ("indices", "similarities", "tokens", "own_tokens",
                                                                  "hidden", "ee_pos", "episode", "step")},
                           "collection": "__global__", "fell_back": False, "tasks": ()})
    monkeypatch.setattr(store, "query", lambda *a, **k: empty)
    fallback = Recorder()
    proposer = RetrievalProposer(store, cfg, fallback, vocab=vocab)
    result = decoder_for(vla, proposer, cfg).decode(embeds, context)
    assert result.target_forwards == 8 and result.proposer_stats.tree_nodes == 0
    assert fallback.positions == list(range(1, 8))  # the whole step is the fallback's
    with pytest.raises(ValueError, match="context"):
        decoder_for(vla, proposer, cfg).decode(embeds, {"task": "push"})


def test_inconsistent_first_tokens_are_dropped(built) -> None:
    vla = built["vla"]
    store = open_datastore(built["store"], vla)
    vocab = ActionVocab(vla.config.vocab_size, vla.config.n_bins)
    proposer = RetrievalProposer(store, RetrievalConfig.for_action(4, 2), vocab=vocab)
    first = vla.config.vocab_size - 1 - 100  # bin 100
    seqs = np.array([[first - 40] + [first] * 7,  # 40 bins off the emitted token: inconsistent
                     [first + 15] + [first - 1] * 7,  # 15 bins: within max_dev
                     [first] + [first - 2] * 7])
    assert proposer._agreeing(seqs, [first]).tolist() == [False, True, True]
    # the gripper position (3) must match exactly
    assert proposer._agreeing(seqs[1:], [first, first - 1, first - 1, first - 2]).tolist() == [False, True]


def test_first_tree_keeps_every_result_when_none_agrees(built) -> None:
    """The first-token filter drops inconsistent results only while one consistent result remains."""
    vla = built["vla"]
    store = open_datastore(built["store"], vla)
    vocab, cfg = ActionVocab(vla.config.vocab_size, vla.config.n_bins), RetrievalConfig.for_action(4, 2)
    proposer = RetrievalProposer(store, cfg, vocab=vocab)
    _, context = frame(built, 0, 4)
    result = store.query(context["key"], context["task"], cfg.k)
    seqs = cfg.sequences(result)
    weights = cfg.rank_decay ** np.arange(len(seqs), dtype=np.float64)

    def tree_of(rows):
        return group_tree(seqs[rows], weights[: len(rows)], 1, cfg.groups, cfg.exact_groups, cfg.node_budget)

    far = vocab.token((vocab.bin(int(seqs[:, 0].min())) + 60) % 256)  # farther than max_dev from every result
    assert not proposer._agreeing(seqs, [far]).any()
    none_agree = proposer._first_tree(1, [far], result).tree
    everyone = tree_of(np.arange(len(seqs)))
    assert none_agree.tokens.tolist() == everyone.tokens.tolist() and none_agree.parents.tolist() == everyone.parents.tolist()
    # results whose first token is far from the emitted one are dropped while another agrees
    own = np.array(result.own_tokens)
    own[: len(own) // 2, 0] = far
    own[: len(own) // 2, 1:] = vocab.token((vocab.bin(own[: len(own) // 2, 1:]) + 7) % 255)  # and differ after it
    mixed = dataclasses.replace(result, own_tokens=own)
    emitted = int(own[-1, 0])
    agree = np.flatnonzero(proposer._agreeing(own, [emitted]))
    assert 0 < len(agree) <= len(own) - len(own) // 2
    seqs = own
    some = proposer._first_tree(1, [emitted], mixed).tree
    assert some.tokens.tolist() == tree_of(agree).tokens.tolist()


def test_continuation_drafts_the_rest_from_agreeing_sequences_only(built) -> None:
    vla = built["vla"]
    store = open_datastore(built["store"], vla)
    vocab = ActionVocab(vla.config.vocab_size, vla.config.n_bins)
    proposer = RetrievalProposer(store, RetrievalConfig.for_action(4, 2), vocab=vocab)
    t = vla.config.vocab_size - 1 - 100  # bin 100
    seqs = np.array([[t, t - 60, t, t, t - 1, t - 1, t - 1, t],  # position 1 is 60 bins off what was emitted
                     [t, t - 2, t, t, t - 5, t - 5, t - 5, t],
                     [t, t - 3, t - 1, t - 7, t - 9, t - 9, t - 9, t - 7]])  # gripper (3) differs
    proposer._step_sequences = seqs
    state = SimpleNamespace(emitted=[t, t, t, t], position=4)  # target rejected the best draft at position 1
    tree = proposer._continuation(state).tree
    assert tree.is_chain() and tree.tokens.tolist() == seqs[1, 4:].tolist()
    assert proposer._continuation(SimpleNamespace(emitted=[t, t - 90], position=2)) is None  # nobody agrees
    proposer = RetrievalProposer(store, RetrievalConfig.for_action(4, 2, continue_drafts=False), vocab=vocab)
    proposer._step_sequences = seqs
    assert proposer._continuation(state) is None


def test_a_skip_never_moves_the_gripper(built, monkeypatch) -> None:
    """Safe skips: a draft that would open or close the gripper, or any draft on an episode's first
    step (no previous action), is verified instead of skipped, by both skips."""
    vla = built["vla"]
    store = open_datastore(built["store"], vla)
    # the paper's order: the verify-skip needs the prefill's hidden state (fused, nothing is left to skip)
    vocab, cfg = ActionVocab(vla.config.vocab_size, vla.config.n_bins), RetrievalConfig.for_action(4, 2, fused_prefill=False)
    embeds, context = frame(built, 0, 4)
    previous = context["previous_action"]
    real_query = store.query

    def steady_query(*args, **kwargs):  # drafts whose grippers (3, 7) stay as the previous action left them
        result = real_query(*args, **kwargs)
        own = np.array(result.own_tokens)
        own[:, [3, 7]] = previous[7]
        return dataclasses.replace(result, own_tokens=own)

    for skips in ({"prefill_skip": PrefillSkip(-1.0)}, {"verify_skip": VerifySkip(theta=-1.0)}):
        decoder = decoder_for(vla, RetrievalProposer(store, cfg, vocab=vocab, **skips), cfg)
        # the tiny target's own actions open and close the gripper within the chunk: verified
        moving = decoder.decode(embeds, context).proposer_stats
        assert not moving.skipped and moving.gripper_veto
        first_step = decoder.decode(embeds, {**context, "previous_action": None}).proposer_stats
        assert not first_step.skipped and first_step.gripper_veto
        unguarded = RetrievalProposer(store, dataclasses.replace(cfg, gripper_guard=False), vocab=vocab, **skips)
        assert decoder_for(vla, unguarded, cfg).decode(embeds, context).proposer_stats.skipped
        monkeypatch.setattr(store, "query", steady_query)
        steady = decoder.decode(embeds, context)
        assert steady.proposer_stats.skipped and steady.tokens[3] == steady.tokens[7] == previous[7]
        monkeypatch.undo()


def test_prefill_skip_emits_the_top1_action_without_running_the_target(built, monkeypatch) -> None:
    vla = built["vla"]
    store = open_datastore(built["store"], vla)
    vocab, cfg = ActionVocab(vla.config.vocab_size, vla.config.n_bins), RetrievalConfig.for_action(4, 2, gripper_guard=False)
    embeds, context = frame(built, 0, 4)
    queries = []
    real_query = store.query
    monkeypatch.setattr(store, "query", lambda *a, **k: queries.append(1) or real_query(*a, **k))
    proposer = RetrievalProposer(store, cfg, vocab=vocab, prefill_skip=PrefillSkip(-1.0))  # always skips
    decoder = decoder_for(vla, proposer, cfg)
    monkeypatch.setattr(decoder.verifier, "prefill", lambda *a: pytest.fail("the target ran"))
    result = decoder.decode(embeds, context)
    top1 = cfg.sequences(real_query(context["key"], context["task"], cfg.k))[0].tolist()
    assert result.tokens == top1 and result.target_forwards == 0 and result.tokens_per_forward == 8.0
    assert result.skipped_tokens == 8 and result.proposer_stats.prefill_skipped and len(queries) == 1
    monkeypatch.undo()

    # a prefill skip that does not fire: the step decodes normally and reuses its one query
    queries.clear()
    monkeypatch.setattr(store, "query", lambda *a, **k: queries.append(1) or real_query(*a, **k))
    never = RetrievalProposer(store, cfg, vocab=vocab, prefill_skip=PrefillSkip(NEVER_SKIP))
    plain = RetrievalProposer(store, cfg, vocab=vocab)
    got = decoder_for(vla, never, cfg).decode(embeds, context)
    assert len(queries) == 1 and not got.proposer_stats.prefill_skipped and got.target_forwards >= 1
    assert got.tokens == decoder_for(vla, plain, cfg).decode(embeds, context).tokens


def test_a_prefill_skip_must_be_a_whole_action(built) -> None:
    vla = built["vla"]
    embeds, _ = frame(built, 0, 4)
    action = vla.config.vocab_size - 1 - np.arange(8)

    class Early(Proposer):
        def __init__(self, tokens):
            self.tokens = tokens

        def propose(self, state):
            return None

        def begin_step(self, context):
            return self.tokens

    cfg = RetrievalConfig.for_action(4, 2)
    assert decoder_for(vla, Early(action.tolist()), cfg).decode(embeds).tokens == action.tolist()
    with pytest.raises(ValueError, match="whole action"):
        decoder_for(vla, Early(action[:7].tolist()), cfg).decode(embeds)
    with pytest.raises(ValueError, match="action tokens only"):
        decoder_for(vla, Early([0] + action[1:].tolist()), cfg).decode(embeds)
