"""The `/act` wire format: OpenVLA deploy.py's JSON (json-numpy arrays, or the whole request as a
json-numpy string under `"encoded"`) plus HeiSD's optional fields; or the same fields as one
msgpack map with openpi's msgpack-numpy arrays (`Content-Type: application/msgpack`, what
`heisd.client.PolicyClient` sends: no base64 or JSON text to build and parse on either side), whose
reply is msgpack too.

Nothing from the network is trusted: every problem becomes a `WireError` carrying the HTTP status
and a one-line message that names the field. Arrays are decoded with json-numpy's own decoder
or `msgpack_arrays` (no pickle: an object dtype cannot be built from a buffer and is refused).
"""

from __future__ import annotations

import json
from dataclasses import dataclass

import json_numpy
import numpy as np

from heisd.data.views import WRIST_KEY, stack_views

STEP_HEADER = "X-HeiSD-Step"  # response header: the step record as JSON (the body stays deploy.py's array)
MSGPACK = "application/msgpack"  # the binary request and reply encoding
MAX_ID_CHARS = 128  # episode_id / task / unnorm_key length
MAX_INSTRUCTION_CHARS = 1000
# Own codec objects: deploy.py-style code calls json_numpy.patch(), which replaces json.loads/dumps
# process-wide; the server parses the same whatever was patched.
_DECODER, _ENCODER = json.JSONDecoder(), json.JSONEncoder()


class WireError(Exception):
    """A request the server refuses; `status` is the HTTP status (4xx)."""

    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status, self.message = status, message


@dataclass(frozen=True)
class WireLimits:
    max_image_side: int = 1024  # pixels; a larger image is refused (413) before any model work
    max_path_steps: int = 256  # rows of `ee_pos` per request (positions since the previous call)


@dataclass(frozen=True)
class ActRequest:
    image: np.ndarray  # uint8 [H, W, 3]
    instruction: str
    unnorm_key: str | None  # which action statistics un-normalize the reply (None: the target's only set)
    episode_id: str | None  # a session; None = a one-off step with no episode state kept
    reset: bool  # start (or restart) episode `episode_id`
    proprio: np.ndarray | None  # float [state_dim]: the target's state vector
    ee_pos: np.ndarray | None  # float [n, 3]: end-effector positions since the previous call, latest last
    task: str | None  # benchmark task name (selects the datastore collection); None: found from the instruction
    encoded: bool  # the request came as {"encoded": ...}: the reply goes back the same way
    binary: bool = False  # the request came as msgpack: so does the reply (actions and step record)
    wrist_image: np.ndarray | None = None  # uint8 [H, W, 3], the wrist camera (a two-camera target needs it)

    def frame(self, views: int) -> np.ndarray:
        """What a target with `views` cameras reads: the image, or the image above the wrist image."""
        if views == 1:
            return self.image
        if self.wrist_image is None:
            raise WireError(422, "wrist_image: missing; this server's target reads the wrist camera beside the "
                                 "image (send both, the same size)")
        if self.wrist_image.shape != self.image.shape:
            raise WireError(422, f"wrist_image: shape {list(self.wrist_image.shape)}, the image's is "
                                 f"{list(self.image.shape)}: the target reads both cameras at one size")
        return stack_views(self.image, self.wrist_image)


def parse_act(body: bytes, limits: WireLimits, content_type: str | None = None) -> ActRequest:
    """A request body -> ActRequest; `content_type` (the header) selects JSON (default) or msgpack."""
    if is_msgpack(content_type):
        from heisd.serving.msgpack_arrays import unpackb  # here: that module uses this one's WireError

        payload = unpackb(body)
        if not isinstance(payload, dict):
            raise WireError(422, f"request body: expected a msgpack map, got {type(payload).__name__}")
        return _act_fields(payload, limits, _binary_array, encoded=False, binary=True)
    payload = _json_object(body, "request body")
    encoded = "encoded" in payload
    if encoded:  # deploy.py's double encoding: the whole request as one json-numpy string
        if len(payload) != 1:
            raise WireError(422, f"an 'encoded' request carries nothing else, got fields {sorted(payload)}")
        if not isinstance(payload["encoded"], str):
            raise WireError(422, "'encoded' must be a string holding the JSON request")
        payload = _json_object(payload["encoded"].encode(), "'encoded'")
    return _act_fields(payload, limits, _array, encoded=encoded, binary=False)


