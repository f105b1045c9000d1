"""Our OpenVLA target against the public reference implementation's numbers on the tiny checkpoint.

tests/golden/openvla_reference_tiny.json was made by scripts/openvla_reference.py: the
reference's own modeling/processing files (openvla/openvla, prismatic/extern/hf) with its
pinned timm 0.9.16 and transformers 4.40.1, in a throwaway environment, on
`heisd tiny-openvla --seed 0`. Numbers only; none of its code is here.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np
import torch

from heisd.decoding import DecodeConfig, SpeculativeDecoder, Verifier

GOLDEN = json.loads((Path(__file__).parent / "golden" / "openvla_reference_tiny.json").read_text())


def test_the_golden_data_was_made_on_this_exact_checkpoint(tiny_openvla_dir):
    # if this fails, the tiny checkpoint's bytes changed: rerun scripts/openvla_reference.py
    hashes = {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(tiny_openvla_dir.iterdir())}
    assert hashes == GOLDEN["files"]


def test_prompt_pixels_features_tokens_and_actions_match_the_reference(tiny_openvla):
    spec = tiny_openvla.spec
    decoder = SpeculativeDecoder(Verifier(tiny_openvla.llm), DecodeConfig(spec.n_action_tokens, spec.vocab_size,
                                                                          spec.n_bins))
    assert tiny_openvla.parts.stats.key == GOLDEN["unnorm_key"]  # reached through the _no_noops fallback
    for case in GOLDEN["cases"]:
        rng = np.random.default_rng(case["seed"])
        image = torch.from_numpy(rng.integers(0, 256, (1, case["height"], case["width"], 3), dtype=np.uint8))
        prompt = tiny_openvla.encode_prompt(case["instruction"])
        assert prompt[0].tolist() == case["input_ids"] + [29871]  # the reference appends 29871 itself
        pixels = tiny_openvla.parts.preprocess(image)[0]
        np.testing.assert_allclose(pixels.mean(dim=(1, 2)).numpy(), case["pixel_mean_per_channel"], atol=1e-6)
        with torch.no_grad():
            features = tiny_openvla.image_features(image)[0]
            prefix, _ = tiny_openvla.encode_observation(image, prompt, None)
        np.testing.assert_allclose(float(features.mean()), case["projector_mean"], atol=1e-6)
        np.testing.assert_allclose(features[0, :8].numpy(), case["projector_patch0"], atol=1e-5)
        tokens = decoder.decode(prefix).tokens
        assert tokens == case["tokens"]
        np.testing.assert_allclose(tiny_openvla.action_tokenizer.decode(np.array(tokens)), case["action"], atol=1e-6)
