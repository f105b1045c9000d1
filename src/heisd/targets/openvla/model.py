"""OpenVLA as a heisd `Target`: fused ViT backbone -> projector -> Llama, no remote code.

The LLM's input is `[BOS, projected patches, rest of the prompt]` exactly as
`PrismaticForConditionalGeneration.forward` assembles it, so a plain `LlamaForCausalLM`
over these embeddings computes what OpenVLA computes, and the decode loop's verifier can
run trees on it. The retrieval key is the mean of the projected patches: computed anyway,
so retrieval costs no extra vision pass.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn
from transformers import LlamaConfig, LlamaForCausalLM

from heisd.cuda_graphs import GraphedCall, require_cuda
from heisd.targets.base import TargetSpec, TeacherForced
from heisd.targets.openvla.actions import OpenVLAActionTokenizer
from heisd.targets.openvla.backbone import Projector, VisionBackbone, backbone_specs
from heisd.targets.openvla.config import ActionStats, OpenVLAConfig
from heisd.targets.openvla.preprocess import ImagePreprocessor, random_resized_crop
from heisd.targets.openvla.prompt import PromptEncoder
from heisd.targets.openvla.weights import files_fingerprint


def llama_config(config: OpenVLAConfig, attn_implementation: str) -> LlamaConfig:
    return LlamaConfig(**config.text_config, attn_implementation=attn_implementation)


@dataclass(frozen=True)
class OpenVLAParts:
    """What surrounds the networks, read from the checkpoint directory."""

    config: OpenVLAConfig
    preprocess: ImagePreprocessor  # uint8 frames -> stacked normalized views
    prompt: PromptEncoder  # instruction -> ids with BOS and the empty piece
    stats: ActionStats  # the chosen unnorm key's q01/q99/mask
    identity_files: tuple[Path, ...] = ()  # files whose bytes identify the target (config, tokenizer, weights)
    identity_note: str = ""  # what else identifies it (a random model's seed and shape)


class OpenVLA(nn.Module):
    train_crop_area = 1.0  # < 1: OpenVLA's random-crop augmentation in training mode (set by the trainer, never saved)

    def __init__(self, parts: OpenVLAParts, attn_implementation: str):
        super().__init__()
        config = parts.config
        self.parts = parts
        self.vision_backbone = VisionBackbone(backbone_specs(config))
        self.projector = Projector(self.vision_backbone.embed_dim, config.hidden_size, config.use_fused_vision_backbone)
        self.language_model = LlamaForCausalLM(llama_config(config, attn_implementation))
        self._actions = _codec(config, parts.stats)
        self._fingerprint: str | None = None
        self._graphed_vision: GraphedCall | None = None  # `use_cuda_graphs`

    # ----- Target -----
    @property
    def llm(self) -> LlamaForCausalLM:
        return self.language_model

    @property
    def action_tokenizer(self) -> OpenVLAActionTokenizer:
        return self._actions

    @property
    def spec(self) -> TargetSpec:
        c = self.parts.config
        return TargetSpec(n_action_tokens=self._actions.action_dim, action_dim=self._actions.action_dim, chunk=1,
                          vocab_size=c.vocab_size, n_bins=c.n_action_bins, hidden_size=c.hidden_size,
                          image_size=c.image_sizes[0], state_dim=0, pad_id=self.parts.prompt.pad_id,
                          protocol="openvla")

    def encode_prompt(self, instruction: str) -> torch.Tensor:
        return self.parts.prompt.encode_tensor(instruction)

    # ----- the checkpoint's other action statistics (as predict_action's unnorm_key) -----
    @property
    def unnorm_keys(self) -> tuple[str, ...]:
        """config.json's norm_stats keys, the one this target was loaded with first."""
        loaded = self.parts.stats.key
        return (loaded, *sorted(k for k in self.parts.config.norm_stats if k != loaded))

    def action_codec(self, unnorm_key: str) -> OpenVLAActionTokenizer:
        """Tokens <-> actions with `unnorm_key`'s statistics (the tokens do not depend on them)."""
        if unnorm_key == self.parts.stats.key:
            return self._actions
        return _codec(self.parts.config, self.parts.config.action_stats(unnorm_key))

    def image_features(self, images: torch.Tensor) -> torch.Tensor:
        """uint8 [B, H, W, 3] -> projected patch embeddings [B, N, d]."""
        w = self.projector.fc1.weight
        pixels = self.parts.preprocess(images).to(device=w.device, dtype=w.dtype)
        if self.training and self.train_crop_area < 1.0:
            pixels = random_resized_crop(pixels, self.train_crop_area)
        if self._graphed_vision is not None and not self.training:
            return self._graphed_vision(pixels)
        return self._vision(pixels)

    def _vision(self, pixels: torch.Tensor) -> torch.Tensor:
        return self.projector(self.vision_backbone(pixels))

    def use_cuda_graphs(self) -> None:
        """Replay the vision towers and the projector as a CUDA graph per frame batch shape (inference):
        about 600 kernel launches become one (BENCHMARKS 19.3). The graphs already captured are kept
        (each policy of a server asks again)."""
        require_cuda(self.projector.fc1.weight.device, "the target")
        if self._graphed_vision is None:
            self._graphed_vision = GraphedCall(self._vision)

    def encode_observation(self, images: torch.Tensor, prompt_ids: torch.Tensor,
                           state: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """(prefix [B, 1 + N + L - 1, d], key [B, d]); OpenVLA reads no proprioception, `state` is ignored."""
        patches = self.image_features(images)
        return self._assemble(patches, prompt_ids), patches.mean(dim=1).float()

    def prefix_embeds(self, images: torch.Tensor, prompt_ids: torch.Tensor,
                      state: torch.Tensor | None = None) -> torch.Tensor:
        return self._assemble(self.image_features(images), prompt_ids)

    def retrieval_key(self, images: torch.Tensor, state: torch.Tensor | None = None,
                      prompt_ids: torch.Tensor | None = None) -> torch.Tensor:
        return self.image_features(images).mean(dim=1).float()

    def _assemble(self, patches: torch.Tensor, prompt_ids: torch.Tensor) -> torch.Tensor:
        if bool((prompt_ids[:, 0] != self.parts.prompt.bos_id).any()):
            raise ValueError("OpenVLA prompts start with BOS (use encode_prompt); left-padded batches go "
                             "through teacher_forced with a prompt_mask")
        prompt = self.language_model.get_input_embeddings()(prompt_ids.to(patches.device))
        prompt = prompt.expand(len(patches), -1, -1)
        return torch.cat([prompt[:, :1], patches, prompt[:, 1:]], dim=1)

    def teacher_forced(self, images: torch.Tensor, prompt_ids: torch.Tensor, state: torch.Tensor | None,
                       action_ids: torch.Tensor, prompt_mask: torch.Tensor | None = None) -> TeacherForced:
        """One pass over [prefix | action_ids[:, :-1]]. With `prompt_mask` (LEFT-padded prompts) each
        row's patches go right after its own BOS, and positions skip the pads."""
        patches = self.image_features(images)
        b, n = len(patches), action_ids.shape[1]
        device = patches.device
        embed = self.language_model.get_input_embeddings()
        prompt_ids, action_ids = prompt_ids.to(device).expand(b, -1), action_ids.to(device)
        actions = embed(action_ids[:, :-1])
        if prompt_mask is None:
            emb, mask = torch.cat([self._assemble(patches, prompt_ids), actions], dim=1), None
        else:
            prompt_mask = prompt_mask.to(device).long()
            first = prompt_ids.shape[1] - prompt_mask.sum(1)  # index of each row's BOS
            rows, masks = [], []
            ones = torch.ones(patches.shape[1] + n - 1, dtype=torch.long, device=device)
            for i in range(b):
                cut = int(first[i]) + 1
                rows.append(torch.cat([embed(prompt_ids[i, :cut]), patches[i], embed(prompt_ids[i, cut:]), actions[i]]))
                masks.append(torch.cat([prompt_mask[i, :cut], ones[: patches.shape[1]], prompt_mask[i, cut:],
                                        ones[: n - 1]]))
            emb, mask = torch.stack(rows), torch.stack(masks)
        kwargs = {} if mask is None else {"attention_mask": mask, "position_ids": (mask.cumsum(1) - 1).clamp(min=0)}
        hidden = self.language_model.model(inputs_embeds=emb, use_cache=False, **kwargs).last_hidden_state[:, -n:]
        return TeacherForced(logits=self.language_model.lm_head(hidden), hidden=hidden, features=patches)

    def fingerprint(self) -> str:
        """sha256 of the checkpoint's files, computed once (hashing 15 GB takes seconds, so only on demand)."""
        if self._fingerprint is None:
            self._fingerprint = files_fingerprint(self.parts.identity_files, self.parts.identity_note)
        return self._fingerprint

    def weights_rewritten(self) -> None:
        """The checkpoint's files were written anew (a training checkpoint): hash them again when asked."""
        self._fingerprint = None


def _codec(config: OpenVLAConfig, stats: ActionStats) -> OpenVLAActionTokenizer:
    return OpenVLAActionTokenizer(config.vocab_size, stats.q01, stats.q99, stats.mask, config.n_action_bins)
