"""OpenVLA's image preprocessing, as its `PrismaticImageProcessor` applies it.

Per backbone: (letterbox pad) -> resize with PIL -> center crop -> [0, 1] -> normalize with
that backbone's mean/std; the views are stacked on the channel axis ([B, 6, 224, 224] for
DINOv2 + SigLIP). The processor reads the `tvf_*` parameters saved in
preprocessor_config.json (they override the ones it would derive), so they are used here
when present; a file without them gets the derivation the processor does from
`input_sizes`, `interpolations`, `means`, `stds` and `image_resize_strategy`.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from PIL import Image

from heisd.targets.vla.checkpoint import CheckpointError

# timm's interpolation names -> PIL filters (the ints torchvision's tvf params store)
PIL_FILTERS = {"nearest": Image.Resampling.NEAREST, "lanczos": Image.Resampling.LANCZOS,
               "bilinear": Image.Resampling.BILINEAR, "bicubic": Image.Resampling.BICUBIC,
               "box": Image.Resampling.BOX, "hamming": Image.Resampling.HAMMING}
RESIZE_STRATEGIES = ("resize-naive", "resize-crop", "letterbox")


@dataclass(frozen=True)
class ViewTransform:
    """One backbone's view of the frame."""

    resize: tuple[int, int] | int  # (height, width) exactly, or an int: the shorter side, aspect kept
    resample: int  # PIL filter (3 = bicubic)
    crop: tuple[int, int]  # center crop (height, width)
    mean: tuple[float, ...]  # per-channel mean of the [0, 1] image
    std: tuple[float, ...]  # per-channel std

    def keeps(self, height: int, width: int) -> bool:
        """True when a height x width frame passes through resize and crop unchanged (PIL's resize to
        the same size is a copy), so only the normalization does anything."""
        square = height == width and self.resize == height
        return (square or self.resize == (height, width)) and self.crop == (height, width)

    def normalize(self, x: torch.Tensor) -> torch.Tensor:
        """float [..., 3, H, W] in [0, 1] -> this view's normalized values."""
        mean = torch.tensor(self.mean, dtype=torch.float32)[:, None, None]
        std = torch.tensor(self.std, dtype=torch.float32)[:, None, None]
        return (x - mean) / std

    def __call__(self, image: Image.Image) -> torch.Tensor:
        if isinstance(self.resize, int):  # torchvision's shorter-side rule
            w, h = image.size
            short, long = min(w, h), max(w, h)
            new_long = int(self.resize * long / short)
            size = (self.resize, new_long) if w <= h else (new_long, self.resize)
        else:
            size = (self.resize[1], self.resize[0])
        image = image.resize(size, resample=self.resample)
        w, h = image.size
        th, tw = self.crop
        if th > h or tw > w:
            raise ValueError(f"crop {self.crop} larger than the resized image {(h, w)}")
        top, left = int(round((h - th) / 2.0)), int(round((w - tw) / 2.0))
        image = image.crop((left, top, left + tw, top + th))
        return self.normalize(torch.from_numpy(np.array(image)).permute(2, 0, 1).float().div(255))


