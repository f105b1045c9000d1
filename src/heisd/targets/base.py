"""What every target VLA offers the rest of heisd (docs/design.md §5.1): one interface, two implementations.

A target turns an observation (camera frames, instruction, optional proprioception) into
prefix embeddings for a `transformers` causal LM and reads action tokens back. The decode
loop only needs `llm` (for the `Verifier`) and `spec`; the policy, the datastore and
drafter builders, calibration and replay need the rest. The small CNN VLA
(`heisd.targets.vla.VLA`) and OpenVLA (`heisd.targets.openvla.OpenVLA`) both implement it, so the
difference between them lives in the two classes and nowhere else.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Protocol, runtime_checkable

import numpy as np
import torch
from transformers import PreTrainedModel


@dataclass(frozen=True)
class TargetSpec:
    """The numbers the code around a target needs, in one place."""

    n_action_tokens: int  # tokens decoded per inference = chunk * action_dim (small VLA 8, OpenVLA 7)
    action_dim: int  # dims of one action
    chunk: int  # actions per inference
    vocab_size: int  # base vocabulary; action ids are its last n_bins ids
    n_bins: int  # action bins per dimension
    hidden_size: int  # LLM width = lm_head input size (drafter and verify-skip features)
    image_size: int  # side frames may be stored at without losing what the target sees
    state_dim: int  # proprioception values the target reads; 0 = it ignores the state
    pad_id: int  # text pad id, for left-padded prompt batches
    # how the target's actions and frames meet a simulator: "raw" (as recorded: our small VLA) or
    # "openvla" (OpenVLA's LIBERO protocol: JPEG'd 224 px frames in, gripper in [0, 1] out)
    protocol: str = "raw"
    views: int = 1  # cameras read, stacked in one frame (`heisd.data.views`): 2 = agentview and the wrist camera

    @property
    def frame_shape(self) -> tuple[int, int, int]:
        """A frame the target reads at its own size: its cameras stacked top to bottom (`heisd.data.views`)."""
        return (self.views * self.image_size, self.image_size, 3)

    def state_input(self, states: np.ndarray | torch.Tensor) -> torch.Tensor | None:
        """Recorded robot states [B, S] as the target takes them: float32, or None for a target
        that reads none (`state_dim` 0; OpenVLA), whatever the recording holds."""
        return None if self.state_dim == 0 else torch.as_tensor(np.asarray(states, dtype=np.float32))


def resolve_unnorm_key(key: str, known: Iterable[str]) -> str | None:
    """Which of the `known` action statistics an unnorm key names: itself, or as OpenVLA's LIBERO
    eval, `KEY_no_noops` when only that is known (libero_spatial -> libero_spatial_no_noops); None if neither."""
    known = set(known)
    if key in known:
        return key
    return f"{key}_no_noops" if f"{key}_no_noops" in known else None


@dataclass
class TeacherForced:
    logits: torch.Tensor  # [B, n_action_tokens, padded_vocab]: logits predicting each action token
    hidden: torch.Tensor  # [B, n_action_tokens, d]: lm_head inputs at those positions
    features: torch.Tensor | None = None  # [B, N, d]: the image tokens of the prefix (an auxiliary loss reads them)


class ActionCodec(Protocol):
    """Action tokens <-> actions in the units the robot executes (see `heisd.targets.vla.ActionTokenizer`)."""

    def encode(self, actions: np.ndarray) -> np.ndarray: ...  # [..., action_dim] -> token ids

    def decode(self, ids: np.ndarray) -> np.ndarray: ...  # token ids [..., action_dim] -> actions

    def zero_bins(self) -> np.ndarray: ...  # [action_dim]: the fractional bin of a zero action


@runtime_checkable
class Target(Protocol):
    """Images are uint8 [B, H, W, 3] of any size (the target resizes); prompt ids [B, L] come from
    `encode_prompt` (expanded to the batch); state is [B, spec.state_dim] or None when that is 0."""

    @property
    def spec(self) -> TargetSpec: ...

    @property
    def llm(self) -> PreTrainedModel: ...  # the causal LM the verifier runs (a LlamaForCausalLM)

    @property
    def action_tokenizer(self) -> ActionCodec: ...

    def encode_prompt(self, instruction: str) -> torch.Tensor: ...  # -> ids [1, L]

    def encode_observation(self, images: torch.Tensor, prompt_ids: torch.Tensor,
                           state: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
        """One vision pass: (prefix embeds [B, P, d] for the LLM, retrieval key [B, Dk])."""
        ...

    def prefix_embeds(self, images: torch.Tensor, prompt_ids: torch.Tensor,
                      state: torch.Tensor | None) -> torch.Tensor: ...

    # the prompt ids matter to a target whose vision reads the instruction (FiLM)
    def retrieval_key(self, images: torch.Tensor, state: torch.Tensor | None,
                      prompt_ids: torch.Tensor | None = None) -> torch.Tensor: ...

    def teacher_forced(self, images: torch.Tensor, prompt_ids: torch.Tensor, state: torch.Tensor | None,
                       action_ids: torch.Tensor, prompt_mask: torch.Tensor | None = None) -> TeacherForced:
        """One pass over [prefix | action_ids[:, :-1]]; `prompt_mask` [B, L] allows left-padded prompts."""
        ...

    def fingerprint(self) -> str: ...  # identifies the target's weights (datastores and drafters bind to it)

    def use_cuda_graphs(self) -> None: ...  # replay its vision as CUDA graphs from now on (a CUDA device only)
