"""OpenVLA's LIBERO evaluation protocol (openvla/openvla experiments/robot/libero/run_libero_eval.py),
the parts that are plain array work: no simulator needed, so they are tested on their own.

The simulator side (init states, wait steps, max steps, success from `done`) is in
`heisd.benchmarks.libero`; the image and gripper functions here are what an OpenVLA target
applies to the frames it reads and the actions it emits.
"""

from __future__ import annotations

import io
import math

import numpy as np

from heisd.errors import UsageError

# Steps per episode after the wait steps, per suite (the episode loop runs max_steps + NUM_STEPS_WAIT).
MAX_STEPS: dict[str, int] = {"libero_spatial": 220, "libero_object": 280, "libero_goal": 300, "libero_10": 520}
SUITES: tuple[str, ...] = tuple(MAX_STEPS)
NUM_STEPS_WAIT = 10  # dummy steps first: objects fall into place after the init state is set
DUMMY_ACTION = np.array([0, 0, 0, 0, 0, 0, -1], dtype=np.float64)  # no motion, gripper open
ACTION_DIM = 7  # OSC_POSE delta xyz, delta axis-angle, gripper (-1 open, +1 close)
OPENVLA_IMAGE_SIZE = 224  # OpenVLA's input resolution
PROTOCOL_RENDER_SIZE = 256  # the protocol renders agentview at 256x256 before resizing
CENTER_CROP_AREA = 0.9  # fraction of the image area kept by the optional center crop


def check_suite(suite: str) -> str:
    if suite not in MAX_STEPS:
        raise UsageError(f"unknown LIBERO suite {suite!r}; known: {', '.join(SUITES)}")
    return suite


def rotate_180(image: np.ndarray) -> np.ndarray:
    """LIBERO's agentview frames come upside down; OpenVLA trains and evaluates on them rotated 180 degrees."""
    return np.ascontiguousarray(image[::-1, ::-1])


def _jpeg_round_trip(image: np.ndarray) -> np.ndarray:
    # OpenVLA's training images (RLDS) were JPEG-encoded, so evaluation frames take the same loss
    from PIL import Image

    buf = io.BytesIO()
    Image.fromarray(image).save(buf, format="JPEG", quality=95)  # TF's encode_jpeg default quality
    buf.seek(0)
    return np.asarray(Image.open(buf).convert("RGB"))


def _resize_lanczos(image: np.ndarray, size: int) -> np.ndarray:
    from PIL import Image

    if image.shape[:2] == (size, size):
        return image
    return np.asarray(Image.fromarray(image).resize((size, size), Image.Resampling.LANCZOS))


def center_crop(image: np.ndarray, area: float = CENTER_CROP_AREA) -> np.ndarray:
    """A centred box of `area` of the image (side sqrt(area)), resized back to the full size by bilinear
    sampling with the corner-aligned grid of TF's `crop_and_resize`, which OpenVLA calls."""
    h, w = image.shape[:2]
    side = math.sqrt(area)
    lo, hi = (1 - side) / 2, (1 + side) / 2
    ys = (lo + np.arange(h) * (hi - lo) / (h - 1)) * (h - 1)
    xs = (lo + np.arange(w) * (hi - lo) / (w - 1)) * (w - 1)
    y0, x0 = np.floor(ys).astype(int), np.floor(xs).astype(int)
    y1, x1 = np.minimum(y0 + 1, h - 1), np.minimum(x0 + 1, w - 1)
    fy, fx = (ys - y0)[:, None, None], (xs - x0)[None, :, None]
    img = image.astype(np.float64)
    top = img[y0][:, x0] * (1 - fx) + img[y0][:, x1] * fx
    bottom = img[y1][:, x0] * (1 - fx) + img[y1][:, x1] * fx
    return np.clip(np.round(top * (1 - fy) + bottom * fy), 0, 255).astype(np.uint8)


def openvla_image(frame: np.ndarray, crop: bool = False, size: int = OPENVLA_IMAGE_SIZE) -> np.ndarray:
    """An upright agentview frame (as `LiberoEnv` returns it) -> OpenVLA's input: JPEG round trip,
    Lanczos resize to `size`, and for checkpoints trained with crop augmentation the 0.9-area center crop.
    PIL stands in for TF's codec and resampler: equal up to rounding, not bit for bit."""
    if frame.dtype != np.uint8 or frame.ndim != 3 or frame.shape[2] != 3:
        raise ValueError(f"expected a uint8 (H, W, 3) frame, got {frame.dtype} {frame.shape}")
    image = _resize_lanczos(_jpeg_round_trip(frame), size)
    return center_crop(image) if crop else image


def openvla_gripper(action: np.ndarray) -> np.ndarray:
    """OpenVLA's gripper output in [0, 1] (1 = open) -> LIBERO's gripper command (-1 open, +1 close):
    2a - 1, binarized by sign, then inverted. The first six dimensions pass through."""
    out = np.array(action, dtype=np.float64, copy=True)
    if out.shape[-1] != ACTION_DIM:
        raise ValueError(f"expected {ACTION_DIM}-D LIBERO actions, got shape {out.shape}")
    out[..., -1] = -np.sign(2 * out[..., -1] - 1)
    return out
