"""OpenVLA-shaped checkpoints with random weights: the file contents, and models built in memory.

`config_dict` writes the keys the real openvla-7b config.json has (model_type "openvla",
timm ids, image sizes, text_config with only non-default values, norm_stats ...). A shape
other than the real one is given as explicit ViT kwargs (`timm_model_kwargs`, ours) and a
smaller `text_config`. Random weights follow one rule per kind of tensor, chosen so the
random model behaves like a trained one where tests look: images change the output (the
LLM's attention is peaked), and the greedy tokens are action tokens (the lm_head rows of
all other ids are zero).
"""

from __future__ import annotations

import copy
import dataclasses
import json
import math
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import torch

from heisd.targets.openvla.load import ATTENTION, build_on_meta, finish, read_parts
from heisd.targets.openvla.model import OpenVLA
from heisd.targets.openvla.standin_tokenizer import BASE_VOCAB, save_standin_tokenizer

SHAPES: dict[str, dict[str, Any]] = {
    # the real model: the timm ids' own architectures, LlamaConfig defaults (Llama-2-7B)
    "7b": {"timm_model_kwargs": [{}, {}], "text_config": {}},
    # the tests' model: ViTs 32/48 wide, 3 blocks; a 2-layer Llama 64 wide (about 5 MB in bf16)
    "tiny": {"timm_model_kwargs": [{"embed_dim": 32, "depth": 3, "num_heads": 2},
                                   {"embed_dim": 48, "depth": 3, "num_heads": 2}],
             "text_config": {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
                             "num_attention_heads": 4, "num_key_value_heads": 4}},
    # a target this CPU can train (`train-vla --arch openvla`): 64 patches of 28 px (the real model: 256 of 14,
    # `--patch-size 14`), ViTs 64 wide with 2 blocks run, a 4-layer Llama 128 wide
    "small": {"timm_model_kwargs": [{"embed_dim": 64, "depth": 3, "num_heads": 2, "patch_size": 28},
                                    {"embed_dim": 64, "depth": 3, "num_heads": 2, "patch_size": 28}],
              "text_config": {"hidden_size": 128, "intermediate_size": 512, "num_hidden_layers": 4,
                              "num_attention_heads": 4, "num_key_value_heads": 4}},
}
TIMM_MODEL_IDS = ["vit_large_patch14_reg4_dinov2.lvd142m", "vit_so400m_patch14_siglip_224"]
IMAGE_SIZE = 224
PAD_TO_MULTIPLE_OF = 64


def _stats(q01: list[float], q99: list[float]) -> dict[str, Any]:
    lo, hi = np.asarray(q01), np.asarray(q99)
    return {"action": {"mean": ((lo + hi) / 2).tolist(), "std": ((hi - lo) / 4).tolist(),
                       "min": (lo * 1.5).tolist(), "max": (hi * 1.5).tolist(), "q01": q01, "q99": q99,
                       "mask": [True] * 6 + [False]},
            "num_transitions": 1000, "num_trajectories": 20}


# Two datasets, so that choosing one (and the `_no_noops` fallback) is exercised.
NORM_STATS = {
    "bridge_orig": _stats([-0.03, -0.04, -0.03, -0.1, -0.1, -0.2, 0.0], [0.03, 0.04, 0.04, 0.1, 0.1, 0.2, 1.0]),
    "libero_spatial_no_noops": _stats([-0.75, -0.6, -0.9, -0.1, -0.15, -0.2, 0.0],
                                      [0.9, 0.85, 0.95, 0.15, 0.2, 0.3, 1.0]),
}


def config_dict(shape: str) -> dict[str, Any]:
    """A fresh dict (callers may edit it) of config.json for `shape`."""
    spec = copy.deepcopy(SHAPES[shape])
    text = {"model_type": "llama", "pad_token_id": BASE_VOCAB, "torch_dtype": "bfloat16",
            "vocab_size": BASE_VOCAB + PAD_TO_MULTIPLE_OF, **spec["text_config"]}
    return {
        "arch_specifier": "no-align+fused-gelu-mlp", "architectures": ["OpenVLAForActionPrediction"],
        "hf_llm_id": "meta-llama/Llama-2-7b-hf", "image_resize_strategy": "resize-naive",
        "image_sizes": [IMAGE_SIZE, IMAGE_SIZE], "llm_backbone_id": "llama2-7b-pure", "llm_max_length": 2048,
        "model_type": "openvla", "n_action_bins": 256, "norm_stats": copy.deepcopy(NORM_STATS),
        "output_projector_states": False,
        "pad_to_multiple_of": PAD_TO_MULTIPLE_OF, "pad_token_id": BASE_VOCAB, "text_config": text,
        "timm_model_ids": list(TIMM_MODEL_IDS), "timm_override_act_layers": [None, None],
        "timm_model_kwargs": spec["timm_model_kwargs"], "torch_dtype": "bfloat16",
        "use_fused_vision_backbone": True, "vision_backbone_id": "dinosiglip-vit-so-224px",
    }


