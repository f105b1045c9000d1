"""The EAGLE-style draft model of the SpecVLA baseline (docs/design.md §2.11): one decoder layer
on target features.

Input pair i is (f_i, t_i): the target's lm_head input f_i that predicted token t_i, and t_i
itself. ``fc([embed(t_i) ; f_i])`` maps the pair to the model width, ONE ``LlamaDecoderLayer``
runs over the sequence, and its output predicts f_{i+1}, the lm_head input that will
predict t_{i+1}. The target's features are taken after its final norm (what
``Verifier`` hands out), so the drafter learns the normalized feature directly and its
output goes straight into the target's lm_head, with no norm in between (as in EAGLE).

The drafter borrows the target's embedding matrix and lm_head (frozen, never saved with
it): a drafter directory is bound to one target at load and refuses any other.
"""

from __future__ import annotations

import json
import warnings
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file
from torch import nn
from torch.nn import functional as F
from transformers import DynamicCache, LlamaConfig, PreTrainedModel
from transformers.models.llama.modeling_llama import LlamaDecoderLayer, LlamaRotaryEmbedding

from heisd.config_types import check_types
from heisd.decoding.vocab import ActionVocab
from heisd.errors import HeisdError
from heisd.targets.base import Target
from heisd.targets.vla.checkpoint import check_finite

CONFIG_FILE = "config.json"
WEIGHTS_FILE = "model.safetensors"


class DrafterError(HeisdError, ValueError):
    """A drafter directory that is missing, corrupt, or made for another target."""


@dataclass(frozen=True)
class DrafterTarget:
    """What the drafter borrows from its target (held by reference, not registered as parameters)."""

    llm: PreTrainedModel  # the target causal LM: its input embeddings and lm_head are used frozen
    vocab_size: int  # base vocab; action ids are its last n_bins ids
    n_bins: int  # action bins per dimension
    fingerprint: str | None = None  # identifies the target's weights; None for a bare LM (tests)

    @classmethod
    def from_target(cls, target: Target) -> DrafterTarget:
        spec = target.spec
        return cls(target.llm, spec.vocab_size, spec.n_bins, target.fingerprint())

    @property
    def hidden_size(self) -> int:
        return self.llm.get_input_embeddings().embedding_dim

    @property
    def padded_vocab_size(self) -> int:
        return self.llm.get_input_embeddings().num_embeddings


@dataclass(frozen=True)
class DrafterConfig:
    hidden_size: int  # = the target's hidden size: the drafter reads and predicts target features
    vocab_size: int  # target's base vocab (action ids are its last n_bins ids)
    padded_vocab_size: int  # target's embedding / lm_head rows (pad ids are never drafted)
    n_bins: int  # action bins per dimension (the target's)
    n_heads: int = 4  # attention heads of the one decoder layer
    n_kv_heads: int = 4  # key/value heads (GQA when < n_heads)
    intermediate_size: int = 1024  # MLP width of the decoder layer
    rms_norm_eps: float = 1e-6  # decoder layer norms
    rope_theta: float = 10000.0  # RoPE base; positions count action tokens from 0
    max_positions: int = 64  # longest action context + draft depth
    target_fingerprint: str | None = None  # the target this drafter was trained against

    @classmethod
    def for_target(cls, target: DrafterTarget, **overrides: Any) -> DrafterConfig:
        """Copy the layer shape from the target's own decoder layers (EAGLE does the same)."""
        c = target.llm.config
        base = dict(
            hidden_size=target.hidden_size, vocab_size=target.vocab_size,
            padded_vocab_size=target.padded_vocab_size, n_bins=target.n_bins,
            n_heads=c.num_attention_heads, n_kv_heads=c.num_key_value_heads,
            intermediate_size=c.intermediate_size, rms_norm_eps=c.rms_norm_eps,
            rope_theta=float(c.rope_parameters["rope_theta"]), target_fingerprint=target.fingerprint,
        )
        return cls(**{**base, **overrides})

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> DrafterConfig:
        unknown = set(d) - {f.name for f in fields(cls)}
        if unknown:
            raise ValueError(f"unknown fields {sorted(unknown)}")
        check_types(cls, d, "DrafterConfig")
        return cls(**d)

    def llama_config(self) -> LlamaConfig:
        return LlamaConfig(
            hidden_size=self.hidden_size, intermediate_size=self.intermediate_size,
            num_attention_heads=self.n_heads, num_key_value_heads=self.n_kv_heads,
            max_position_embeddings=self.max_positions, rms_norm_eps=self.rms_norm_eps,
            rope_parameters={"rope_type": "default", "rope_theta": self.rope_theta},
            vocab_size=self.padded_vocab_size, attn_implementation="sdpa",
        )

    def check_target(self, target: DrafterTarget) -> list[str]:
        """Mismatches that make the drafter meaningless on ``target`` (fingerprint aside)."""
        pairs = [("hidden size", self.hidden_size, target.hidden_size),
                 ("vocab size", self.vocab_size, target.vocab_size),
                 ("padded vocab size", self.padded_vocab_size, target.padded_vocab_size),
                 ("action bins", self.n_bins, target.n_bins)]
        return [f"{name}: drafter {mine} vs target {theirs}" for name, mine, theirs in pairs if mine != theirs]


