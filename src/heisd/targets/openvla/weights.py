"""Reading OpenVLA weights: one model.safetensors or shards listed in model.safetensors.index.json.

Every file's header is read and checked against the model before any tensor is loaded, so
a wrong checkpoint costs no memory and its error names each missing or mis-shaped key with
the file it is in. Tensors go straight to the target device and dtype, one at a time (a 7B
checkpoint never needs twice its size in RAM), each checked finite there: a NaN/inf weight
would otherwise decode the same edge-of-range action every step.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors import SafetensorError, safe_open

from heisd.targets.vla.checkpoint import CheckpointError, check_finite, nonfinite_count

SINGLE_FILE = "model.safetensors"
INDEX_FILE = "model.safetensors.index.json"
MAX_NAMED = 40  # keys named in one error line before the rest is counted


# The one renaming between timm's module names and OpenVLA's files: LayerScale's parameter.
def to_file_key(name: str) -> str:
    return name[: -len(".gamma")] + ".scale_factor" if name.endswith(".gamma") else name


def to_module_key(key: str) -> str:
    return key[: -len(".scale_factor")] + ".gamma" if key.endswith(".scale_factor") else key


@dataclass(frozen=True)
class TensorInfo:
    file: str  # file name inside the checkpoint directory
    shape: tuple[int, ...]


def weight_files(directory: Path) -> list[str]:
    """The safetensors files of the checkpoint; a clear error when one is missing."""
    index = directory / INDEX_FILE
    if index.is_file():
        try:
            weight_map = json.loads(index.read_text())["weight_map"]
        except (json.JSONDecodeError, UnicodeDecodeError, KeyError, TypeError) as e:
            raise CheckpointError(f"corrupt {index}: {type(e).__name__} {e}") from e
        files = sorted(set(weight_map.values()))
        for name in files:
            if not (directory / name).is_file():
                held = sorted(k for k, f in weight_map.items() if f == name)
                raise CheckpointError(f"{directory}: shard {name} listed in {INDEX_FILE} is missing "
                                      f"(it holds {len(held)} tensors, e.g. {held[0]})")
        return files
    if (directory / SINGLE_FILE).is_file():
        return [SINGLE_FILE]
    raise CheckpointError(f"{directory} has neither {SINGLE_FILE} nor {INDEX_FILE}")


def read_headers(directory: Path, files: list[str]) -> dict[str, TensorInfo]:
    """File key -> (file, shape), from the headers only."""
    found: dict[str, TensorInfo] = {}
    for name in files:
        try:
            with safe_open(str(directory / name), framework="pt") as f:
                for key in f.keys():
                    if key in found:
                        raise CheckpointError(f"{directory}: {key} is in both {found[key].file} and {name}")
                    found[key] = TensorInfo(name, tuple(f.get_slice(key).get_shape()))
        except (SafetensorError, OSError) as e:
            raise CheckpointError(f"corrupt safetensors file {directory / name}: {e}") from e
    return found


def check_keys(directory: Path, expected: dict[str, tuple[int, ...]], ignorable: dict[str, tuple[int, ...]],
               found: dict[str, TensorInfo]) -> None:
    """`expected` and `ignorable` map FILE keys to shapes; raise one line naming every mismatch."""
    problems = [f"missing {k}" for k in sorted(set(expected) - set(found))]
    problems += [f"{k} in {found[k].file}: shape {found[k].shape}, config.json expects {shape}"
                 for k, shape in sorted(expected.items()) if k in found and found[k].shape != shape]
    problems += [f"{k} in {found[k].file}: shape {found[k].shape}, config.json expects {shape}"
                 for k, shape in sorted(ignorable.items()) if k in found and found[k].shape != shape]
    problems += [f"unexpected {k} in {found[k].file}" for k in sorted(set(found) - set(expected) - set(ignorable))]
    if problems:
        more = f" (+{len(problems) - MAX_NAMED} more)" if len(problems) > MAX_NAMED else ""
        raise CheckpointError(f"{directory}: weights do not match config.json: "
                              + "; ".join(problems[:MAX_NAMED]) + more)


def load_tensors(directory: Path, keys: dict[str, TensorInfo], device: torch.device,
                 dtype: torch.dtype) -> dict[str, torch.Tensor]:
    """Module key -> tensor on `device`/`dtype`, for the given file keys; a tensor holding NaN/inf
    is refused, naming its file and key."""
    by_file: dict[str, list[str]] = {}
    for key, info in keys.items():
        by_file.setdefault(info.file, []).append(key)
    out: dict[str, torch.Tensor] = {}
    # safetensors maps CUDA devices itself; anything else is read on the CPU, then moved
    where = str(device) if device.type == "cuda" else "cpu"
    for name, file_keys in sorted(by_file.items()):
        try:
            with safe_open(str(directory / name), framework="pt", device=where) as f:
                for key in file_keys:
                    out[to_module_key(key)] = _finite(directory / name, key, f.get_tensor(key), device, dtype)
        except (SafetensorError, OSError) as e:
            raise CheckpointError(f"corrupt safetensors file {directory / name}: {e}") from e
    return out


def _finite(path: Path, key: str, stored: torch.Tensor, device: torch.device, dtype: torch.dtype) -> torch.Tensor:
    """`stored` on `device`/`dtype`, checked finite there (one pass over each tensor as it is loaded)."""
    tensor = stored.to(device=device, dtype=dtype)
    overflowed = nonfinite_count(tensor)
    if overflowed:
        check_finite(path, key, stored)  # NaN/inf in the file itself: corrupt
        name = str(dtype).removeprefix("torch.")
        raise CheckpointError(f"{path}: tensor {key!r} has {overflowed} values beyond the range of {name}; "
                              "load the checkpoint in bfloat16 or float32 (--dtype)")
    return tensor


def files_fingerprint(paths: tuple[Path, ...], note: str = "") -> str:
    """sha256 over each file's name and content (streamed: a 15 GB checkpoint hashes in seconds)."""
    h = hashlib.sha256(note.encode())
    for path in paths:
        h.update(path.name.encode())
        with open(path, "rb") as f:
            h.update(hashlib.file_digest(f, "sha256").digest())
    return h.hexdigest()
