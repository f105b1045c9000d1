"""The ViT featurizers of OpenVLA's vision backbone, with timm's parameter names.

OpenVLA builds its two backbones with `timm.create_model(id, num_classes=0, img_size=...)`
and reads the patch tokens after the SECOND-TO-LAST block (`get_intermediate_layers`,
prefix tokens removed). Every timm release imports torchvision at import time, and no
torchvision build installs beside the project's torch, so the transformer is written
here: same parameter names (`patch_embed.proj`, `blocks.N.attn.qkv`, `ls1.gamma`, ...) and
the same forward as timm's `VisionTransformer`, for the architectures that the known timm
ids name, plus explicit kwargs (a tiny checkpoint's small ViTs). The last block, the final
norm and the attention-pool head are never run; `unused_shapes` lists their keys so a
loader can skip exactly those and nothing else.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn
from torch.nn import functional as F


@dataclass(frozen=True)
class ViTSpec:
    """The subset of timm's VisionTransformer arguments that OpenVLA's backbones use."""

    patch_size: int = 16  # square patches, stride = size
    embed_dim: int = 768  # token width
    depth: int = 12  # blocks in the checkpoint (the last one is not run)
    num_heads: int = 12  # attention heads
    mlp_ratio: float = 4.0  # MLP width = int(embed_dim * mlp_ratio)
    init_values: float | None = None  # LayerScale present when set (DINOv2)
    class_token: bool = True  # a CLS token before the patches
    reg_tokens: int = 0  # register tokens after the CLS token (DINOv2-reg4: 4)
    no_embed_class: bool = False  # position embeddings cover the patches only
    global_pool: str = "token"  # 'map' = an attention-pool head (SigLIP); it is in the file, never run
    img_size: int = 224  # input side
    act_layer: str | None = None  # MLP activation; None = exact GELU (timm's default)

    @property
    def num_prefix_tokens(self) -> int:
        return int(self.class_token) + self.reg_tokens

    @property
    def num_patches(self) -> int:
        return (self.img_size // self.patch_size) ** 2

    @property
    def mlp_dim(self) -> int:
        return int(self.embed_dim * self.mlp_ratio)


# Architectures of the timm ids Prismatic/OpenVLA configs name (timm's model_args for each).
TIMM_VITS: dict[str, dict[str, Any]] = {
    "vit_large_patch14_reg4_dinov2": dict(patch_size=14, embed_dim=1024, depth=24, num_heads=16, init_values=1e-5,
                                          reg_tokens=4, no_embed_class=True, img_size=518),
    "vit_so400m_patch14_siglip_224": dict(patch_size=14, embed_dim=1152, depth=27, num_heads=16, mlp_ratio=3.7362,
                                          class_token=False, global_pool="map", img_size=224),
    "vit_so400m_patch14_siglip_384": dict(patch_size=14, embed_dim=1152, depth=27, num_heads=16, mlp_ratio=3.7362,
                                          class_token=False, global_pool="map", img_size=384),
}
_ACTIVATIONS = {None: nn.GELU, "gelu": nn.GELU, "gelu_tanh": lambda: nn.GELU(approximate="tanh")}


def vit_spec(timm_id: str, img_size: int, act_layer: str | None, kwargs: dict[str, Any]) -> ViTSpec:
    """The architecture `timm.create_model(timm_id, img_size=img_size, act_layer=act_layer, **kwargs)` builds."""
    arch = timm_id.split(".")[0]  # drop the pretrained tag (".lvd142m")
    if arch not in TIMM_VITS and not kwargs:
        raise ValueError(f"unknown timm model {timm_id!r} (known: {', '.join(sorted(TIMM_VITS))}); "
                         f"give its architecture in the config's timm_model_kwargs")
    known = {f.name for f in dataclasses.fields(ViTSpec)}
    unknown = set(kwargs) - known
    if unknown:
        raise ValueError(f"timm_model_kwargs for {timm_id!r}: unsupported {sorted(unknown)} "
                         f"(supported: {sorted(known)})")
    if act_layer not in _ACTIVATIONS:
        raise ValueError(f"timm_override_act_layers: unsupported activation {act_layer!r} for {timm_id!r}")
    spec = ViTSpec(**{**TIMM_VITS.get(arch, {}), **kwargs, "img_size": img_size, "act_layer": act_layer})
    if spec.img_size % spec.patch_size or spec.embed_dim % spec.num_heads or spec.depth < 2:
        raise ValueError(f"{timm_id!r}: img_size {spec.img_size} / patch {spec.patch_size}, embed_dim "
                         f"{spec.embed_dim} / heads {spec.num_heads}, depth {spec.depth} (>= 2) do not fit")
    return spec


class LayerScale(nn.Module):
    def __init__(self, dim: int):
        super().__init__()
        self.gamma = nn.Parameter(torch.ones(dim))  # OpenVLA's files call it `scale_factor`

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * self.gamma


class Attention(nn.Module):
    def __init__(self, dim: int, num_heads: int):
        super().__init__()
        self.num_heads = num_heads
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, n, c = x.shape
        q, k, v = self.qkv(x).reshape(b, n, 3, self.num_heads, c // self.num_heads).permute(2, 0, 3, 1, 4)
        return self.proj(F.scaled_dot_product_attention(q, k, v).transpose(1, 2).reshape(b, n, c))


class Mlp(nn.Module):
    def __init__(self, dim: int, hidden: int, act: str | None):
        super().__init__()
        self.fc1 = nn.Linear(dim, hidden)
        self.act = _ACTIVATIONS[act]()
        self.fc2 = nn.Linear(hidden, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(self.act(self.fc1(x)))


class Block(nn.Module):
    def __init__(self, spec: ViTSpec):
        super().__init__()
        d = spec.embed_dim
        self.norm1 = nn.LayerNorm(d, eps=1e-6)
        self.attn = Attention(d, spec.num_heads)
        self.ls1 = LayerScale(d) if spec.init_values else nn.Identity()
        self.norm2 = nn.LayerNorm(d, eps=1e-6)
        self.mlp = Mlp(d, spec.mlp_dim, spec.act_layer)
        self.ls2 = LayerScale(d) if spec.init_values else nn.Identity()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.ls1(self.attn(self.norm1(x)))
        return x + self.ls2(self.mlp(self.norm2(x)))


class PatchEmbed(nn.Module):
    def __init__(self, spec: ViTSpec):
        super().__init__()
        self.img_size = spec.img_size
        self.proj = nn.Conv2d(3, spec.embed_dim, spec.patch_size, stride=spec.patch_size)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.shape[-2:] != (self.img_size, self.img_size):
            raise ValueError(f"expected {self.img_size}x{self.img_size} pixels, got {tuple(x.shape[-2:])}")
        return self.proj(x).flatten(2).transpose(1, 2)


class ViTFeaturizer(nn.Module):
    """Pixels [B, 3, S, S] (normalized) -> patch tokens after the second-to-last block [B, N, D]."""

    def __init__(self, spec: ViTSpec):
        super().__init__()
        self.spec = spec
        d = spec.embed_dim
        self.patch_embed = PatchEmbed(spec)
        self.cls_token = nn.Parameter(torch.zeros(1, 1, d)) if spec.class_token else None
        self.reg_token = nn.Parameter(torch.zeros(1, spec.reg_tokens, d)) if spec.reg_tokens else None
        n_pos = spec.num_patches + (0 if spec.no_embed_class else spec.num_prefix_tokens)
        self.pos_embed = nn.Parameter(torch.zeros(1, n_pos, d))
        self.blocks = nn.Sequential(*[Block(spec) for _ in range(spec.depth - 1)])

    def forward(self, pixels: torch.Tensor) -> torch.Tensor:
        x = self.patch_embed(pixels)
        prefix = [t.expand(len(x), -1, -1) for t in (self.cls_token, self.reg_token) if t is not None]
        if self.spec.no_embed_class:  # positions for the patches only, prefix tokens added after
            x = torch.cat([*prefix, x + self.pos_embed], dim=1)
        else:
            x = torch.cat([*prefix, x], dim=1) + self.pos_embed
        return self.blocks(x)[:, self.spec.num_prefix_tokens:]


def unused_shapes(spec: ViTSpec) -> dict[str, tuple[int, ...]]:
    """Keys (timm names) a timm checkpoint of `spec` holds that the featurizer never runs, with shapes."""
    d, h = spec.embed_dim, spec.mlp_dim
    last = f"blocks.{spec.depth - 1}."
    shapes: dict[str, tuple[int, ...]] = {
        last + "norm1.weight": (d,), last + "norm1.bias": (d,),
        last + "attn.qkv.weight": (3 * d, d), last + "attn.qkv.bias": (3 * d,),
        last + "attn.proj.weight": (d, d), last + "attn.proj.bias": (d,),
        last + "norm2.weight": (d,), last + "norm2.bias": (d,),
        last + "mlp.fc1.weight": (h, d), last + "mlp.fc1.bias": (h,),
        last + "mlp.fc2.weight": (d, h), last + "mlp.fc2.bias": (d,),
        "norm.weight": (d,), "norm.bias": (d,),
    }
    if spec.init_values:
        shapes[last + "ls1.gamma"] = shapes[last + "ls2.gamma"] = (d,)
    if spec.global_pool == "map":  # timm's AttentionPoolLatent: one latent query, its own MLP
        shapes.update({
            "attn_pool.latent": (1, 1, d), "attn_pool.q.weight": (d, d), "attn_pool.q.bias": (d,),
            "attn_pool.kv.weight": (2 * d, d), "attn_pool.kv.bias": (2 * d,),
            "attn_pool.proj.weight": (d, d), "attn_pool.proj.bias": (d,),
            "attn_pool.norm.weight": (d,), "attn_pool.norm.bias": (d,),
            "attn_pool.mlp.fc1.weight": (h, d), "attn_pool.mlp.fc1.bias": (h,),
            "attn_pool.mlp.fc2.weight": (d, h), "attn_pool.mlp.fc2.bias": (d,),
        })
    return shapes