def is_msgpack(content_type: str | None) -> bool:
    return content_type is not None and content_type.split(";", 1)[0].strip().lower() == MSGPACK


def _act_fields(payload: dict, limits: WireLimits, array_of, encoded: bool, binary: bool) -> ActRequest:
    """The request's fields, whichever encoding carried them; `array_of(payload, name, required)`
    gets one array field (a copy: torch wants writable buffers) or None."""
    image = check_image(array_of(payload, "image", required=True), limits)
    wrist = array_of(payload, WRIST_KEY)
    instruction = check_instruction(string_field(payload, "instruction", MAX_INSTRUCTION_CHARS, required=True))
    reset = payload.get("reset", False)
    if not isinstance(reset, bool):
        raise WireError(422, f"reset: expected true or false, got {shown(reset)}")
    episode_id = string_field(payload, "episode_id", MAX_ID_CHARS)
    if reset and episode_id is None:
        raise WireError(422, "reset: needs an episode_id (a request without one keeps no episode state)")
    floats = {}
    for name in ("proprio", "ee_pos"):
        array = array_of(payload, name)
        floats[name] = None if array is None else check_floats(name, array)
    ee_pos = floats["ee_pos"]
    return ActRequest(
        image=image, instruction=instruction, unnorm_key=string_field(payload, "unnorm_key", MAX_ID_CHARS),
        episode_id=episode_id, reset=reset, proprio=floats["proprio"],
        ee_pos=None if ee_pos is None else check_ee_pos(ee_pos, limits),
        task=string_field(payload, "task", MAX_ID_CHARS), encoded=encoded, binary=binary,
        wrist_image=None if wrist is None else check_image(wrist, limits, WRIST_KEY),
    )


def check_image(image: np.ndarray, limits: WireLimits, name: str = "image") -> np.ndarray:
    """A uint8 [H, W, 3] frame within the size limit (every wire format's images pass here)."""
    if image.dtype != np.uint8:
        raise WireError(422, f"{name}: dtype {image.dtype}, expected uint8")
    if image.ndim != 3 or image.shape[2] != 3 or 0 in image.shape:
        raise WireError(422, f"{name}: shape {list(image.shape)}, expected [H, W, 3] with H, W >= 1")
    if max(image.shape[:2]) > limits.max_image_side:
        raise WireError(413, f"{name}: {image.shape[0]}x{image.shape[1]} exceeds {limits.max_image_side} "
                             "pixels a side (serve --max-image-side)")
    return image


def check_instruction(instruction: str) -> str:
    if not instruction.strip():
        raise WireError(422, "instruction: empty")
    return instruction


def check_floats(name: str, array: np.ndarray) -> np.ndarray:
    """A finite float array (`proprio`, `ee_pos`)."""
    if array.dtype.kind != "f":
        raise WireError(422, f"{name}: dtype {array.dtype}, expected a float array")
    if not np.isfinite(array).all():
        raise WireError(422, f"{name}: non-finite values")
    return array


def check_ee_pos(ee_pos: np.ndarray, limits: WireLimits) -> np.ndarray:
    """[3] or [n, 3] end-effector positions -> [n, 3]."""
    ee_pos = ee_pos.reshape(-1, 3) if ee_pos.shape == (3,) else ee_pos
    if ee_pos.ndim != 2 or ee_pos.shape[1] != 3 or not 1 <= len(ee_pos) <= limits.max_path_steps:
        raise WireError(422, f"ee_pos: shape {list(ee_pos.shape)}, expected [3] or [n, 3] with "
                             f"1 <= n <= {limits.max_path_steps}")
    return ee_pos


