"""openpi's binary encoding: msgpack, with a numpy array as the map
`{b"__ndarray__": True, b"data": raw C-order bytes, b"dtype": dtype.str, b"shape": [...]}` and a numpy
scalar as `{b"__npgeneric__": True, b"data": value, b"dtype": dtype.str}` (the layout of
openpi_client.msgpack_numpy, written here from the format).

Decoding trusts nothing from the network: only bool, integer and float dtypes (an object dtype would
need pickle), the shape must be non-negative integers whose product fits the bytes given, and
every problem is a `WireError` (400) naming what was wrong. Decoded arrays view the message's
bytes (read-only, no copy).
"""

from __future__ import annotations

import math

import msgpack
import numpy as np

from heisd.serving.wire import WireError

ARRAY_KINDS = "biuf"  # bool, signed and unsigned integers, floats: plain fixed-size values
MAX_DIMS = 8


def packb(obj) -> bytes:
    """`obj` (dicts, lists, str, numbers, numpy arrays and scalars) as msgpack bytes."""
    return msgpack.packb(obj, default=_pack)


def unpackb(data: bytes) -> object:
    """Bytes from a client -> its object with arrays restored; `WireError` if undecodable."""
    try:
        return msgpack.unpackb(data, object_hook=_unpack)
    except WireError:
        raise
    except msgpack.StackError:
        raise WireError(400, "message: msgpack nested too deeply (maps or arrays inside each other)") from None
    except (ValueError, TypeError, msgpack.UnpackException) as err:  # malformed, truncated, extra bytes
        detail = f"{type(err).__name__}: {err}" if str(err) else type(err).__name__
        raise WireError(400, f"message: not valid msgpack ({detail})") from None


def _pack(obj):
    if isinstance(obj, np.ndarray):
        if obj.dtype.kind not in ARRAY_KINDS:
            raise TypeError(f"cannot send a {obj.dtype} array (only bool, integer and float arrays)")
        # a C-contiguous array goes out as a view of its buffer, without a copy
        data = obj.data if obj.flags.c_contiguous else obj.tobytes()
        return {b"__ndarray__": True, b"data": data, b"dtype": obj.dtype.str, b"shape": list(obj.shape)}
    if isinstance(obj, np.generic):
        if obj.dtype.kind not in ARRAY_KINDS:
            raise TypeError(f"cannot send a {obj.dtype} value")
        return {b"__npgeneric__": True, b"data": obj.item(), b"dtype": obj.dtype.str}
    raise TypeError(f"cannot encode {type(obj).__name__} as msgpack")


def _unpack(obj: dict):
    if b"__ndarray__" in obj:
        dtype = _dtype(obj)
        shape = obj.get(b"shape")
        data = obj.get(b"data")
        if (not isinstance(shape, list) or len(shape) > MAX_DIMS
                or not all(isinstance(n, int) and not isinstance(n, bool) and n >= 0 for n in shape)):
            raise WireError(400, f"array: shape must be a list of at most {MAX_DIMS} non-negative integers")
        if not isinstance(data, bytes):
            raise WireError(400, "array: data must be bytes (msgpack bin)")
        if math.prod(shape) * dtype.itemsize != len(data):
            raise WireError(400, f"array: {len(data)} bytes do not fit shape {shape} of {dtype}")
        return np.frombuffer(data, dtype).reshape(shape)
    if b"__npgeneric__" in obj:
        dtype = _dtype(obj)
        value = obj.get(b"data")
        if isinstance(value, (dict, list, bytes, str)) or value is None:
            raise WireError(400, "scalar: data must be a number")
        try:
            return dtype.type(value)
        except (OverflowError, ValueError, TypeError) as err:
            raise WireError(400, f"scalar: {value!r} is not a {dtype} ({err})") from None
    return obj


def _dtype(obj: dict) -> np.dtype:
    name = obj.get(b"dtype")
    if not isinstance(name, str):
        raise WireError(400, "array: dtype must be a string such as '<f4' or '|u1'")
    try:
        dtype = np.dtype(name)
    except (TypeError, ValueError) as err:
        raise WireError(400, f"array: unknown dtype {name[:40]!r} ({err})") from None
    if dtype.kind not in ARRAY_KINDS or dtype.shape or dtype.names:
        raise WireError(400, f"array: dtype {name[:40]!r} refused (only bool, integer and float)")
    return dtype
