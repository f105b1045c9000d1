"""Vision encoder trained from scratch: a small CoordConv CNN ending in a grid of image tokens."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from heisd.cuda_graphs import GraphedCall


def resize_images(images: torch.Tensor, size: int) -> torch.Tensor:
    """uint8 [B, H, W, 3] -> uint8 [B, size, size, 3] (area filter, rounded).

    Rounding back to uint8 makes this idempotent, so frames resized once at load time for
    training are bit-identical to frames resized on the fly at inference.
    """
    if images.dtype != torch.uint8 or images.ndim != 4 or images.shape[-1] != 3:
        raise ValueError(f"expected uint8 images [B, H, W, 3], got {images.dtype} {tuple(images.shape)}")
    if images.shape[1] == size and images.shape[2] == size:
        return images
    x = F.interpolate(images.permute(0, 3, 1, 2).float(), size=(size, size), mode="area")
    return x.round().clamp(0, 255).to(torch.uint8).permute(0, 2, 3, 1).contiguous()


def split_views(images: torch.Tensor, views: int) -> list[torch.Tensor]:
    """[B, V*S, S, 3] (square cameras stacked top to bottom, `heisd.data.views`) -> V tensors [B, S, S, 3].
    One camera's frame may be any shape (it is resized); stacked ones must be square, so that a single
    frame given to a two-camera target is refused rather than cut in two."""
    if views == 1:
        return [images]
    if images.ndim != 4 or images.shape[1] != views * images.shape[2]:
        raise ValueError(f"expected {views} square camera frames stacked as [B, {views}*S, S, 3], got {tuple(images.shape)}")
    return list(images.chunk(views, dim=1))


def resize_views(images: torch.Tensor, size: int, views: int) -> torch.Tensor:
    """`resize_images` of each stacked camera frame: [B, V*H, W, 3] -> [B, V*size, size, 3]."""
    return torch.cat([resize_images(v, size) for v in split_views(images, views)], dim=1)


def random_shift(x: torch.Tensor, pad: int) -> torch.Tensor:
    """DrQ augmentation: replicate-pad by `pad` pixels, crop back at a random offset per image."""
    b, _, h, w = x.shape
    padded = F.pad(x, (pad, pad, pad, pad), mode="replicate")
    dy = torch.randint(0, 2 * pad + 1, (b, 1, 1), device=x.device)
    dx = torch.randint(0, 2 * pad + 1, (b, 1, 1), device=x.device)
    rows = (torch.arange(h, device=x.device).view(1, h, 1) + dy).expand(b, h, w)
    cols = (torch.arange(w, device=x.device).view(1, 1, w) + dx).expand(b, h, w)
    flat = rows * (w + 2 * pad) + cols  # index into the flattened padded image
    out = padded.flatten(2).gather(2, flat.flatten(1).unsqueeze(1).expand(-1, x.shape[1], -1))
    return out.view_as(x)


class VisionEncoder(nn.Module):
    """Stride-2 conv stages (each followed by a stride-1 conv) over RGB + 2 coordinate channels.

    The coordinate channels (CoordConv) let the features say *where* an object is, which a
    conv stack alone encodes poorly and which decides where the arm should move. With FiLM
    conditioning (RT-1's answer to many tasks sharing one small image encoder) each stage's output
    is scaled and shifted per channel by values computed from the instruction, so the few image
    tokens can keep what this task needs.
    """

    LAYERS_PER_STAGE = 6

    def __init__(self, channels: tuple[int, ...], image_size: int, shift_pad: int):
        super().__init__()
        self.image_size = image_size
        self.shift_pad = shift_pad
        layers: list[nn.Module] = []
        c_in = 5
        for c in channels:
            layers += [
                nn.Conv2d(c_in, c, 3, stride=2, padding=1), nn.GroupNorm(8, c), nn.GELU(),
                nn.Conv2d(c, c, 3, padding=1), nn.GroupNorm(8, c), nn.GELU(),
            ]
            c_in = c
        self.net = nn.Sequential(*layers)
        self.out_dim = c_in
        self.film_dim = 2 * sum(channels)  # a scale and a shift per channel of every stage
        self.grid = image_size // 2 ** len(channels)
        ys, xs = torch.meshgrid(torch.linspace(-1, 1, image_size), torch.linspace(-1, 1, image_size), indexing="ij")
        self.register_buffer("coords", torch.stack([xs, ys]).unsqueeze(0), persistent=False)
        self.graphed: GraphedCall | None = None  # the conv stack replayed as a CUDA graph (inference)

    def feature_map(self, images: torch.Tensor, film: torch.Tensor | None = None) -> torch.Tensor:
        """uint8 [B, H, W, 3] -> features [B, C, grid, grid]. Random shift only in training mode.
        `film` [B, film_dim]: per stage, the scales (applied as 1 + scale, so zeros change nothing)
        then the shifts of its channels."""
        x = resize_images(images, self.image_size).permute(0, 3, 1, 2).to(self.coords.device).float() / 127.5 - 1.0
        x = x.to(self.coords.dtype)  # the weights' device and dtype (--device, --dtype)
        if self.training and self.shift_pad > 0:
            x = random_shift(x, self.shift_pad)
        x = torch.cat([x, self.coords.expand(x.shape[0], -1, -1, -1)], dim=1)
        if film is not None:
            return self._conditioned(x, film.to(x.dtype))
        return self.graphed(x) if self.graphed is not None and not self.training else self.net(x)

    def _conditioned(self, x: torch.Tensor, film: torch.Tensor) -> torch.Tensor:
        if film.shape != (x.shape[0], self.film_dim):
            raise ValueError(f"FiLM values must be [{x.shape[0]}, {self.film_dim}], got {tuple(film.shape)}")
        layers, offset = list(self.net), 0
        for start in range(0, len(layers), self.LAYERS_PER_STAGE):
            for layer in layers[start:start + self.LAYERS_PER_STAGE]:
                x = layer(x)
            c = x.shape[1]
            scale, shift = film[:, offset:offset + c], film[:, offset + c:offset + 2 * c]
            x = x * (1 + scale[:, :, None, None]) + shift[:, :, None, None]
            offset += 2 * c
        return x

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        """uint8 [B, H, W, 3] -> image tokens [B, grid*grid, C]."""
        return self.feature_map(images).flatten(2).transpose(1, 2)