@dataclass(frozen=True)
class ImagePreprocessor:
    views: tuple[ViewTransform, ...]  # one per backbone, stacked in this order
    letterbox_fill: tuple[int, ...] | None = None  # pad to a square with this RGB first (strategy "letterbox")

    def __call__(self, images: torch.Tensor | np.ndarray) -> torch.Tensor:
        """uint8 [B, H, W, 3] -> float32 [B, 3 * len(views), S, S]."""
        frames = images.cpu().numpy() if isinstance(images, torch.Tensor) else np.asarray(images)
        if frames.dtype != np.uint8 or frames.ndim != 4 or frames.shape[-1] != 3:
            raise ValueError(f"expected uint8 images [B, H, W, 3], got {frames.dtype} {frames.shape}")
        h, w = frames.shape[1:3]
        if self.letterbox_fill is None and all(view.keeps(h, w) for view in self.views):
            # frames already at the input size (the LIBERO protocol's 224): the same arithmetic, batched
            x = torch.from_numpy(np.ascontiguousarray(frames)).permute(0, 3, 1, 2).float().div(255)
            return torch.cat([view.normalize(x) for view in self.views], dim=1)
        return torch.stack([self._one(Image.fromarray(f)) for f in frames])

    def _one(self, image: Image.Image) -> torch.Tensor:
        if self.letterbox_fill is not None:  # Prismatic's symmetric pad (int halves, as it does)
            w, h = image.size
            side = max(w, h)
            pw, ph = int((side - w) / 2), int((side - h) / 2)
            padded = Image.new("RGB", (w + 2 * pw, h + 2 * ph), self.letterbox_fill)
            padded.paste(image, (pw, ph))
            image = padded
        return torch.cat([view(image) for view in self.views])

    @classmethod
    def from_dict(cls, data: dict[str, Any], where: Path | str) -> ImagePreprocessor:
        try:
            if "tvf_resize_params" in data:
                return cls._from_tvf(data)
            return cls._derive(data)
        except (KeyError, TypeError, IndexError, ValueError) as e:
            raise CheckpointError(f"{where}: cannot read the image preprocessing: {type(e).__name__} {e}") from e

    @classmethod
    def _from_tvf(cls, d: dict[str, Any]) -> ImagePreprocessor:
        views = []
        params = zip(d["tvf_resize_params"], d["tvf_crop_params"], d["tvf_normalize_params"], strict=True)
        for resize, crop, norm in params:
            size = resize["size"]
            views.append(ViewTransform(resize=int(size) if isinstance(size, int) else (int(size[0]), int(size[1])),
                                       resample=int(resize["interpolation"]),
                                       crop=_pair(crop["output_size"]),
                                       mean=tuple(norm["mean"]), std=tuple(norm["std"])))
        fill = d.get("tvf_letterbox_fill") if d.get("tvf_do_letterbox") else None
        return cls(tuple(views), tuple(int(v) for v in fill) if fill is not None else None)

    @classmethod
    def _derive(cls, d: dict[str, Any]) -> ImagePreprocessor:
        strategy = d.get("image_resize_strategy", "letterbox")
        if strategy not in RESIZE_STRATEGIES:
            raise ValueError(f"image_resize_strategy {strategy!r} not in {RESIZE_STRATEGIES}")
        views = []
        for size, interp, mean, std in zip(d["input_sizes"], d["interpolations"], d["means"], d["stds"], strict=True):
            side = int(size[-1])
            views.append(ViewTransform(resize=(side, side) if strategy == "resize-naive" else side,
                                       resample=int(PIL_FILTERS[interp]), crop=(int(size[-2]), side),
                                       mean=tuple(mean), std=tuple(std)))
        # the processor keeps the fill of the last backbone's mean
        fill = tuple(int(x * 255) for x in d["means"][-1]) if strategy == "letterbox" else None
        return cls(tuple(views), fill)


def _pair(size: Any) -> tuple[int, int]:
    return (int(size), int(size)) if isinstance(size, int) else (int(size[0]), int(size[1]))


def random_resized_crop(pixels: torch.Tensor, area: float) -> torch.Tensor:
    """OpenVLA's fine-tuning augmentation on [B, C, S, S]: per image a square box of `area` of the image at a
    random place, resized back to S (bilinear); its LIBERO eval center-crops the same area
    (`libero_protocol.center_crop`). All channels of an image (both views) share the box."""
    b = len(pixels)
    side = float(np.sqrt(area))
    offset = (torch.rand(b, 2, device=pixels.device) * 2 - 1) * (1 - side)  # box centre, in [-1, 1] units
    theta = torch.zeros(b, 2, 3, device=pixels.device, dtype=pixels.dtype)
    theta[:, 0, 0] = theta[:, 1, 1] = side
    theta[:, :, 2] = offset.to(pixels.dtype)
    grid = torch.nn.functional.affine_grid(theta, list(pixels.shape), align_corners=False)
    return torch.nn.functional.grid_sample(pixels, grid, mode="bilinear", padding_mode="border", align_corners=False)
