"""openpi's observation dict -> heisd's request, and heisd's answer -> openpi's reply.

openpi clients (`openpi_client.WebsocketClientPolicy.infer(obs)`) send one dict per step and read
`reply["actions"]`. The mapping, key by key (the first key present wins):

    image        "image", "observation/image", "observation/exterior_image_1_left", or "images"
                 (a dict of cameras: "cam_high", else its first); uint8 [H, W, 3], or [3, H, W] as
                 openpi's ALOHA clients send (transposed)
    wrist image  "wrist_image" or "observation/wrist_image" (openpi's LIBERO example's key), as the
                 image: read by a target of two cameras (`train-vla --wrist`), ignored by others
    instruction  "prompt" (openpi's name), or "instruction"
    proprio      "proprio", "state" or "observation/state", when the target takes a state; ignored
                 when it takes none (openpi clients send a state whatever the policy)
    ee_pos       "ee_pos" or "observation/ee_pos": [3] or [n, 3], as on the REST side (without it a
                 target with a state takes the state's first three values, as `VLAPolicy` does)
    task, unnorm_key   as on the REST side
    reset        true: this observation starts a new episode
    end          {"end": true, "success": true|false|null}: close the episode (its outcome teaches
                 the adaptive skips), like POST /end; the reply is {"episode_id", "steps", "success"}

Episodes: a connection is one episode at a time. Its first observation starts one, as does an
observation with "reset": true, or after "end", or with another prompt than the episode's (openpi
clients such as its LIBERO example keep one connection across tasks and never say reset; on the
REST side a new instruction without reset is a 409). Closing the connection ends the episode.

The reply: {"actions": float [chunk, action_dim], "server_timing": {"infer_ms", "prev_total_ms"
(openpi's keys: the step; the previous reply's receive -> sent), "queue_ms", "total_ms" (this reply's
receive -> ready)}, "heisd_step": the step record}.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from heisd.serving.wire import (MAX_ID_CHARS, MAX_INSTRUCTION_CHARS, ActRequest, WireError, WireLimits,
                                check_ee_pos, check_floats, check_image, check_instruction, shown, string_field)
from heisd.serving.worker import Done

IMAGE_KEYS = ("image", "observation/image", "observation/exterior_image_1_left")
WRIST_KEYS = ("wrist_image", "observation/wrist_image")
CAMERA_KEY = "images"  # openpi's ALOHA layout: {"cam_high": ..., "cam_left_wrist": ...}
MAIN_CAMERA = "cam_high"
PROMPT_KEYS = ("prompt", "instruction")
STATE_KEYS = ("proprio", "state", "observation/state")
EE_KEYS = ("ee_pos", "observation/ee_pos")


@dataclass(frozen=True)
class Observation:
    """One openpi message: a step to act on, or the end of the episode."""

    request: ActRequest | None  # None for an end message
    reset: bool  # the client asked for a new episode
    end: bool = False
    success: bool | None = None  # an end message's outcome (None: unknown)


def parse_observation(obs: object, limits: WireLimits, takes_state: bool, episode_id: str) -> Observation:
    if not isinstance(obs, dict):
        raise WireError(422, f"message: expected a map (the observation dict), got {type(obs).__name__}")
    if _flag(obs, "end"):
        success = obs.get("success")
        if success is not None and not isinstance(success, (bool, np.bool_)):
            raise WireError(422, f"success: expected true, false or null, got {shown(success)}")
        return Observation(None, False, end=True, success=None if success is None else bool(success))
    image, image_key = _image(obs)
    image = check_image(image, limits, image_key)
    wrist_key = _first(obs, WRIST_KEYS)
    wrist = None if wrist_key is None else check_image(_hwc(obs[wrist_key], wrist_key), limits, wrist_key)
    key = _first(obs, PROMPT_KEYS)
    if key is None:
        raise WireError(422, f"prompt: missing (the instruction, as {' or '.join(PROMPT_KEYS)})")
    instruction = check_instruction(string_field(obs, key, MAX_INSTRUCTION_CHARS))
    proprio = None
    state_key = _first(obs, STATE_KEYS)
    if takes_state and state_key is not None:
        proprio = check_floats(state_key, _floats(obs[state_key], state_key))
    ee_key = _first(obs, EE_KEYS)
    ee_pos = None if ee_key is None else check_ee_pos(check_floats(ee_key, _floats(obs[ee_key], ee_key)), limits)
    request = ActRequest(
        image=image, instruction=instruction, unnorm_key=string_field(obs, "unnorm_key", MAX_ID_CHARS),
        episode_id=episode_id, reset=False, proprio=proprio, ee_pos=ee_pos,
        task=string_field(obs, "task", MAX_ID_CHARS), encoded=False, wrist_image=wrist,
    )
    return Observation(request, _flag(obs, "reset"))


def reply(actions: np.ndarray, record: dict, done: Done, total_ms: float, prev_total_ms: float | None) -> dict:
    """`done`: the model worker's timing of the step; `total_ms`: frame received -> reply ready."""
    timing = {"infer_ms": done.run_ms, "queue_ms": done.queue_ms, "total_ms": total_ms}
    if prev_total_ms is not None:  # openpi's: the previous step's receive -> reply sent
        timing["prev_total_ms"] = prev_total_ms
    return {"actions": actions, "server_timing": timing, "heisd_step": record}


def _first(obs: dict, keys: tuple[str, ...]) -> str | None:
    return next((k for k in keys if obs.get(k) is not None), None)


def _flag(obs: dict, name: str) -> bool:
    value = obs.get(name, False)
    if not isinstance(value, (bool, np.bool_)):
        raise WireError(422, f"{name}: expected true or false, got {shown(value)}")
    return bool(value)


def _image(obs: dict) -> tuple[np.ndarray, str]:
    """(the image, its key)"""
    key = _first(obs, IMAGE_KEYS)
    if key is not None:
        return _hwc(obs[key], key), key
    cameras = obs.get(CAMERA_KEY)
    if isinstance(cameras, dict) and cameras:
        name = MAIN_CAMERA if MAIN_CAMERA in cameras else next(iter(cameras))
        return _hwc(cameras[name], f"{CAMERA_KEY}/{name}"), f"{CAMERA_KEY}/{name}"
    raise WireError(422, f"image: missing (one of {', '.join(IMAGE_KEYS)}, or {CAMERA_KEY!r}: a dict of cameras)")


def _hwc(value: object, key: str) -> np.ndarray:
    if not isinstance(value, np.ndarray):
        raise WireError(422, f"{key}: expected a numpy array (msgpack-numpy), got {type(value).__name__}")
    if value.ndim == 3 and value.shape[0] == 3 and value.shape[2] != 3:  # [3, H, W]
        value = np.ascontiguousarray(value.transpose(1, 2, 0))
    return value


def _floats(value: object, key: str) -> np.ndarray:
    """A numpy array (copied: decoded ones view the read-only frame), or a list of numbers, as a float array."""
    if isinstance(value, list):
        if not all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in value):
            raise WireError(422, f"{key}: expected a float array or a list of numbers")
        return np.asarray(value, dtype=np.float64)
    if not isinstance(value, np.ndarray):
        raise WireError(422, f"{key}: expected a float array, got {type(value).__name__}")
    return value.copy()