def parse_end(body: bytes) -> tuple[str, bool | None]:
    """`/end` body: {"episode_id": str, "success": bool or null} -> (episode_id, success).
    A null or absent `success` closes the episode without teaching the adaptive skips anything."""
    payload = _json_object(body, "request body")
    success = payload.get("success")
    if success is not None and not isinstance(success, bool):
        raise WireError(422, f"success: expected true, false or null, got {shown(success)}")
    return string_field(payload, "episode_id", MAX_ID_CHARS, required=True), success


def encode_binary_reply(actions: np.ndarray, record: dict) -> bytes:
    """The reply to a msgpack request: {"actions": [chunk, action_dim], "heisd_step": the step record}."""
    from heisd.serving.msgpack_arrays import packb

    return packb({"actions": actions, "heisd_step": record})


def encode_actions(actions: np.ndarray, encoded: bool) -> bytes:
    """The reply body: the json-numpy array, or (for an encoded request) that JSON as a JSON string."""
    text = json_numpy.dumps(actions)
    return (_ENCODER.encode(text) if encoded else text).encode()


def encode_record(record: dict) -> str:
    """The `STEP_HEADER` value: the step record as one line of ASCII JSON."""
    return _ENCODER.encode(record)


def _json_object(raw: bytes, what: str) -> dict:
    try:
        payload = _DECODER.decode(raw.decode())
    except (ValueError, UnicodeDecodeError) as err:  # JSONDecodeError is a ValueError
        raise WireError(400, f"{what}: not valid JSON ({err})") from None
    except RecursionError:  # the decoder recurses per nesting level: a deep body is malformed, not our fault
        raise WireError(400, f"{what}: JSON nested too deeply (arrays or objects inside each other beyond "
                             "Python's recursion limit)") from None
    if not isinstance(payload, dict):
        raise WireError(422, f"{what}: expected a JSON object, got {type(payload).__name__}")
    return payload


def shown(value: object, limit: int = 80) -> str:
    """A client's value in an error message, cut short; an array or object is named, not printed
    (it may be huge, or nested deep enough to break `repr`)."""
    if isinstance(value, (list, dict)):
        return "an array" if isinstance(value, list) else "an object"
    text = repr(value)
    return text if len(text) <= limit else text[:limit] + "..."


def string_field(payload: dict, name: str, max_chars: int, required: bool = False) -> str | None:
    value = payload.get(name)
    if value is None:
        if required:
            raise WireError(422, f"{name}: missing")
        return None
    if not isinstance(value, str):
        raise WireError(422, f"{name}: expected a string, got {type(value).__name__}")
    if len(value) > max_chars:
        raise WireError(422, f"{name}: {len(value)} characters, at most {max_chars}")
    return value


def _array(payload: dict, name: str, required: bool = False) -> np.ndarray | None:
    value = payload.get(name)
    if value is None:
        if required:
            raise WireError(422, f"{name}: missing")
        return None
    if not isinstance(value, dict) or not {"__numpy__", "dtype", "shape"} <= value.keys():
        raise WireError(422, f"{name}: expected a json-numpy array "
                             '({"__numpy__": base64, "dtype": ..., "shape": [...]})')
    try:
        array = json_numpy.object_hook(value)
    except (ValueError, TypeError, KeyError) as err:  # bad base64, dtype, or a shape that does not fit
        raise WireError(400, f"{name}: undecodable json-numpy array ({err})") from None
    if not isinstance(array, np.ndarray) or array.shape == ():
        raise WireError(422, f"{name}: expected an array, got a scalar")
    return array.copy()  # json-numpy arrays view the read-only request buffer


def _binary_array(payload: dict, name: str, required: bool = False) -> np.ndarray | None:
    value = payload.get(name)
    if value is None:
        if required:
            raise WireError(422, f"{name}: missing")
        return None
    if not isinstance(value, np.ndarray):
        raise WireError(422, f"{name}: expected a msgpack-numpy array, got {type(value).__name__}")
    if value.shape == ():
        raise WireError(422, f"{name}: expected an array, got a scalar")
    return value.copy()  # decoded arrays view the read-only request buffer