def preprocessor_dict() -> dict[str, Any]:
    """preprocessor_config.json as PrismaticImageProcessor saves it (DINOv2 view, then SigLIP view)."""
    means, stds = [[0.485, 0.456, 0.406], [0.5, 0.5, 0.5]], [[0.229, 0.224, 0.225], [0.5, 0.5, 0.5]]
    return {
        "image_processor_type": "PrismaticImageProcessor", "processor_class": "PrismaticProcessor",
        "image_resize_strategy": "resize-naive", "use_fused_vision_backbone": True,
        "input_sizes": [[3, IMAGE_SIZE, IMAGE_SIZE]] * 2, "interpolations": ["bicubic", "bicubic"],
        "means": means, "stds": stds,
        "tvf_resize_params": [{"antialias": True, "interpolation": 3, "max_size": None,
                               "size": [IMAGE_SIZE, IMAGE_SIZE]}] * 2,
        "tvf_crop_params": [{"output_size": [IMAGE_SIZE, IMAGE_SIZE]}] * 2,
        "tvf_normalize_params": [{"inplace": False, "mean": m, "std": s} for m, s in zip(means, stds)],
        "tvf_do_letterbox": False, "tvf_letterbox_fill": None,
    }


def random_tensor(name: str, shape: tuple[int, ...], generator: torch.Generator, action_ids: range) -> torch.Tensor:
    """One float32 tensor for the parameter `name` (module or file key), on the generator's device."""
    x = torch.randn(shape, generator=generator, device=generator.device)
    if name.endswith((".gamma", ".scale_factor")):  # LayerScale: trained ones are O(0.1-1), not 1e-5
        return 0.3 + 0.7 * torch.rand(shape, generator=generator, device=generator.device)
    if name.endswith(".bias"):
        return 0.02 * x
    if len(shape) == 1:  # norm weights
        return 1.0 + 0.1 * x
    if name.endswith("lm_head.weight"):  # wide margins, and only action ids can win
        keep = torch.zeros(shape[0], 1, device=x.device)
        keep[action_ids.start : action_ids.stop] = 1.0
        return 3.0 * x * keep
    if name.endswith(("embed_tokens.weight", "pos_embed", "cls_token", "reg_token", "latent")):
        return x if name.endswith("embed_tokens.weight") else 0.5 * x
    x = x / math.sqrt(math.prod(shape[1:]))  # unit-variance activations through each layer
    if name.endswith(("q_proj.weight", "k_proj.weight")):
        # peaked attention: uniform attention over 256 patches would average the image away
        return 4.0 * x
    return x


def random_tensors(shapes: dict[str, tuple[int, ...]], seed: int, device: torch.device, dtype: torch.dtype,
                   action_ids: range) -> dict[str, torch.Tensor]:
    generator = torch.Generator(device=device).manual_seed(seed)
    return {k: random_tensor(k, shapes[k], generator, action_ids).to(dtype) for k in sorted(shapes)}


def random_openvla(shape: str, device: str | torch.device = "cpu", dtype: torch.dtype = torch.float32,
                   seed: int = 0, attn_implementation: str = ATTENTION) -> OpenVLA:
    """An OpenVLA of `shape` with random weights, built directly on `device` (nothing downloaded or written
    except the small tokenizer and config files, in a temporary directory)."""
    device = torch.device(device)
    with tempfile.TemporaryDirectory() as tmp:
        directory = Path(tmp)
        (directory / "config.json").write_text(json.dumps(config_dict(shape)))
        (directory / "preprocessor_config.json").write_text(json.dumps(preprocessor_dict()))
        save_standin_tokenizer(directory)
        parts = read_parts(directory, unnorm_key=next(iter(NORM_STATS)))
    model = build_on_meta(parts, attn_implementation)
    shapes = {k: tuple(v.shape) for k, v in model.state_dict().items()}
    vocab = parts.config.vocab_size
    tensors = random_tensors(shapes, seed, device, dtype, range(vocab - parts.config.n_action_bins, vocab))
    model.load_state_dict(tensors, strict=True, assign=True)
    model.parts = dataclasses.replace(parts, identity_files=(), identity_note=f"random OpenVLA {shape} seed {seed}")
    return finish(model, device)
