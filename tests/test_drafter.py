"""The EAGLE-style drafter: persistence and target binding, tree proposals, losslessness, training."""

from __future__ import annotations

import functools
import json
import time
from pathlib import Path

import h5py
import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from transformers import LlamaConfig, LlamaForCausalLM

from heisd.data.dataset import DemoFile
from heisd.decoding import (
    DecodeConfig,
    DecodeState,
    ExactAcceptance,
    SpeculativeDecoder,
    TokenRelaxedAcceptance,
    Verifier,
)
from heisd.decoding.rollout import Features, greedy_rollout
from heisd.drafter import Drafter, DrafterConfig, DrafterError, DrafterProposer, DrafterTarget, TreeConfig
from heisd.drafter.model import additive_mask
from heisd.drafter.passes import StaticDrafterPasses
from heisd.drafter.train import DrafterTrainConfig, drafter_loss, fit, successful_episodes, target_features
from heisd.targets.vla import VLA, NormStats, TextTokenizer, VLAConfig

torch.set_num_threads(1)

VOCAB, PADDED, HIDDEN, N = 300, 320, 32, 8  # action ids 44..299; 300..319 are pad rows
INSTRUCTIONS = ["move left", "push the red button to the right"]  # prompts of different lengths


@functools.cache
def tiny_llm(seed: int = 0, hidden: int = HIDDEN) -> LlamaForCausalLM:
    torch.manual_seed(seed)
    model = LlamaForCausalLM(LlamaConfig(
        vocab_size=PADDED, hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=64)).eval()
    with torch.no_grad():  # greedy tokens are action ids, like a trained VLA's
        model.lm_head.weight[: VOCAB - 256] = 0.0
        model.lm_head.weight[VOCAB:] = 0.0
    return model


def random_drafter(seed: int = 0, **target_kwargs) -> Drafter:
    target = DrafterTarget(tiny_llm(), VOCAB, 256, **target_kwargs)
    torch.manual_seed(seed)
    return Drafter(DrafterConfig.for_target(target), target)


def prefix(seed: int, length: int = 4) -> torch.Tensor:
    return torch.randn(1, length, HIDDEN, generator=torch.Generator().manual_seed(1000 + seed))


def drafter_inputs(b: int = 3, t: int = 5) -> tuple[torch.Tensor, ...]:
    g = torch.Generator().manual_seed(7)
    feats = torch.randn(b, t, HIDDEN, generator=g)
    tokens = torch.randint(VOCAB - 256, VOCAB, (b, t), generator=g)
    mask = additive_mask(torch.ones(t, t, dtype=torch.bool).tril())
    return feats, tokens, torch.arange(t).expand(b, -1), mask


