"""The frame a target reads when it sees two cameras: agentview above the wrist view, one array.

LIBERO renders its wrist camera beside agentview on request (`LiberoConfig.wrist`, ``obs["wrist_image"]``)
and its dataset files store it as ``obs/eye_in_hand_rgb``. A target that reads both (`TargetSpec.views`
= 2) takes them stacked top to bottom as one uint8 frame [2H, W, 3], so every path that carries a
frame to a target (evaluation, datastores, drafters, calibration, the server) carries one array
whatever the target reads; the target splits it back.
"""

from __future__ import annotations

import numpy as np

from heisd.benchmarks.cameras import WRIST_KEY
from heisd.errors import InputError

VIEWS = (1, 2)  # agentview alone, or agentview and the wrist camera


def stack_views(image: np.ndarray, wrist: np.ndarray) -> np.ndarray:
    """[..., H, W, 3] agentview and wrist frames -> [..., 2H, W, 3], agentview on top."""
    if image.shape != wrist.shape:
        raise InputError(f"the wrist frame has shape {wrist.shape}, agentview {image.shape}: the two cameras "
                         "must be rendered at the same size")
    return np.concatenate([image, wrist], axis=-3)


def split_frame(frame: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """`stack_views`'s inverse: a [2S, S, 3] frame -> (agentview, wrist), what a server is sent apart. Square
    cameras, as the target's own split (`heisd.targets.vla.vision.split_views`) requires: one camera's frame
    is refused here rather than sent as two halves."""
    if frame.ndim != 3 or frame.shape[0] != 2 * frame.shape[1]:
        raise InputError(f"a two-camera frame is [2S, S, 3] (agentview above the wrist view), got {list(frame.shape)}")
    half = frame.shape[0] // 2
    return frame[:half], frame[half:]


def observed_frame(obs: dict, views: int) -> np.ndarray:
    """The frame a target with `views` cameras reads from an environment observation."""
    if views == 1:
        return obs["image"]
    wrist = obs.get(WRIST_KEY)
    if wrist is None:
        raise InputError("this target reads the wrist camera too, and the observation has no wrist frame "
                         f"({WRIST_KEY!r}): only LIBERO renders one")
    return stack_views(obs["image"], wrist)


def target_frames(spec, ep, steps: slice | np.ndarray = slice(None)) -> np.ndarray:
    """A recorded episode's frames at `steps` as the closed loop shows them to the target of `spec`
    (a `TargetSpec`): its cameras (`Episode.frames`), through its protocol (`protocol_frames`)."""
    from heisd.benchmarks.libero_protocol import protocol_frames

    return protocol_frames(spec.protocol, ep.frames(spec.views, steps))
