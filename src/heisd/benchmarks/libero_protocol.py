"""OpenVLA's LIBERO evaluation protocol (openvla/openvla experiments/robot/libero/run_libero_eval.py),
the parts that are plain array work: no simulator needed, so they are tested on their own.

The simulator side (init states, wait steps, max steps, success from `done`) is in
`heisd.benchmarks.libero`; the image and gripper functions here are what an OpenVLA target
applies to the frames it reads and the actions it emits.
"""

from __future__ import annotations

import math

import numpy as np

from heisd.benchmarks import tf_image
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
    return tf_image.jpeg_round_trip(image)


def _resize_lanczos(image: np.ndarray, size: int) -> np.ndarray:
    if image.shape[:2] == (size, size):
        return image  # TF's scale-1 kernel is the identity up to ~1e-8 weights: rounding gives the input back
    return tf_image.round_to_uint8(tf_image.resize_lanczos3(image, (size, size)))


def center_crop(image: np.ndarray, area: float = CENTER_CROP_AREA) -> np.ndarray:
    """A centred box of `area` of the image (side sqrt(area)), resized back to the full size as OpenVLA's
    eval does: to float in [0, 1], TF's corner-aligned bilinear `crop_and_resize`, back to uint8 by TF's
    truncating conversion."""
    side = np.float32(min(math.sqrt(np.float32(area)), 1.0))  # OpenVLA: tf.sqrt of a float32 crop scale
    lo = (np.float32(1) - side) / np.float32(2)
    box = (lo, lo, lo + side, lo + side)
    crop = tf_image.crop_and_resize(tf_image.uint8_to_float(image), box, image.shape[:2])
    return tf_image.float_to_uint8(np.clip(crop, 0, 1))


def openvla_image(frame: np.ndarray, crop: bool = False, size: int = OPENVLA_IMAGE_SIZE) -> np.ndarray:
    """An upright agentview frame (as `LiberoEnv` returns it) -> OpenVLA's input: JPEG round trip,
    Lanczos resize to `size`, and for checkpoints trained with crop augmentation the 0.9-area center crop.
    Each step re-does the TensorFlow op OpenVLA calls (`heisd.benchmarks.tf_image`); on real LIBERO frames
    the result is TF's to within one grey level on a few values in 100,000, with and without the crop
    (tests/test_tf_frames.py, against TF 2.21's outputs stored in tests/golden/)."""
    if frame.dtype != np.uint8 or frame.ndim != 3 or frame.shape[2] != 3:
        raise ValueError(f"expected a uint8 (H, W, 3) frame, got {frame.dtype} {frame.shape}")
    image = _resize_lanczos(_jpeg_round_trip(frame), size)
    return center_crop(image) if crop else image


def protocol_frames(protocol: str, frames: np.ndarray) -> np.ndarray:
    """Recorded upright frames [T, H, W, 3] as a target of `protocol` sees them in closed loop: under
    "openvla", `openvla_image` of each (record at the protocol's 256 px); "raw" targets take them as
    recorded. Offline tools (datastore, drafter, calibration, replay) feed these, so what they store
    is what the decode loop computes on the same frame at run time."""
    if protocol != "openvla":
        return frames
    return np.stack([openvla_image(f) for f in frames]) if len(frames) else frames


def openvla_gripper_label(actions: np.ndarray) -> np.ndarray:
    """LIBERO's actions (gripper -1 open, +1 close) -> OpenVLA's training labels: the gripper clipped to
    [0, 1] and inverted (1 = open, 0 = closed), as its LIBERO dataset transform does; `openvla_gripper`
    maps the model's output back."""
    out = np.array(actions, dtype=np.float32, copy=True)
    if out.shape[-1] != ACTION_DIM:
        raise ValueError(f"expected {ACTION_DIM}-D LIBERO actions, got shape {out.shape}")
    out[..., -1] = 1.0 - np.clip(out[..., -1], 0.0, 1.0)
    return out


def openvla_gripper(action: np.ndarray) -> np.ndarray:
    """OpenVLA's gripper output in [0, 1] (1 = open) -> LIBERO's gripper command (-1 open, +1 close):
    2a - 1, binarized by sign, then inverted. The first six dimensions pass through."""
    out = np.array(action, dtype=np.float64, copy=True)
    if out.shape[-1] != ACTION_DIM:
        raise ValueError(f"expected {ACTION_DIM}-D LIBERO actions, got shape {out.shape}")
    out[..., -1] = -np.sign(2 * out[..., -1] - 1)
    return out
