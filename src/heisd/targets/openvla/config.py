"""OpenVLA's config.json and preprocessor_config.json, parsed into typed configs.

The files are the ones `transformers` 4.40 writes for `OpenVLAConfig` (openvla/openvla:
prismatic/extern/hf/configuration_prismatic.py). Its `text_config` holds only the values
that differ from `LlamaConfig`'s defaults of that version, so those defaults are spelled
out here rather than taken from whatever `transformers` is installed.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

from heisd.targets.base import resolve_unnorm_key
from heisd.targets.vla.checkpoint import CheckpointError
from heisd.targets.vla.checkpoint import read_json as read_checkpoint_json  # one JSON reader for every checkpoint kind

CONFIG_FILE = "config.json"
PREPROCESSOR_FILE = "preprocessor_config.json"
# a fine-tuned checkpoint's action statistics: when present they replace config.json's norm_stats,
# as OpenVLA's eval loads them (experiments/robot/openvla_utils.py, get_vla)
DATASET_STATISTICS_FILE = "dataset_statistics.json"

# LlamaConfig() of transformers 4.40.1 (which wrote openvla-7b): the keys that shape the model.
LLAMA_TEXT_DEFAULTS: dict[str, Any] = {
    "vocab_size": 32000, "hidden_size": 4096, "intermediate_size": 11008, "num_hidden_layers": 32,
    "num_attention_heads": 32, "num_key_value_heads": None, "hidden_act": "silu",
    "max_position_embeddings": 2048, "rms_norm_eps": 1e-6, "rope_theta": 10000.0, "rope_scaling": None,
    "attention_bias": False, "tie_word_embeddings": False, "bos_token_id": 1, "eos_token_id": 2,
}
# text_config keys that describe the file, not the model
_TEXT_IGNORED = {"model_type", "torch_dtype", "dtype", "architectures", "_name_or_path", "transformers_version"}


def read_json(path: Path) -> dict[str, Any]:
    return read_checkpoint_json(path, missing=f"OpenVLA checkpoint {path.parent} lacks {path.name}")


def _require(data: dict[str, Any], key: str, path: Path) -> Any:
    if key not in data:
        raise CheckpointError(f"{path} lacks key {key!r}")
    return data[key]


@dataclass(frozen=True)
class ActionStats:
    """One dataset's action statistics (`norm_stats[key]["action"]`)."""

    key: str  # the norm_stats key they came from
    q01: np.ndarray  # 1st percentile per dim: the low end of the bins
    q99: np.ndarray  # 99th percentile per dim: the high end
    mask: np.ndarray  # bool per dim: False = not normalized (OpenVLA: the gripper)


