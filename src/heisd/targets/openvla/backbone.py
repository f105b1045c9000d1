"""OpenVLA's vision side: the (fused) ViT backbone and the GELU MLP projector into the LLM width.

Module and parameter names follow the checkpoint (`vision_backbone.featurizer`,
`vision_backbone.fused_featurizer`, `projector.fc1..fc3`), so the only renaming a
loader does is timm's LayerScale `gamma` <-> the file's `scale_factor`.
"""

from __future__ import annotations

import torch
from torch import nn

from heisd.targets.openvla.config import OpenVLAConfig
from heisd.targets.openvla.vit import ViTFeaturizer, ViTSpec, vit_spec


def backbone_specs(config: OpenVLAConfig) -> list[ViTSpec]:
    return [vit_spec(i, s, a, k) for i, s, a, k in zip(config.timm_model_ids, config.image_sizes,
                                                       config.timm_override_act_layers, config.timm_model_kwargs)]


class VisionBackbone(nn.Module):
    """Pixels [B, 3k, S, S] (k = 1 or 2 channel-stacked views) -> patch features [B, N, sum of widths]."""

    def __init__(self, specs: list[ViTSpec]):
        super().__init__()
        if len(specs) == 2 and specs[0].num_patches != specs[1].num_patches:
            raise ValueError(f"fused backbones disagree on patches: {specs[0].num_patches} vs {specs[1].num_patches}")
        self.featurizer = ViTFeaturizer(specs[0])
        self.fused_featurizer = ViTFeaturizer(specs[1]) if len(specs) == 2 else None
        self.embed_dim = sum(s.embed_dim for s in specs)
        self.num_patches = specs[0].num_patches

    def forward(self, pixels: torch.Tensor) -> torch.Tensor:
        if self.fused_featurizer is None:
            return self.featurizer(pixels)
        first, second = pixels.split(3, dim=1)
        return torch.cat([self.featurizer(first), self.fused_featurizer(second)], dim=2)


class Projector(nn.Module):
    """Fused: fc1 (D -> 4D), GELU, fc2 (-> d), GELU, fc3 (d -> d). Single backbone: fc1, GELU, fc2."""

    def __init__(self, vision_dim: int, llm_dim: int, fused: bool):
        super().__init__()
        width = 4 * vision_dim if fused else llm_dim
        self.fc1 = nn.Linear(vision_dim, width)
        self.fc2 = nn.Linear(width, llm_dim)
        self.fc3 = nn.Linear(llm_dim, llm_dim) if fused else None
        self.act = nn.GELU()

    def forward(self, patches: torch.Tensor) -> torch.Tensor:
        x = self.fc2(self.act(self.fc1(patches)))
        return self.fc3(self.act(x)) if self.fc3 is not None else x
