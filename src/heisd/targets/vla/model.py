"""The target VLA: CoordConv CNN -> projector -> Llama, with OpenVLA's token conventions.

Prefix fed to the LLM as `inputs_embeds`:
    [image tokens (grid x grid per camera) | one proprioception token | prompt tokens]
then `chunk * action_dim` action tokens are decoded (Meta-World: 2 actions x 4 dims = 8).
The proprioception token is a linear projection of the normalized robot state (end-effector
xyz + gripper opening), as OpenVLA-OFT and LeRobot policies feed state to the backbone. A two-camera
target (`views` 2: LIBERO's agentview and wrist camera, stacked in one frame, `heisd.data.views`) has
a CNN per camera, as robomimic's policies do: the two views share nothing but the projector.
A FiLM target (`film`) conditions each CNN on the instruction (RT-1's FiLM-EfficientNet does so):
the prompt's mean token embedding, layer-normalized, sets a scale and a shift per channel of every stage.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn
from transformers import LlamaConfig, LlamaForCausalLM

from heisd.config_types import check_types
from heisd.cuda_graphs import GraphedCall, require_cuda
from heisd.errors import ConfigError
from heisd.targets.base import TargetSpec, TeacherForced
from heisd.targets.vla.action_tokenizer import ActionTokenizer
from heisd.targets.vla.text_tokenizer import TextTokenizer
from heisd.data.views import VIEWS
from heisd.targets.vla.vision import VisionEncoder, split_views


@dataclass
class VLAConfig:
    text_vocab_size: int  # ids of the text tokenizer (id 0 = pad); the action ids follow them
    action_dim: int = 4  # dims per action (Meta-World: dx dy dz grip)
    chunk: int = 2  # actions predicted per inference (action chunk)
    n_bins: int = 256  # action bins per dimension (OpenVLA: 256)
    state_dim: int = 4  # proprioception: end-effector xyz + gripper opening
    image_size: int = 64  # frames are area-resized to this square before the CNN
    vision_channels: tuple[int, ...] = (32, 64, 128, 128)  # one stride-2 stage each; grid = image_size / 2**stages
    shift_pad: int = 1  # DrQ random-shift pad in pixels at image_size (training only); 4 blurred where the puck is (BENCHMARKS 1.1)
    hidden_size: int = 192  # LLM width (192 trains 1.6x faster than 256 on CPU; see train-vla)
    n_layers: int = 4  # LLM decoder layers
    n_heads: int = 4  # attention heads (no GQA at this size)
    intermediate_size: int = 768  # LLM MLP width (4x)
    max_positions: int = 128  # longest sequence (prefix + action tokens)
    rope_theta: float = 10000.0  # RoPE base
    vocab_multiple: int = 64  # embedding rows padded to a multiple (OpenVLA: 32000 -> 32064); pad ids are never actions
    views: int = 1  # cameras read: 1 = agentview (mw: its camera), 2 = agentview and LIBERO's wrist camera
    # state values the target never reads (zeroed once normalized, for the LLM and the retrieval key alike):
    # without the gripper opening the frames alone decide when to close (`train-vla --no-gripper-state`)
    masked_state: tuple[int, ...] = ()
    # condition the CNNs on the instruction (`train-vla --film`); its layers start at zero, so a model
    # given them computes what it did before (a fine-tune may add them)
    film: bool = False

    @property
    def vocab_size(self) -> int:
        """Base vocabulary: text ids + action ids. Action ids are its last n_bins ids."""
        return self.text_vocab_size + self.n_bins

    @property
    def padded_vocab_size(self) -> int:
        m = self.vocab_multiple
        return (self.vocab_size + m - 1) // m * m

    @property
    def n_action_tokens(self) -> int:
        return self.chunk * self.action_dim

    @property
    def image_grid(self) -> int:
        return self.image_size // 2 ** len(self.vision_channels)

    @property
    def n_image_tokens(self) -> int:
        return self.views * self.image_grid ** 2

    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["vision_channels"] = list(self.vision_channels)
        if self.views == 1:  # written only when two: a one-camera checkpoint's config and fingerprint stay as they were
            del d["views"]
        if self.masked_state:  # likewise written only when some are masked
            d["masked_state"] = list(self.masked_state)
        else:
            del d["masked_state"]
        if not self.film:  # and FiLM only when on
            del d["film"]
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "VLAConfig":
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = set(d) - known
        if unknown:
            raise ValueError(f"unknown VLAConfig fields: {sorted(unknown)}")
        check_types(cls, d, "VLAConfig")
        d = dict(d)
        for key in ("vision_channels", "masked_state"):
            if key in d:
                d[key] = tuple(d[key])
        return cls(**d)

    def validate(self) -> None:
        if self.chunk < 1:
            raise ValueError(f"chunk must be >= 1 action, got {self.chunk}")
        if self.n_image_tokens + 1 + self.n_action_tokens >= self.max_positions:
            raise ValueError(f"{self.n_image_tokens} image tokens, the state token and {self.n_action_tokens} action "
                             f"tokens leave no room for the prompt in max_positions {self.max_positions}")
        if self.image_size % 2 ** len(self.vision_channels) or self.image_grid < 1:
            raise ValueError(f"image_size {self.image_size} not divisible by 2**{len(self.vision_channels)}")
        if self.views not in VIEWS:
            raise ValueError(f"views must be one of {VIEWS} (agentview, and the wrist camera), got {self.views}")
        if len(set(self.masked_state)) != len(self.masked_state) or not all(
                0 <= i < self.state_dim for i in self.masked_state):
            raise ValueError(f"masked_state must name distinct state values in [0, {self.state_dim}), "
                             f"got {list(self.masked_state)}")
        if self.hidden_size % self.n_heads:
            raise ValueError(f"hidden_size {self.hidden_size} not divisible by n_heads {self.n_heads}")


@dataclass
class NormStats:
    """The action bins' ends, named q01/q99 as OpenVLA's (with `absmax` bounds, -m and m: `ActionStats.bounds`;
    `extra["action_bounds"]` says which), and the state mean/std (what the state token sees)."""

    q01: np.ndarray
    q99: np.ndarray
    state_mean: np.ndarray
    state_std: np.ndarray
    extra: dict[str, Any] = dataclasses.field(default_factory=dict)  # e.g. action mean/std/min/max, for reference

    def to_dict(self) -> dict[str, Any]:
        core = {k: np.asarray(getattr(self, k), dtype=np.float64).tolist() for k in ("q01", "q99", "state_mean", "state_std")}
        return {**core, "extra": self.extra}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "NormStats":
        arrays = {k: np.asarray(d[k], dtype=np.float64) for k in ("q01", "q99", "state_mean", "state_std")}
        for key, values in arrays.items():
            if values.ndim != 1 or not np.isfinite(values).all():
                raise ValueError(f"norm stats {key} must be a list of finite numbers, got {d[key]}")
        if (arrays["state_std"] <= 0).any():
            raise ValueError(f"norm stats state_std must be > 0, got {d['state_std']}")
        return cls(**arrays, extra=d.get("extra", {}))


class VLA(nn.Module):
    def __init__(self, config: VLAConfig, norm_stats: NormStats, text_tokenizer: TextTokenizer):
        super().__init__()
        config.validate()
        if text_tokenizer.vocab_size != config.text_vocab_size:
            raise ValueError(f"tokenizer has {text_tokenizer.vocab_size} ids, config says {config.text_vocab_size}")
        if len(norm_stats.q01) != config.action_dim or len(norm_stats.state_mean) != config.state_dim:
            raise ValueError("norm stats do not match the config's action_dim / state_dim")
        self.config = config
        self.norm_stats = norm_stats
        self.text_tokenizer = text_tokenizer
        self.action_tokenizer = ActionTokenizer(config.vocab_size, norm_stats.q01, norm_stats.q99, config.n_bins)
        d = config.hidden_size
        self.vision = VisionEncoder(config.vision_channels, config.image_size, config.shift_pad)
        # the wrist camera's own CNN (None for agentview alone, which keeps older checkpoints' keys)
        self.wrist_vision = (VisionEncoder(config.vision_channels, config.image_size, config.shift_pad)
                             if config.views == 2 else None)
        # OpenVLA-style MLP projector from vision features to the LLM width
        self.projector = nn.Sequential(nn.Linear(self.vision.out_dim, d), nn.GELU(), nn.Linear(d, d))
        self.state_proj = nn.Linear(config.state_dim, d)
        self.llm = LlamaForCausalLM(LlamaConfig(
            vocab_size=config.padded_vocab_size, hidden_size=d, intermediate_size=config.intermediate_size,
            num_hidden_layers=config.n_layers, num_attention_heads=config.n_heads,
            num_key_value_heads=config.n_heads, max_position_embeddings=config.max_positions,
            rope_parameters={"rope_type": "default", "rope_theta": config.rope_theta},
            pad_token_id=text_tokenizer.pad_id, bos_token_id=None, eos_token_id=None,
            tie_word_embeddings=False,
        ))
        # not persistent: norm_stats.json is the single record of these numbers
        self.register_buffer("state_mean", torch.tensor(norm_stats.state_mean, dtype=torch.float32), persistent=False)
        self.register_buffer("state_std", torch.tensor(norm_stats.state_std, dtype=torch.float32), persistent=False)
        self.register_buffer("state_read", torch.ones(config.state_dim), persistent=False)
        self.mask_state(config.masked_state)
        # per camera: the prompt's mean embedding -> LayerNorm -> FiLM values; made last, as a fine-tune adds them, so that
        # the parameters keep one order (an optimizer's saved state follows it)
        self.film: nn.ModuleList | None = None
        if config.film:
            self.add_film()
        self._pinned_fingerprint: str | None = None  # see pin_fingerprint

    @property
    def spec(self) -> TargetSpec:
        """This model as a `heisd.targets.Target`."""
        c = self.config
        return TargetSpec(n_action_tokens=c.n_action_tokens, action_dim=c.action_dim, chunk=c.chunk,
                          vocab_size=c.vocab_size, n_bins=c.n_bins, hidden_size=c.hidden_size,
                          image_size=c.image_size, state_dim=c.state_dim, pad_id=self.text_tokenizer.pad_id,
                          views=c.views)

    def rebin_actions(self, low: np.ndarray, high: np.ndarray, extra: dict[str, Any]) -> None:
        """New action bins ending at `low` and `high` (a fine-tune onto other actions: the same tokens, which it
        relearns): the norm stats and the tokenizer together; the state normalization stays."""
        self.norm_stats = dataclasses.replace(self.norm_stats, q01=low, q99=high, extra=extra)
        self.action_tokenizer = ActionTokenizer(self.config.vocab_size, low, high, self.config.n_bins)

    def add_film(self) -> None:
        """Condition the CNNs on the instruction from now on (`VLAConfig.film`), with FiLM layers at zero:
        until trained they change nothing. A model that has them keeps them."""
        if self.film is None:
            self.config.film = True
            d = self.config.hidden_size
            # normalized first: the prompts' mean embeddings differ by about 0.1 in norm (the shared template
            # dominates them), too little for the zero-initialized layer to learn from at a fine-tune's rate
            self.film = nn.ModuleList(nn.Sequential(nn.LayerNorm(d), nn.Linear(d, enc.film_dim))
                                      for enc in self._encoders())
            for layer in self.film:
                nn.init.zeros_(layer[1].weight)
                nn.init.zeros_(layer[1].bias)
            self.film.to(self.state_proj.weight)

    # ----- prefix -----
    def use_cuda_graphs(self) -> None:
        """Replay the vision CNN as a CUDA graph per frame batch shape (inference); the graphs already
        captured are kept (each policy of a server asks again)."""
        if self.film is not None:
            raise ConfigError("CUDA graphs (--cuda-graphs) replay the vision CNN with fixed inputs; this target's "
                              "CNN is conditioned on the instruction (FiLM) and is not graphed: run without them")
        require_cuda(self.vision.coords.device, "the target")
        for encoder in self._encoders():
            if encoder.graphed is None:
                encoder.graphed = GraphedCall(encoder.net)

    def _encoders(self) -> list[VisionEncoder]:
        return [self.vision] if self.wrist_vision is None else [self.vision, self.wrist_vision]

    def feature_maps(self, images: torch.Tensor, prompt_ids: torch.Tensor | None = None) -> list[torch.Tensor]:
        """uint8 [B, V*H, W, 3] (V = `views` cameras stacked) -> V feature maps [B, C, grid, grid].
        `prompt_ids` [B or 1, L] (left-padded with the pad id) is what a FiLM target conditions on."""
        views = split_views(images, self.config.views)
        films = self._film_values(prompt_ids, len(images))
        return [enc.feature_map(v, f) for enc, v, f in zip(self._encoders(), views, films)]

    def _film_values(self, prompt_ids: torch.Tensor | None, batch: int) -> list[torch.Tensor | None]:
        if self.film is None:
            return [None] * self.config.views
        if prompt_ids is None:
            raise ValueError("this target's vision is conditioned on the instruction (FiLM): pass its prompt ids")
        ids = prompt_ids.to(self.state_mean.device)
        real = (ids != self.text_tokenizer.pad_id).unsqueeze(-1).to(self.state_proj.weight.dtype)
        embedded = self.llm.get_input_embeddings()(ids) * real
        instruction = (embedded.sum(1) / real.sum(1).clamp(min=1)).expand(batch, -1)
        return [layer(instruction) for layer in self.film]

    def _image_tokens(self, fmaps: list[torch.Tensor]) -> torch.Tensor:
        return self.projector(torch.cat([f.flatten(2).transpose(1, 2) for f in fmaps], dim=1))

    def image_tokens(self, images: torch.Tensor, prompt_ids: torch.Tensor | None = None) -> torch.Tensor:
        """uint8 [B, V*H, W, 3] -> [B, V*grid*grid, d]."""
        return self._image_tokens(self.feature_maps(images, prompt_ids))

    def state_token(self, state: torch.Tensor) -> torch.Tensor:
        """float [B, state_dim] (raw: ee xyz, gripper opening, goal xyz on mw) -> [B, 1, d]."""
        if state.shape[-1] != self.config.state_dim:
            raise ValueError(f"state has {state.shape[-1]} values, this model was trained with "
                             f"state_dim={self.config.state_dim} (a checkpoint from another benchmark version?)")
        return self.state_proj(self._normalized_state(state).to(self.state_proj.weight.dtype)).unsqueeze(1)

    @staticmethod
    def _state(state: torch.Tensor | None, batch: int) -> torch.Tensor:
        """None stands for no state values (`TargetSpec.state_input` of a model with state_dim 0)."""
        return torch.zeros(batch, 0) if state is None else state

    def mask_state(self, dims: tuple[int, ...]) -> None:
        """Stop reading the state values `dims` (`VLAConfig.masked_state`; fine-tuning may mask more).
        Bad `dims` are refused before anything changes."""
        dataclasses.replace(self.config, masked_state=tuple(dims)).validate()
        self.config.masked_state = tuple(dims)
        self.state_read.fill_(1.0)
        self.state_read[list(dims)] = 0.0

    def _normalized_state(self, state: torch.Tensor) -> torch.Tensor:
        normalized = (state.to(self.state_mean.device).float() - self.state_mean.float()) / self.state_std.float()
        return normalized * self.state_read

    def prefix_embeds(self, images: torch.Tensor, prompt_ids: torch.Tensor,
                      state: torch.Tensor | None) -> torch.Tensor:
        """[image tokens | state token | prompt] embeddings, [B, P, d]; P = grid^2 + 1 + L."""
        prompt = self.llm.get_input_embeddings()(prompt_ids.to(self.state_mean.device))
        state_token = self.state_token(self._state(state, len(images)))
        return torch.cat([self.image_tokens(images, prompt_ids), state_token, prompt], dim=1)

    def retrieval_key(self, images: torch.Tensor, state: torch.Tensor | None,
                      prompt_ids: torch.Tensor | None = None) -> torch.Tensor:
        """uint8 [B, V*H, W, 3] + state [B, state_dim] -> [B, V*4*C + state_dim], the retrieval key
        (a FiLM target needs the prompt ids too)."""
        return self._key(self.feature_maps(images, prompt_ids), self._state(state, len(images)))

    def _key(self, fmaps: list[torch.Tensor], state: torch.Tensor) -> torch.Tensor:
        # The CNN features pooled on a 2x2 grid (where the object sits separates otherwise
        # similar frames), at unit norm, beside the normalized state at about unit norm: a
        # neighbour must also agree on where the arm and the goal are. On held-out frames the
        # top-1 draft passed the group check 0.76 of the time with this key, 0.60 with vision alone.
        pooled = torch.cat([nn.functional.adaptive_avg_pool2d(f, 2).flatten(1) for f in fmaps], dim=1)
        vision = nn.functional.normalize(pooled, dim=1)
        state = self._normalized_state(state) / self.config.state_dim ** 0.5
        return torch.cat([vision.float(), state], dim=1)

    def encode_observation(self, images: torch.Tensor, prompt_ids: torch.Tensor,
                           state: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
        """One vision pass for a control step: (prefix embeds [B, P, d], retrieval key [B, Dk]).

        Same values as `prefix_embeds` and `retrieval_key`, without running the CNN twice.
        """
        fmaps, state = self.feature_maps(images, prompt_ids), self._state(state, len(images))
        prompt = self.llm.get_input_embeddings()(prompt_ids.to(self.state_mean.device))
        prefix = torch.cat([self._image_tokens(fmaps), self.state_token(state), prompt], dim=1)
        return prefix, self._key(fmaps, state)

    def encode_prompt(self, instruction: str) -> torch.Tensor:
        """Instruction -> prompt ids [1, L] (OpenVLA's prompt template)."""
        return torch.tensor([self.text_tokenizer.encode_prompt(instruction)], dtype=torch.long)

    # ----- training / validation -----
    def teacher_forced(
        self, images: torch.Tensor, prompt_ids: torch.Tensor, state: torch.Tensor,
        action_ids: torch.Tensor, prompt_mask: torch.Tensor | None = None,
    ) -> TeacherForced:
        """One pass over [prefix | action_ids[:, :-1]]; returns what predicts each action token.

        `prompt_mask` [B, L] (1 = real token) allows a batch of different prompt lengths,
        LEFT-padded with the pad id; positions skip the pads, so each row computes exactly
        what its unpadded prefix would.
        """
        n = action_ids.shape[1]
        emb = torch.cat([self.prefix_embeds(images, prompt_ids, state),
                         self.llm.get_input_embeddings()(action_ids[:, :-1])], dim=1)
        kwargs: dict[str, torch.Tensor] = {}
        if prompt_mask is not None:
            b, n_img = emb.shape[0], self.config.n_image_tokens + 1
            ones = torch.ones(b, 1, dtype=torch.long, device=emb.device)
            mask = torch.cat([ones.expand(b, n_img), prompt_mask.long(), ones.expand(b, n - 1)], dim=1)
            kwargs = {"attention_mask": mask, "position_ids": (mask.cumsum(1) - 1).clamp(min=0)}
        hidden = self.llm.model(inputs_embeds=emb, use_cache=False, **kwargs).last_hidden_state[:, -n:]
        return TeacherForced(logits=self.llm.lm_head(hidden), hidden=hidden)

    # ----- persistence -----
    def save_pretrained(self, directory: str | Path) -> None:
        from heisd.targets.vla.checkpoint import save_vla

        save_vla(self, Path(directory))

    @classmethod
    def from_pretrained(cls, directory: str | Path) -> "VLA":
        from heisd.targets.vla.checkpoint import load_vla

        return load_vla(Path(directory))

    def fingerprint(self) -> str:
        from heisd.targets.vla.checkpoint import fingerprint

        return self._pinned_fingerprint or fingerprint(self)

    def pin_fingerprint(self) -> None:
        """Keep the fingerprint of the weights as they are now: a checkpoint cast to another dtype
        for inference stays the target its drafters and datastores were made for."""
        self._pinned_fingerprint = self.fingerprint()
