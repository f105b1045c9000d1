"""The verifier and the decode loop on a CUDA device (`make test-cuda`; skipped where no GPU is at hand).

What the CPU tests cannot see: the tree pass's additive 4-D mask going through CUDA's attention
kernels (eager and SDPA), the commit's in-place row moves on device tensors, bf16 (OpenVLA's
GPU dtype) on the GPU against the fp32 reference computed on the CPU, and the static-cache
verifier's passes replayed as CUDA graphs (`--cuda-graphs`).
"""

from __future__ import annotations

import copy
import json

import pytest
import torch
from test_decoding_model import VOCAB, ScriptedProposer, full_forward, greedy_after, prefix, reference_ar, tiny_target

from heisd.decoding import DecodeConfig, DraftTree, ExactAcceptance, JacobiProposer, SpeculativeDecoder, Verifier
from heisd.decoding.graphs import StaticVerifier

pytestmark = [
    pytest.mark.cuda,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device (make test-cuda on a GPU machine)"),
]

TREE = DraftTree.from_sequences([[50, 60, 70], [50, 61], [51, 60, 72, 80], [299]])
ROOTS = [100, 200]
BF16_MARGIN = 0.25  # greedy tokens are compared only where fp32's top-2 logits are further apart than bf16's error
# the dynamic-cache verifier, and the static one replaying CUDA graphs (small headroom: it grows, recaptures)
VERIFIERS = {"dynamic": Verifier, "graphs": lambda model: StaticVerifier(model, graphs=True, headroom=4)}
each_verifier = pytest.mark.parametrize("kind", list(VERIFIERS))


def on_cuda(seed: int, attn: str, dtype: torch.dtype):
    """(a copy of the tiny target on the GPU in `dtype`, the fp32 CPU target itself as the reference)."""
    reference = tiny_target(seed, attn)
    return copy.deepcopy(reference).to("cuda", dtype), reference


def tolerance(dtype: torch.dtype) -> dict:
    """assert_close bounds against the fp32 CPU reference: kernel rounding in fp32, bf16's error in bf16."""
    return dict(atol=1e-4, rtol=1e-4) if dtype == torch.float32 else dict(atol=0.1, rtol=0.05)


def tree_paths():
    """(slot, the tokens its output follows) for every slot of a pass over ROOTS then TREE."""
    for slot in range(len(ROOTS) + len(TREE)):
        yield slot, ROOTS[: slot + 1] if slot < len(ROOTS) else ROOTS + TREE.tokens[TREE.path(slot - 2)].tolist()


