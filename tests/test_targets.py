"""Both targets (the small VLA and OpenVLA) through the one `Target` interface, the same checks for each."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from helpers import tiny_vla

from heisd.decoding import DecodeConfig, SpeculativeDecoder, Verifier
from heisd.targets import Target, TargetSpec


@pytest.fixture(params=["small-vla", "openvla"])
def target(request):
    if request.param == "small-vla":
        return tiny_vla()
    return request.getfixturevalue("tiny_openvla")


def observation(target, batch: int = 2):
    spec = target.spec
    rng = np.random.default_rng(1)
    images = torch.from_numpy(rng.integers(0, 256, (batch, 48, 64, 3), dtype=np.uint8))
    state = torch.from_numpy(rng.normal(size=(batch, spec.state_dim)).astype(np.float32)) if spec.state_dim else None
    return images, target.encode_prompt("put the bowl on the stove").expand(batch, -1), state


def test_both_targets_implement_the_interface(target):
    assert isinstance(target, Target)
    spec = target.spec
    assert isinstance(spec, TargetSpec)
    assert spec.n_action_tokens == spec.chunk * spec.action_dim
    embeddings = target.llm.get_input_embeddings()
    assert embeddings.embedding_dim == spec.hidden_size and embeddings.num_embeddings >= spec.vocab_size


def test_observation_to_prefix_key_and_actions(target):
    spec = target.spec
    images, prompt, state = observation(target)
    assert prompt.shape[0] == 2 and prompt.dtype == torch.long
    with torch.no_grad():
        prefix, key = target.encode_observation(images, prompt, state)
        torch.testing.assert_close(target.prefix_embeds(images, prompt, state), prefix)
        torch.testing.assert_close(target.retrieval_key(images, state), key)
    assert prefix.shape[0] == 2 and prefix.shape[2] == spec.hidden_size and key.shape[0] == 2
    assert not torch.equal(key[0], key[1])  # the key sees the frame
    decoder = SpeculativeDecoder(Verifier(target.llm), DecodeConfig(spec.n_action_tokens, spec.vocab_size, spec.n_bins))
    tokens = decoder.decode(prefix[:1]).tokens
    actions = target.action_tokenizer.decode(np.asarray(tokens).reshape(spec.chunk, spec.action_dim))
    assert actions.shape == (spec.chunk, spec.action_dim) and np.isfinite(actions).all()
    np.testing.assert_array_equal(target.action_tokenizer.encode(actions).reshape(-1), tokens)


def test_teacher_forced_pass_reproduces_greedy_decoding(target):
    spec = target.spec
    images, prompt, state = observation(target, batch=1)
    with torch.no_grad():
        prefix, _ = target.encode_observation(images, prompt, state)
        tokens = SpeculativeDecoder(Verifier(target.llm), DecodeConfig(spec.n_action_tokens, spec.vocab_size,
                                                                       spec.n_bins)).decode(prefix).tokens
        forced = target.teacher_forced(images, prompt, state, torch.tensor([tokens]))
    assert forced.hidden.shape == (1, spec.n_action_tokens, spec.hidden_size)
    assert forced.logits.argmax(-1)[0].tolist() == tokens


def test_fingerprint_identifies_the_weights(target):
    first = target.fingerprint()
    assert isinstance(first, str) and len(first) == 64 and target.fingerprint() == first


def test_load_target_in_bfloat16_keeps_the_checkpoints_identity(tmp_path, tiny_openvla_dir):
    """--dtype bfloat16 for either kind: it decodes action tokens, and its drafters and datastores
    (bound to the fingerprint) are still the stored checkpoint's."""
    from heisd.targets import load_target

    tiny_vla().save_pretrained(tmp_path / "vla")
    for directory, key in ((tmp_path / "vla", None), (tiny_openvla_dir, "libero_spatial")):
        full = load_target(directory, unnorm_key=key)
        half = load_target(directory, dtype=torch.bfloat16, unnorm_key=key)
        assert half.llm.dtype == torch.bfloat16 and half.fingerprint() == full.fingerprint()
        images, prompt, state = observation(half, batch=1)
        spec = half.spec
        with torch.no_grad():
            prefix, key_vector = half.encode_observation(images, prompt, state)
            tokens = SpeculativeDecoder(Verifier(half.llm), DecodeConfig(spec.n_action_tokens, spec.vocab_size,
                                                                         spec.n_bins)).decode(prefix).tokens
        assert prefix.dtype == torch.bfloat16 and torch.isfinite(key_vector).all()
        assert all(spec.vocab_size - spec.n_bins <= t < spec.vocab_size for t in tokens)


def test_cuda_graphs_are_refused_off_cuda(target):
    from heisd.errors import ConfigError

    with pytest.raises(ConfigError, match=r"CUDA graphs \(--cuda-graphs\) need the target on a CUDA device \(--device cuda\); it is on cpu"):
        target.use_cuda_graphs()
