"""Another ViT patch size for a trained OpenVLA-architecture checkpoint (FlexiViT's idea, Beyer et
al., 2023): the towers keep every weight except the two that depend on the patch grid.

- The patch embedding becomes `R^T w`, where R resizes a new-size patch to the old size (bilinear),
  so a new patch's token equals the old convolution of that patch resized: what the towers learned
  about a patch's content carries over at the new resolution.
- The position embeddings are resized on their grid (bicubic), as timm resizes them for another
  image size.

A target trained at 28 px patches (64 tokens, cheap on a CPU) can so be fine-tuned at OpenVLA's 14
px (256 tokens), where small things (the gripper's fingers, a can's edge) cover whole patches,
instead of being trained again from nothing.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from heisd.errors import UsageError

PATCH_WEIGHT = "patch_embed.proj.weight"
POS_EMBED = "pos_embed"


def resize_matrix(old: int, new: int) -> torch.Tensor:
    """[old*old, new*new]: the bilinear resize of a new x new patch to old x old, as a matrix."""
    basis = torch.eye(new * new, dtype=torch.float64).reshape(new * new, 1, new, new)
    resized = F.interpolate(basis, size=(old, old), mode="bilinear", align_corners=False)
    return resized.reshape(new * new, old * old).T


def resample_patch_weight(weight: torch.Tensor, new: int) -> torch.Tensor:
    """Conv weight [D, C, p, p] -> [D, C, new, new] with <x, w_new> = <resize(x), w> for every patch x."""
    d, c, old, _ = weight.shape
    r = resize_matrix(old, new).to(torch.float64)
    out = weight.to(torch.float64).reshape(d * c, old * old) @ r
    return out.reshape(d, c, new, new).to(weight.dtype)


def resample_pos_embed(pos: torch.Tensor, prefix: int, grid: int) -> torch.Tensor:
    """[1, prefix + g*g, D] -> [1, prefix + grid*grid, D]: the prefix tokens' rows kept, the grid resized."""
    head, patches = pos[:, :prefix], pos[:, prefix:]
    g = int(round(patches.shape[1] ** 0.5))
    if g * g != patches.shape[1]:
        raise UsageError(f"position embeddings of {patches.shape[1]} patches are not a square grid")
    square = patches.reshape(1, g, g, -1).permute(0, 3, 1, 2).to(torch.float64)
    resized = F.interpolate(square, size=(grid, grid), mode="bicubic", align_corners=False)
    return torch.cat([head, resized.permute(0, 2, 3, 1).reshape(1, grid * grid, -1).to(pos.dtype)], dim=1)


def resampled_state(vision_backbone: torch.nn.Module, trained: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """`trained` (a vision backbone's state dict at another patch size) for `vision_backbone`'s patch size:
    every other tensor must have the same shape in both."""
    target = vision_backbone.state_dict()
    out = {}
    for key, value in target.items():
        old = trained[key]
        if old.shape == value.shape:
            out[key] = old
        elif key.endswith(PATCH_WEIGHT):
            out[key] = resample_patch_weight(old, value.shape[-1])
        elif key.endswith(POS_EMBED):
            spec = vision_backbone.get_submodule(key.removesuffix("." + POS_EMBED)).spec
            prefix = 0 if spec.no_embed_class else spec.num_prefix_tokens
            out[key] = resample_pos_embed(old, prefix, spec.img_size // spec.patch_size)
        else:
            raise UsageError(f"{key}: shape {tuple(old.shape)} in the checkpoint, {tuple(value.shape)} in the model; "
                             "only the patch size may differ")
    return out