@dataclass(frozen=True)
class OpenVLAConfig:
    timm_model_ids: tuple[str, ...]  # one per vision backbone (fused: DINOv2, then SigLIP)
    image_sizes: tuple[int, ...]  # input side per backbone
    timm_override_act_layers: tuple[str | None, ...]  # MLP activation per backbone (None = the model's own)
    timm_model_kwargs: tuple[dict[str, Any], ...]  # explicit ViT kwargs per backbone ({} = as the id says)
    use_fused_vision_backbone: bool  # two backbones, patch features concatenated
    text_config: dict[str, Any]  # LlamaConfig kwargs, 4.40 defaults filled in
    pad_to_multiple_of: int  # embedding rows beyond the tokenizer's base vocabulary
    n_action_bins: int  # action bins per dimension
    norm_stats: dict[str, Any] = field(repr=False)  # dataset key -> {"action": {q01, q99, mask, ...}, ...}
    source: Path | None = None  # the config.json read, for error messages
    norm_stats_source: Path | None = None  # the file norm_stats came from (config.json or dataset_statistics.json)

    @property
    def vocab_size(self) -> int:
        """Base vocabulary (OpenVLA: 32064 - 64 = 32000); action ids are its last n_action_bins ids."""
        return int(self.text_config["vocab_size"]) - self.pad_to_multiple_of

    @property
    def hidden_size(self) -> int:
        return int(self.text_config["hidden_size"])

    @classmethod
    def from_dict(cls, data: dict[str, Any], source: Path | None = None) -> OpenVLAConfig:
        where = source or Path(CONFIG_FILE)
        ids = tuple(_require(data, "timm_model_ids", where))
        fused = bool(_require(data, "use_fused_vision_backbone", where))
        n = 2 if fused else 1
        if len(ids) != n:
            raise CheckpointError(f"{where}: use_fused_vision_backbone={fused} needs {n} timm_model_ids, "
                                  f"got {len(ids)}")
        text = dict(_require(data, "text_config", where))
        model_type = text.get("model_type", "llama")
        if model_type != "llama":
            raise CheckpointError(f"{where}: text_config.model_type {model_type!r}: "
                                  f"only Llama LLM backbones are supported")
        text = {**LLAMA_TEXT_DEFAULTS, **{k: v for k, v in text.items() if k not in _TEXT_IGNORED}}
        acts = tuple(data.get("timm_override_act_layers", [None] * n))
        kwargs = tuple(dict(k) for k in data.get("timm_model_kwargs", [{}] * n))
        sizes = tuple(int(s) for s in _require(data, "image_sizes", where))
        for name, values in (("image_sizes", sizes), ("timm_override_act_layers", acts), ("timm_model_kwargs", kwargs)):
            if len(values) != n:
                raise CheckpointError(f"{where}: {name} has {len(values)} entries, expected {n}")
        config = cls(timm_model_ids=ids, image_sizes=sizes, timm_override_act_layers=acts, timm_model_kwargs=kwargs,
                     use_fused_vision_backbone=fused, text_config=text,
                     pad_to_multiple_of=int(data.get("pad_to_multiple_of", 0)),
                     n_action_bins=int(_require(data, "n_action_bins", where)),
                     norm_stats=dict(_require(data, "norm_stats", where)), source=source)
        if config.vocab_size < config.n_action_bins:
            raise CheckpointError(f"{where}: vocabulary {config.vocab_size} cannot hold "
                                  f"{config.n_action_bins} action ids")
        return config

    @classmethod
    def from_dir(cls, directory: Path) -> OpenVLAConfig:
        path, statistics = directory / CONFIG_FILE, directory / DATASET_STATISTICS_FILE
        data = read_json(path)
        if not statistics.is_file():
            return cls.from_dict(data, path)
        config = cls.from_dict({**data, "norm_stats": read_json(statistics)}, path)
        return replace(config, norm_stats_source=statistics)

    def action_stats(self, unnorm_key: str | None) -> ActionStats:
        """The statistics to de-normalize with. As OpenVLA's LIBERO eval: `KEY` falls back to
        `KEY_no_noops`; no key is fine only when there is exactly one."""
        keys = sorted(self.norm_stats)
        where = self.norm_stats_source or self.source or CONFIG_FILE
        if unnorm_key is None:
            if len(keys) != 1:
                raise CheckpointError(f"{where} has action statistics for {len(keys)} datasets; "
                                      f"choose one with --unnorm-key: {', '.join(keys)}")
            unnorm_key = keys[0]
        found = resolve_unnorm_key(unnorm_key, keys)
        if found is None:
            raise CheckpointError(f"unnorm key {unnorm_key!r} is not in {where}; available: {', '.join(keys)}")
        unnorm_key = found
        try:
            action = self.norm_stats[unnorm_key]["action"]
            q01 = np.asarray(action["q01"], dtype=np.float64)
            q99 = np.asarray(action["q99"], dtype=np.float64)
            mask = np.asarray(action.get("mask", np.ones_like(q01, dtype=bool)), dtype=bool)
        except (KeyError, TypeError) as e:
            raise CheckpointError(f"{where}: norm_stats[{unnorm_key!r}]['action'] lacks {e}") from e
        if not (q01.ndim == 1 and q01.shape == q99.shape == mask.shape):
            raise CheckpointError(f"{where}: norm_stats[{unnorm_key!r}] q01/q99/mask shapes differ: "
                                  f"{q01.shape} {q99.shape} {mask.shape}")
        return ActionStats(unnorm_key, q01, q99, mask)