@each_verifier
@pytest.mark.parametrize("attn", ["eager", "sdpa"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_tree_pass_on_cuda_follows_the_fp32_reference(attn, dtype, kind):
    """Every node's output on the GPU equals (fp32) or stays close to (bf16) a no-cache fp32 forward
    over its own path on the CPU, and its greedy token is the reference's wherever bf16 cannot flip it."""
    model, reference = on_cuda(0, attn, dtype)
    embeds = prefix(0, 5)
    verifier = VERIFIERS[kind](model)
    cache = verifier.prefill(embeds.to("cuda", dtype)).cache
    out = verifier.verify(cache, ROOTS, TREE)
    assert verifier.cache_length(cache) == 5 + len(ROOTS) + len(TREE)
    tol = tolerance(dtype)
    compared = 0
    for slot, path in tree_paths():
        hidden, logits = full_forward(reference, embeds, path)
        torch.testing.assert_close(out.hidden[slot].float().cpu(), hidden, **tol)
        top = logits.topk(2).values
        if dtype == torch.float32 or float(top[0] - top[1]) > BF16_MARGIN:
            assert int(out.next_tokens[slot]) == int(logits.argmax())
            compared += 1
    assert compared >= len(ROOTS) + len(TREE) // 2  # the check did not go vacuous


@each_verifier
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("branch", [[0, 1, 2], [3, 4], []])  # a leading chain (crop), a side branch, nothing
def test_commit_on_cuda_keeps_the_accepted_path(dtype, branch, kind):
    """After the in-place commit on device tensors, decoding continues as if the target had seen
    only prefix + roots + accepted path (against the fp32 CPU reference)."""
    model, reference = on_cuda(1, "sdpa", dtype)
    embeds = prefix(1, 4)
    verifier = VERIFIERS[kind](model)
    pre = verifier.prefill(embeds.to("cuda", dtype))
    tree = DraftTree.from_sequences([[60, 70, 80], [61, 71, 81]])
    out = verifier.verify(pre.cache, [pre.token], tree)
    verifier.commit(pre.cache, out, branch)
    path = [pre.token] + tree.tokens[branch].tolist()
    assert verifier.cache_length(pre.cache) == 4 + len(path)
    assert all(layer.keys.device.type == "cuda" for layer in pre.cache.layers)
    follow = verifier.verify(pre.cache, [90, 91], DraftTree.chain([92]))
    tol = tolerance(dtype)
    for slot, tail in enumerate([[90], [90, 91], [90, 91, 92]]):
        hidden, _ = full_forward(reference, embeds, path + tail)
        torch.testing.assert_close(follow.hidden[slot].float().cpu(), hidden, **tol)


@each_verifier
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_lossless_decoding_on_cuda_is_ar_on_cuda(dtype, seed, kind):
    """On the GPU, in either dtype, exact acceptance over a drafted tree and Jacobi iterations return
    the tokens of the loop without a proposer, on the same device and dtype; in fp32 those are the
    CPU reference's."""
    model, reference = on_cuda(seed, "sdpa", dtype)
    embeds = prefix(seed, 6).to("cuda", dtype)
    config = DecodeConfig(n_tokens=7, vocab_size=VOCAB, n_bins=256)
    ar = SpeculativeDecoder(VERIFIERS[kind](model), config).decode(embeds)
    expected, margin = reference_ar(reference, prefix(seed, 6), 7)
    if dtype == torch.float32 and margin > 1e-3:  # (closer top-2 logits may flip between CPU and GPU kernels)
        assert ar.tokens == expected
    near = [[t if i % 3 else min(t + 1, VOCAB - 1) for i, t in enumerate(ar.tokens)], ar.tokens[:4]]
    for proposer in (ScriptedProposer(near), ScriptedProposer(near, fused=True), JacobiProposer(True)):
        decoder = SpeculativeDecoder(VERIFIERS[kind](model), config, proposer, ExactAcceptance())
        result = decoder.decode(embeds, {"previous_action": near[0]})
        assert result.tokens == ar.tokens, type(proposer).__name__
        assert result.target_forwards <= ar.target_forwards


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_graph_replays_equal_the_same_passes_run_eagerly(dtype):
    """Three actions decoded with drafted trees by the static verifier, its passes replayed as CUDA
    graphs and run eagerly: the same tokens and lm_head inputs. Each pass shape is captured once, and
    a later action with the same shapes captures nothing new."""
    model, _ = on_cuda(0, "sdpa", dtype)
    config = DecodeConfig(n_tokens=7, vocab_size=VOCAB, n_bins=256)
    graphed, eager = StaticVerifier(model, graphs=True), StaticVerifier(model)
    runs = {}
    for name, verifier in (("graphs", graphed), ("eager", eager)):
        ar = SpeculativeDecoder(verifier, config).decode(prefix(0, 6).to("cuda", dtype))
        near = [[t if i % 3 else min(t + 1, VOCAB - 1) for i, t in enumerate(ar.tokens)], ar.tokens[:4]]
        decoder = SpeculativeDecoder(verifier, config, ScriptedProposer(near, fused=True), ExactAcceptance())
        runs[name] = [decoder.decode(prefix(s, 6).to("cuda", dtype)).tokens for s in range(3)]
        if name == "graphs":
            shapes = graphed.captured
            decoder.decode(prefix(0, 6).to("cuda", dtype))
            assert graphed.captured == shapes >= 3  # prefill, fused prefill, decode step at least
    assert runs["graphs"] == runs["eager"]
    assert eager.captured == 0


@pytest.mark.parametrize("kind", ["small-vla", "openvla"])
def test_graphed_vision_equals_the_eager_towers(kind):
    """`use_cuda_graphs`: the vision of either target, replayed as a CUDA graph, gives the eager prefix
    and retrieval key, for each new frame (the graph reads its input buffer afresh on every replay)."""
    import numpy as np

    from heisd.targets.openvla.synthetic import random_openvla
    from heisd.targets.vla import VLA, NormStats, TextTokenizer, VLAConfig

    if kind == "small-vla":  # (not tests/helpers.py's: that imports the simulator, which a GPU machine may lack)
        torch.manual_seed(0)
        text = TextTokenizer.train(["put the bowl on the stove"])
        norm = NormStats(q01=-np.ones(4), q99=np.ones(4), state_mean=np.zeros(3), state_std=np.ones(3))
        config = VLAConfig(text_vocab_size=text.vocab_size, state_dim=3, hidden_size=32, n_layers=1, n_heads=4,
                           intermediate_size=64, image_size=16, vision_channels=(8, 16), max_positions=64)
        target = VLA(config, norm, text).eval().to("cuda")
    else:
        target = random_openvla("tiny", "cuda")
    rng = np.random.default_rng(0)
    prompt = target.encode_prompt("put the bowl on the stove")
    state = torch.zeros(1, target.spec.state_dim) if target.spec.state_dim else None
    frames = [torch.from_numpy(rng.integers(0, 256, (1, 64, 64, 3), dtype=np.uint8)) for _ in range(3)]
    with torch.no_grad():
        eager = [target.encode_observation(f, prompt, state) for f in frames]
        target.use_cuda_graphs()
        graphed = [target.encode_observation(f, prompt, state) for f in frames]
    for (prefix_e, key_e), (prefix_g, key_g) in zip(eager, graphed):
        torch.testing.assert_close(prefix_g, prefix_e, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(key_g, key_e, atol=1e-5, rtol=1e-5)
    assert not torch.equal(graphed[0][1], graphed[1][1])  # new frames, new outputs


def test_bfloat16_ar_on_cuda_keeps_the_reference_tokens_where_margins_are_wide():
    """bf16 on the GPU changes a greedy token only where fp32's top-2 logits are close."""
    model, reference = on_cuda(2, "sdpa", torch.bfloat16)
    embeds = prefix(2, 6)
    config = DecodeConfig(n_tokens=7, vocab_size=VOCAB, n_bins=256)
    tokens = SpeculativeDecoder(Verifier(model), config).decode(embeds.to("cuda", torch.bfloat16)).tokens
    for i, token in enumerate(tokens):
        expected, margin = greedy_after(reference, embeds, tokens[:i])
        if margin <= BF16_MARGIN:
            break  # from here on the two dtypes may follow different paths
        assert token == expected, f"token {i}"


def test_device_work_reads_the_kernels_of_each_piece(tmp_path):
    """`heisd profile --device-work` on the GPU: every piece ran kernels, and no more GPU time than its wall time."""
    from heisd.cli import main

    out = tmp_path / "profile.json"
    assert main(["profile", "--random-openvla-7b", "--random-shape", "tiny", "--device", "cuda", "--dtype", "bfloat16",
                 "--random-drafter", "--repeats", "4", "--warmup", "2", "--device-work", "--out", str(out)]) == 0
    pieces = json.loads(out.read_text())["pieces_ms"]
    timed = [t for name, t in pieces.items() if name != "tree_verify"] + list(pieces["tree_verify"].values())
    assert len(timed) == 12
    for t in timed:
        assert t["device_ops"] >= 1 and 0 < t["kernel_ms"] <= 1.5 * t["p90_ms"]


def test_profile_with_cuda_graphs_times_every_piece(tmp_path):
    """`heisd profile --cuda-graphs`: every pass shape is captured in the warm-up, every timed pass
    rolled back (the profile checks the cache's length at the end), and the JSON says so."""
    from heisd.cli import main

    out = tmp_path / "profile.json"
    assert main(["profile", "--random-openvla-7b", "--random-shape", "tiny", "--device", "cuda", "--dtype", "bfloat16",
                 "--random-drafter", "--repeats", "4", "--warmup", "2", "--cuda-graphs", "--out", str(out)]) == 0
    result = json.loads(out.read_text())
    assert result["cuda_graphs"] is True
    assert all(t["median_ms"] > 0 for t in result["pieces_ms"]["tree_verify"].values())


def test_device_work_counts_each_kernel_once():
    """A GPU-bound matrix product: its kernel time as `device_work` reads it matches CUDA events' timing."""
    from heisd.profiling.timer import device_work

    a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    for _ in range(3):
        a @ a
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(5):
        a @ a
    end.record()
    torch.cuda.synchronize()
    events_ms = start.elapsed_time(end) / 5
    work = device_work({"mm": (lambda: a @ a, None)}, torch.device("cuda"))["mm"]
    assert 1 <= work.device_ops <= 3
    assert 0.8 * events_ms <= work.kernel_ms <= 1.2 * events_ms


def test_a_servers_warm_up_captures_the_pass_shapes_before_the_first_episode():
    """`serve --warmup-steps`: after the warm-up an AR episode with the same instruction (so the same
    prefill length) captures nothing: its first step costs what every later one does."""
    import numpy as np

    from heisd.cuda_graphs import captures
    from heisd.runtime.methods import MethodConfig, build_decoders
    from heisd.runtime.policy import VLAPolicy
    from heisd.serving.warmup import warm_up
    from heisd.targets.openvla.synthetic import random_openvla

    target = random_openvla("tiny", "cuda")
    policy = VLAPolicy(target, build_decoders(MethodConfig("ar", cuda_graphs=True), target))
    instruction = "put the bowl on the stove"
    assert warm_up(policy, 2, instruction)["graphs_captured"] >= 3  # the vision, the prefill, a decode step
    before, rng = captures(), np.random.default_rng(1)
    policy.reset(instruction)
    for i in range(3):
        frame = rng.integers(0, 256, (256, 256, 3), dtype=np.uint8)
        policy.act(frame, np.zeros(0, np.float32), np.array([0.0, 0.01 * i, 0.0]))
    assert captures() == before
    graphed = target._graphed_vision
    VLAPolicy(target, build_decoders(MethodConfig("ar", cuda_graphs=True), target))  # a second episode's policy
    assert target._graphed_vision is graphed  # keeps the vision's graphs


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_graphed_drafter_proposes_the_eager_trees(dtype):
    """`--cuda-graphs` replays the drafter's passes too: its trees are those of the same static-cache
    passes run eagerly (which the CPU tests hold to per-path forwards), proposal after proposal, with
    no new capture once each pass shape was seen."""
    from heisd.cuda_graphs import captures
    from heisd.decoding import DecodeState
    from heisd.drafter import Drafter, DrafterConfig, DrafterProposer, DrafterTarget, TreeConfig
    from heisd.drafter.passes import StaticDrafterPasses

    model, _ = on_cuda(0, "sdpa", dtype)
    bound = DrafterTarget(model, VOCAB, 256)
    torch.manual_seed(0)
    drafter = Drafter(DrafterConfig.for_target(bound), bound).eval()
    tree, n = TreeConfig(4, 3, 10), 7
    eager, graphed = DrafterProposer(drafter, tree), DrafterProposer(drafter, tree, cuda_graphs=True, n_tokens=n)
    eager.passes = StaticDrafterPasses(drafter, graphed.passes.max_len)
    verifier = Verifier(model)
    pre = verifier.prefill(prefix(0, 5).to("cuda", dtype))
    generator = torch.Generator().manual_seed(0)
    for round_ in range(2):
        if round_ == 1:
            before = captures()
        for k in range(1, n):
            emitted = torch.randint(VOCAB - 256, VOCAB, (k,), generator=generator).tolist()
            hidden = torch.randn(k, model.config.hidden_size, generator=generator).to("cuda", dtype)
            state = DecodeState(emitted, n, hidden, pre.hidden, verifier, pre.cache, {})
            a, b = eager.propose(state).tree, graphed.propose(state).tree
            assert torch.equal(a.tokens, b.tokens) and torch.equal(a.parents, b.parents), (round_, k)
    assert captures() == before
