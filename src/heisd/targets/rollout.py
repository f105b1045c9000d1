"""The target on recorded frames: one vision pass and a batched greedy rollout per batch of
frames that share an instruction (datastore payloads, drafter training features, calibration).

Frames go to the target as recorded: each target resizes and normalizes them its own way, so
what is stored is what the decode loop computes on the same frame at run time.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from heisd.decoding.rollout import Features, greedy_rollout
from heisd.targets.base import Target


@dataclass
class FrameRollout:
    features: Features  # on the CPU: lm_head inputs [B, n, d] (float32) and greedy tokens [B, n]
    keys: torch.Tensor  # float32 [B, Dk] retrieval keys, on the CPU
    prefix: torch.Tensor  # [B, L, d] the prefill embeddings, where the target runs (what a decoder takes)


@torch.no_grad()
def rollout_frames(target: Target, images: np.ndarray, instruction: str, states: np.ndarray) -> FrameRollout:
    """uint8 frames [B, H, W, 3] of one instruction with their recorded states [B, S] -> what the
    target computes on each: greedy action tokens, the features that predicted them, the key.
    One prompt for the batch, so no row is padded and each row computes what it would alone."""
    spec = target.spec
    images_t = torch.from_numpy(np.ascontiguousarray(images))
    prompt = target.encode_prompt(instruction).expand(len(images_t), -1)
    prefix, keys = target.encode_observation(images_t, prompt, spec.state_input(states))
    out = greedy_rollout(target.llm, prefix, spec.n_action_tokens)
    return FrameRollout(Features(out.hidden.float().cpu(), out.tokens.cpu()), keys.float().cpu(), prefix)