# ----- persistence and binding -----
def test_save_load_round_trip(tmp_path):
    drafter = random_drafter()
    drafter.save_pretrained(tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["config.json", "model.safetensors"]
    config = json.loads((tmp_path / "config.json").read_text())
    assert (config["hidden_size"], config["vocab_size"], config["padded_vocab_size"]) == (HIDDEN, VOCAB, PADDED)
    assert not any("embed" in k or "lm_head" in k for k in drafter.state_dict())  # the target's, not saved
    loaded = Drafter.from_pretrained(tmp_path, drafter.target)
    with torch.no_grad():
        assert torch.equal(drafter(*drafter_inputs()), loaded(*drafter_inputs()))


def test_loading_refuses_other_targets_and_broken_files(tmp_path):
    random_drafter().save_pretrained(tmp_path / "ok")
    good = DrafterTarget(tiny_llm(), VOCAB, 256)
    cases = [
        (DrafterTarget(tiny_llm(hidden=64), VOCAB, 256), "hidden size: drafter 32 vs target 64"),
        (DrafterTarget(tiny_llm(), VOCAB - 10, 256), "vocab size: drafter 300 vs target 290"),
        (DrafterTarget(tiny_llm(), VOCAB, 256, fingerprint="abc"), "trained against target None, bound to target abc"),
    ]
    for target, message in cases:
        with pytest.raises(DrafterError, match=message):
            Drafter.from_pretrained(tmp_path / "ok", target)
    with pytest.warns(UserWarning, match="bound to target abc"):
        Drafter.from_pretrained(tmp_path / "ok", cases[2][0], allow_fingerprint_mismatch=True)
    with pytest.raises(DrafterError, match="no drafter file .*absent/config.json"):
        Drafter.from_pretrained(tmp_path / "absent", good)
    for name, damage, message in [
        ("weights", lambda d: (d / "model.safetensors").write_bytes(b"\x00" * 40), "corrupt .*model.safetensors"),
        ("config", lambda d: (d / "config.json").write_text("{"), "corrupt .*config.json"),
        ("shape", lambda d: (d / "config.json").write_text(json.dumps(
            {**json.loads((d / "config.json").read_text()), "intermediate_size": 48})), "does not match"),
    ]:
        random_drafter().save_pretrained(tmp_path / name)
        damage(tmp_path / name)
        with pytest.raises(DrafterError, match=message):
            Drafter.from_pretrained(tmp_path / name, good)


# ----- proposals -----
def state_after(emitted: list[int], known: int) -> DecodeState:
    """A state whose latest pass saw the last ``known`` emitted tokens (features are random)."""
    verifier = Verifier(tiny_llm())
    pre = verifier.prefill(prefix(0))
    hidden = torch.randn(known, HIDDEN, generator=torch.Generator().manual_seed(len(emitted)))
    return DecodeState(list(emitted), N, hidden, pre.hidden, verifier, pre.cache, {})


@settings(max_examples=25, deadline=None)
@given(topk=st.integers(1, 5), depth=st.integers(1, 5), budget=st.integers(1, 24), k=st.integers(1, N - 1),
       seed=st.integers(0, 3))
def test_proposer_tree_is_valid_and_within_bounds(topk, depth, budget, k, seed):
    proposer = DrafterProposer(random_drafter(), TreeConfig(topk, depth, budget))
    emitted = torch.randint(VOCAB - 256, VOCAB, (k,), generator=torch.Generator().manual_seed(seed)).tolist()
    tree = proposer.propose(state_after(emitted, known=k)).tree
    levels = min(depth, N - k)
    assert len(tree) == min(budget, topk + (levels - 1) * topk * topk)
    assert tree.max_depth <= levels
    assert ((tree.tokens >= VOCAB - 256) & (tree.tokens < VOCAB)).all()
    pairs = list(zip(tree.parents.tolist(), tree.tokens.tolist(), strict=True))
    assert len(set(pairs)) == len(pairs)  # no duplicate siblings


@torch.no_grad()
def reference_tree(drafter: Drafter, context: torch.Tensor, emitted: list[int], tree: TreeConfig, n: int):
    """EAGLE-2's dynamic tree with one no-cache drafter forward per node over its own path:
    [(feature, token)] of the context, then (the output that predicted it, token) per path node."""
    first = drafter.first_action_id

    def children(feats: list[torch.Tensor], tokens: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
        t = len(tokens)
        out = drafter(torch.stack(feats)[None], torch.tensor([tokens]), torch.arange(t)[None],
                      additive_mask(torch.ones(t, t, dtype=torch.bool).tril()))[0, -1]
        return out, drafter.action_logits(out[None]).log_softmax(-1)[0]

    # candidate: (score, depth, order, bins on the path, parent candidate index)
    out, logp = children(list(context), list(emitted))
    score, index = logp.topk(tree.topk)
    cands = [(float(sc), 1, [int(b)], -1, out) for sc, b in zip(score, index)]
    frontier = list(range(len(cands)))
    for _ in range(1, min(tree.depth, n - len(emitted))):
        level = []
        for c in frontier:
            sc, depth, bins, _, predicted_by = cands[c]
            feats = list(context) + [cands[a][4] for a in _ancestors(cands, c)]
            out, logp = children(feats, list(emitted) + [b + first for b in bins])
            child_score, child_bin = (sc + logp).topk(tree.topk)
            level += [(float(s2), depth + 1, bins + [int(b)], c, out) for s2, b in zip(child_score, child_bin)]
        start = len(cands)
        cands += level
        best = sorted(range(len(level)), key=lambda i: -level[i][0])[: tree.topk]
        frontier = [start + i for i in best]
    order = sorted(range(len(cands)), key=lambda i: (-cands[i][0], cands[i][1], i))[: tree.budget]
    return {tuple(cands[i][2]) for i in order}


def _ancestors(cands, c) -> list[int]:
    """Candidates on the path root -> c, c included (each one's `out` predicted the next token)."""
    path = []
    while c >= 0:
        path.append(c)
        c = cands[c][3]
    return path[::-1]


@pytest.mark.parametrize("passes", ["dynamic", "static"])
@pytest.mark.parametrize("topk, depth, budget, k", [(3, 3, 10, 2), (2, 4, 12, 1), (4, 2, 8, 5)])
def test_proposer_tree_matches_per_path_forwards(topk, depth, budget, k, passes):
    """The one-pass-per-level tree (cache + tree mask + positions) equals per-path forwards, on a
    fresh cache per proposal or on the static one (`--cuda-graphs`, here run eagerly) that an
    earlier, longer proposal left rows in."""
    drafter, cfg = random_drafter(seed=3), TreeConfig(topk, depth, budget)
    with torch.no_grad():  # sharp attention, so a wrong mask or position changes the tree
        drafter.layer.self_attn.q_proj.weight.mul_(30.0)
        drafter.layer.self_attn.k_proj.weight.mul_(30.0)
    emitted = torch.randint(VOCAB - 256, VOCAB, (k,), generator=torch.Generator().manual_seed(k)).tolist()
    state = state_after(emitted, known=k)
    proposer = DrafterProposer(drafter, cfg)
    if passes == "static":
        proposer.passes = StaticDrafterPasses(drafter, N + topk * (depth - 1))
        earlier = [VOCAB - 1 - i for i in range(N - depth)]
        proposer.propose(state_after(earlier, known=len(earlier)))
    tree = proposer.propose(state).tree
    got = {tuple(int(tree.tokens[j]) - drafter.first_action_id for j in tree.path(i)) for i in range(len(tree))}
    assert got == reference_tree(drafter, state.hidden, emitted, cfg, N)


def test_proposer_needs_features_of_every_emitted_token():
    proposer = DrafterProposer(random_drafter())
    state = state_after([100, 101], known=2)
    assert proposer.propose(state) is not None
    # right after a verify-skip of 3 tokens the target has seen none of them: no draft
    skipped = DecodeState([100, 101, 102, 103, 104], N, state.hidden[:0], state.prefill_hidden,
                          state.verifier, state.cache, {})
    assert proposer.propose(skipped) is None
    with pytest.raises(ValueError, match="budget must be >= 1"):
        TreeConfig(budget=0)
    with pytest.raises(ValueError, match="a graphed drafter needs n_tokens"):
        DrafterProposer(random_drafter(), cuda_graphs=True)
    from heisd.errors import ConfigError

    with pytest.raises(ConfigError, match=r"need the drafter on a CUDA device"):
        DrafterProposer(random_drafter(), cuda_graphs=True, n_tokens=N)
    passes = StaticDrafterPasses(random_drafter(), 4)
    passes.start()
    with pytest.raises(ValueError, match="a drafter pass of 5 rows after 0 does not fit the cache's 4 positions"):
        passes.run(torch.zeros(1, 5, HIDDEN), torch.full((1, 5), 100), torch.arange(5)[None], torch.ones(5, 5, dtype=torch.bool))


@functools.cache
def trained_drafter() -> Drafter:
    """A drafter fitted to tiny_llm's greedy rollouts: its drafts are accepted often enough that
    the acceptance rules decide something (a random drafter's almost never are)."""
    prefixes = torch.randn(512, 4, HIDDEN, generator=torch.Generator().manual_seed(1))
    drafter = random_drafter()
    fit(drafter, greedy_rollout(tiny_llm(), prefixes, N),
        DrafterTrainConfig(steps=300, batch_size=64, lr=3e-3, warmup_steps=20))
    return drafter


def greedy_after(llm, prefix_embeds: torch.Tensor, tokens: list[int]) -> list[int]:
    """The target's greedy token at each of `tokens`' positions, given the tokens before it (no cache)."""
    embeds = torch.cat([prefix_embeds, llm.get_input_embeddings()(torch.tensor([tokens]))], dim=1)
    with torch.no_grad():
        logits = llm(inputs_embeds=embeds).logits[0]
    start = prefix_embeds.shape[1] - 1
    return logits[start : start + len(tokens)].argmax(-1).tolist()


@pytest.mark.parametrize("seed", range(4))
def test_drafter_proposals_are_lossless_with_exact_acceptance(seed):
    verifier, cfg = Verifier(tiny_llm()), DecodeConfig(N, VOCAB, 256)
    ar = SpeculativeDecoder(verifier, cfg).decode(prefix(seed))
    sd = SpeculativeDecoder(verifier, cfg, DrafterProposer(trained_drafter()), ExactAcceptance())
    out = sd.decode(prefix(seed))
    assert out.tokens == ar.tokens
    assert sum(out.accepted_lengths) > 0 and out.target_forwards < N  # drafts were accepted: the rule decided


@pytest.mark.parametrize("seed", range(4))
def test_token_relaxed_acceptance_keeps_every_token_within_r_bins(seed):
    """Each emitted token is within r bins of the target's greedy token after the same prefix: the
    bound SpecVLA's rule promises (tokens after a rejection are the target's own, deviation 0)."""
    r, verifier, cfg = 9, Verifier(tiny_llm()), DecodeConfig(N, VOCAB, 256)
    out = SpeculativeDecoder(verifier, cfg, DrafterProposer(trained_drafter()), TokenRelaxedAcceptance(r)).decode(
        prefix(seed))
    greedy = greedy_after(tiny_llm(), prefix(seed), out.tokens)
    deviations = [abs(a - b) for a, b in zip(out.tokens, greedy)]
    assert len(out.tokens) == N and max(deviations) <= r
    assert sum(deviations) == out.deviation  # the loop reports what it accepted


# ----- training -----
def test_training_on_synthetic_features_lowers_the_loss():
    g = torch.Generator().manual_seed(0)
    feats = Features(torch.randn(64, N, HIDDEN, generator=g), torch.randint(VOCAB - 256, VOCAB, (64, N), generator=g))
    drafter, cfg = random_drafter(), DrafterTrainConfig(steps=40, batch_size=32, lr=3e-3, warmup_steps=5)
    with torch.no_grad():
        before = drafter_loss(drafter, feats, cfg)[1]
    fit(drafter, feats, cfg)
    with torch.no_grad():
        after = drafter_loss(drafter, feats, cfg)[1]
    assert after["feature_loss"] < 0.8 * before["feature_loss"] and after["token_loss"] < before["token_loss"]


def test_drafter_trained_on_the_target_is_accepted():
    llm, drafter = tiny_llm(), trained_drafter()
    verifier, cfg = Verifier(llm), DecodeConfig(N, VOCAB, 256)
    ar, sd = SpeculativeDecoder(verifier, cfg), SpeculativeDecoder(verifier, cfg, DrafterProposer(drafter))
    lengths = []
    for seed in range(10):  # prefixes not seen in training
        out = sd.decode(prefix(seed))
        assert out.tokens == ar.decode(prefix(seed)).tokens
        lengths.append(out.tokens_per_forward)
    assert np.mean(lengths) > 1.2


# ----- the target VLA and the command -----
TINY_VLA = {"hidden_size": 32, "n_layers": 1, "intermediate_size": 64, "image_size": 16,
            "vision_channels": (8, 16), "max_positions": 64}


def tiny_vla() -> VLA:
    torch.manual_seed(0)
    text = TextTokenizer.train(INSTRUCTIONS)
    norm = NormStats(q01=-np.ones(4), q99=np.ones(4), state_mean=np.zeros(4), state_std=np.ones(4))
    return VLA(VLAConfig(text_vocab_size=text.vocab_size, **TINY_VLA), norm, text).eval()


def write_demos(path: Path, n_episodes: int = 6, t: int = 6) -> None:
    rng = np.random.default_rng(0)
    with h5py.File(path, "w") as f:
        data = f.create_group("data")
        data.attrs["benchmark"] = "mw"
        for i in range(n_episodes):
            g = data.create_group(f"demo_{i}")
            g.attrs.update({"task": f"task{i % 2}", "instruction": INSTRUCTIONS[i % 2], "success": True})
            g.create_dataset("actions", data=rng.uniform(-1, 1, (t, 4)).astype(np.float32))
            g.create_dataset("obs/agentview_rgb", data=rng.integers(0, 256, (t, 32, 32, 3), dtype=np.uint8))
            g.create_dataset("obs/ee_pos", data=rng.normal(size=(t, 3)).astype(np.float32))
            g.create_dataset("obs/gripper_states", data=rng.uniform(size=(t, 1)).astype(np.float32))


@pytest.mark.parametrize("kind", ["small-vla", "openvla"])
def test_target_features_match_the_decode_loop(tmp_path, request, kind):
    """Features generated in per-episode batches give each chosen frame the tokens and lm_head
    inputs of its own decode, for both targets (prompts of different lengths across episodes), on
    the frame the target's protocol shows (OpenVLA: JPEG + Lanczos to 224)."""
    from heisd.benchmarks.libero_protocol import protocol_frames

    target = tiny_vla() if kind == "small-vla" else request.getfixturevalue("tiny_openvla")
    spec, demos = target.spec, tmp_path / "demos.hdf5"
    write_demos(demos, n_episodes=3, t=3)
    episodes = successful_episodes([demos])
    idx = torch.tensor([0, 2, 3, 4, 5, 7])  # frames 0, 2 of episode 0, all of episode 1, 1 of episode 2
    feats = target_features(target, episodes, idx, batch_size=2, desc="test")
    decoder = SpeculativeDecoder(Verifier(target.llm), DecodeConfig(spec.n_action_tokens, spec.vocab_size, spec.n_bins))
    with DemoFile(demos) as f:
        frames = [(f.episode(e.name), t) for e in episodes for t in range(e.length)]
    assert len(feats) == len(idx)
    for row, i in enumerate(idx.tolist()):
        ep, t = frames[i]
        shown = protocol_frames(spec.protocol, ep.images[t : t + 1])  # what the closed loop shows the target
        image, prompt = torch.from_numpy(shown), target.encode_prompt(ep.instruction)
        state = spec.state_input(ep.state[t : t + 1])
        with torch.no_grad():
            embeds = target.prefix_embeds(image, prompt, state)
            tf = target.teacher_forced(image, prompt, state, feats.tokens[row : row + 1])
        assert decoder.decode(embeds).tokens == feats.tokens[row].tolist()
        torch.testing.assert_close(feats.hidden[row], tf.hidden[0], atol=1e-4, rtol=1e-4)


def test_train_drafter_command(tmp_path):
    from heisd.cli import main

    vla, demos, out = tiny_vla(), tmp_path / "demos.hdf5", tmp_path / "drafter"
    vla.save_pretrained(tmp_path / "vla")
    write_demos(demos)
    argv = ["train-drafter", "--target", str(tmp_path / "vla"), "--demos", str(demos), "--out", str(out),
            "--steps", "20", "--batch-size", "8", "--eval-every", "10", "--threads", "1", "--max-frames", "20"]
    assert main(argv) == 0
    info = json.loads((out / "train_info.json").read_text())
    assert info["train_frames"] == 20 and info["val_frames"] == 6 and not info["features_cached"]
    assert info["target_fingerprint"] == vla.fingerprint() and 0.0 <= info["final"]["val_top1"] <= 1.0
    assert len((out / "train_log.jsonl").read_text().splitlines()) == 2
    drafter = Drafter.from_pretrained(out, DrafterTarget.from_target(VLA.from_pretrained(tmp_path / "vla")))
    assert drafter.config.target_fingerprint == vla.fingerprint()
    features_written = (out / "features.safetensors").stat().st_mtime_ns
    time.sleep(0.01)
    assert main(argv) == 1  # the trained drafter is not replaced without --overwrite
    assert main([*argv, "--overwrite"]) == 0  # a rerun reuses the generated features
    assert json.loads((out / "train_info.json").read_text())["features_cached"]
    assert (out / "features.safetensors").stat().st_mtime_ns == features_written
