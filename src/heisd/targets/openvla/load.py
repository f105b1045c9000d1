"""Loading an OpenVLA Hugging Face checkpoint directory into `OpenVLA`, with no remote code.

The model is built on the meta device (no memory, no init), every file header is checked
against it, then each tensor is read straight to the device in the requested dtype and
assigned in place: a 7B checkpoint needs its size in device memory and little else.
"""

from __future__ import annotations

from pathlib import Path

import torch
from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

from heisd.targets.openvla.config import DATASET_STATISTICS_FILE, PREPROCESSOR_FILE, OpenVLAConfig, read_json
from heisd.targets.openvla.model import OpenVLA, OpenVLAParts
from heisd.targets.openvla.preprocess import ImagePreprocessor
from heisd.targets.openvla.prompt import PromptEncoder
from heisd.targets.openvla.vit import unused_shapes
from heisd.targets.openvla.weights import check_keys, load_tensors, read_headers, to_file_key, weight_files
from heisd.targets.vla.checkpoint import CheckpointError

ATTENTION = "sdpa"  # LLM attention kernel (takes the verifier's additive float tree masks)
# tokenizer files hashed into the fingerprint when present (the prompt ids depend on them)
_TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "special_tokens_map.json",
                    "added_tokens.json")


def read_parts(directory: Path, unnorm_key: str | None, weights: list[str] | tuple[str, ...] = ()) -> OpenVLAParts:
    """Everything but the weights; `weights` are the weight files hashed into the fingerprint."""
    config = OpenVLAConfig.from_dir(directory)
    preprocess = ImagePreprocessor.from_dict(read_json(directory / PREPROCESSOR_FILE), directory / PREPROCESSOR_FILE)
    identity = [directory / "config.json", directory / PREPROCESSOR_FILE]
    identity += [directory / f for f in (DATASET_STATISTICS_FILE, *_TOKENIZER_FILES) if (directory / f).is_file()]
    identity += [directory / f for f in weights]
    return OpenVLAParts(config, preprocess, PromptEncoder.from_dir(directory), config.action_stats(unnorm_key),
                        identity_files=tuple(identity))


def build_on_meta(parts: OpenVLAParts, attn_implementation: str = ATTENTION) -> OpenVLA:
    try:
        with torch.device("meta"):
            return OpenVLA(parts, attn_implementation)
    except ValueError as e:  # an architecture the config describes badly
        raise CheckpointError(f"{parts.config.source}: {e}") from e


def file_shapes(model: OpenVLA) -> tuple[dict[str, tuple[int, ...]], dict[str, tuple[int, ...]]]:
    """(keys the model needs, keys a real file also holds that are never run), as file keys -> shapes."""
    expected = {to_file_key(k): tuple(v.shape) for k, v in model.state_dict().items()}
    ignorable: dict[str, tuple[int, ...]] = {}
    backbone = model.vision_backbone
    for prefix, featurizer in (("featurizer", backbone.featurizer), ("fused_featurizer", backbone.fused_featurizer)):
        if featurizer is not None:
            for k, shape in unused_shapes(featurizer.spec).items():
                ignorable[to_file_key(f"vision_backbone.{prefix}.{k}")] = shape
    return expected, ignorable


def finish(model: OpenVLA, device: torch.device) -> OpenVLA:
    """After `load_state_dict(assign=True)`: make the non-persistent buffers and check nothing stayed on meta."""
    llm = model.language_model
    with torch.device(device):
        llm.model.rotary_emb = LlamaRotaryEmbedding(config=llm.config)
    left = [n for n, t in [*model.named_parameters(), *model.named_buffers()] if t.is_meta]
    if left:
        raise RuntimeError(f"tensors left uninitialized after loading: {left[:5]}")
    return model.eval()


def load_openvla(directory: str | Path, device: str | torch.device = "cpu", dtype: torch.dtype = torch.float32,
                 unnorm_key: str | None = None, attn_implementation: str = ATTENTION) -> OpenVLA:
    directory, device = Path(directory), torch.device(device)
    files = weight_files(directory)
    model = build_on_meta(read_parts(directory, unnorm_key, files), attn_implementation)
    found = read_headers(directory, files)
    expected, ignorable = file_shapes(model)
    check_keys(directory, expected, ignorable, found)
    tensors = load_tensors(directory, {k: found[k] for k in expected}, device, dtype)
    model.load_state_dict(tensors, strict=True, assign=True)
    return finish(model, device)