def additive_mask(allowed: torch.Tensor, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Bool [q, kv] -> additive float mask [1, 1, q, kv] (0 / finfo.min)."""
    mask = torch.zeros(allowed.shape, dtype=dtype).masked_fill_(~allowed, torch.finfo(dtype).min)
    return mask[None, None]


class Drafter(nn.Module):
    def __init__(self, config: DrafterConfig, target: DrafterTarget):
        super().__init__()
        problems = config.check_target(target)
        if problems:
            raise DrafterError("drafter does not fit the target: " + "; ".join(problems))
        self.config = config
        self.target = target  # a plain dataclass: its tensors stay out of parameters() and state_dict()
        llama = config.llama_config()
        self.fc = nn.Linear(2 * config.hidden_size, config.hidden_size)
        self.layer = LlamaDecoderLayer(llama, layer_idx=0)
        self.rotary = LlamaRotaryEmbedding(llama)
        weight = target.llm.get_input_embeddings().weight
        self.to(device=weight.device, dtype=weight.dtype)

    @property
    def first_action_id(self) -> int:
        return ActionVocab(self.config.vocab_size, self.config.n_bins).first_id

    def forward(
        self, features: torch.Tensor, tokens: torch.Tensor, positions: torch.Tensor,
        mask: torch.Tensor, cache: DynamicCache | None = None,
    ) -> torch.Tensor:
        """features [B, T, d], tokens [B, T], positions [B, T], additive mask [B|1, 1, T, past+T] -> [B, T, d]."""
        embeds = F.embedding(tokens, self.target.llm.get_input_embeddings().weight.detach())
        x = self.fc(torch.cat([embeds, features], dim=-1))
        return self.layer(x, attention_mask=mask.to(x.dtype), position_ids=positions, cache=cache,
                          use_cache=cache is not None, position_embeddings=self.rotary(x, positions))

    def logits(self, features: torch.Tensor) -> torch.Tensor:
        """Full-vocabulary logits through the target's frozen lm_head."""
        return F.linear(features, self.target.llm.get_output_embeddings().weight.detach())

    def action_logits(self, features: torch.Tensor) -> torch.Tensor:
        """Logits over the n_bins action ids only (index i = token first_action_id + i): drafts are actions."""
        w = self.target.llm.get_output_embeddings().weight.detach()
        return F.linear(features, w[self.first_action_id : self.config.vocab_size])

    # ----- persistence -----
    def save_pretrained(self, directory: str | Path) -> None:
        """config.json + model.safetensors, renamed into place together (a reader never sees half a file)."""
        from heisd.storage import atomic_files

        with atomic_files(Path(directory), (CONFIG_FILE, WEIGHTS_FILE)) as tmp:
            tmp[CONFIG_FILE].write_text(json.dumps(asdict(self.config), indent=2))
            state = {k: v.detach().contiguous() for k, v in self.state_dict().items()}
            save_file(state, str(tmp[WEIGHTS_FILE]), metadata={"format": "pt"})

    @classmethod
    def from_pretrained(
        cls, directory: str | Path, target: DrafterTarget, allow_fingerprint_mismatch: bool = False
    ) -> Drafter:
        """Load and bind to ``target``; a drafter trained on other target weights is refused unless allowed."""
        directory = Path(directory)
        config_path, weights_path = directory / CONFIG_FILE, directory / WEIGHTS_FILE
        for path in (config_path, weights_path):
            if not path.is_file():
                raise DrafterError(f"no drafter file {path}")
        try:
            raw = json.loads(config_path.read_text())
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            raise DrafterError(f"corrupt {config_path}: {e}") from e
        if isinstance(raw, dict) and ("chunk" in raw or "model_type" in raw):  # a target's config.json
            raise DrafterError(f"{directory} is a target checkpoint, not a drafter: pass it as --target; "
                               "--drafter takes a directory made by heisd train-drafter")
        try:
            config = DrafterConfig.from_dict(raw)
        except (TypeError, ValueError) as e:
            raise DrafterError(f"corrupt {config_path}: {e}") from e
        problems = config.check_target(target)
        if problems:
            raise DrafterError(f"{config_path}: drafter made for another target: " + "; ".join(problems))
        if config.target_fingerprint != target.fingerprint:
            msg = (f"{config_path}: drafter trained against target {config.target_fingerprint}, "
                   f"bound to target {target.fingerprint}")
            if not allow_fingerprint_mismatch:
                raise DrafterError(msg + ": its drafts would be tuned to other weights; train one for this target "
                                   "(heisd train-drafter --target DIR) or pass the drafter made for it as --drafter")
            warnings.warn(msg, stacklevel=2)
        drafter = cls(config, target)
        try:
            weights = load_file(str(weights_path))
        except (SafetensorError, OSError) as e:
            raise DrafterError(f"corrupt {weights_path}: {e}") from e
        expected = {k: tuple(v.shape) for k, v in drafter.state_dict().items()}
        found = {k: tuple(v.shape) for k, v in weights.items()}
        if expected != found:
            diff = sorted(set(expected.items()) ^ set(found.items()))[:6]
            raise DrafterError(f"{weights_path} does not match {config_path}: differing tensors {diff}")
        for key, tensor in weights.items():
            check_finite(weights_path, key, tensor, DrafterError)
        drafter.load_state_dict(weights)
        return drafter.eval()
