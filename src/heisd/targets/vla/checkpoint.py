"""VLA checkpoints: a directory with config.json, model.safetensors, norm_stats.json, tokenizer.json.

The weights file's metadata records the token layout the model was trained with (text vocab,
n_bins, action_dim, chunk); loading refuses a config.json that disagrees with it. The padded
vocabulary would otherwise hide a changed n_bins, which silently changes every action.
Checkpoints saved before that record was written are checked against train_info.json instead.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import load_file, save_file

from heisd.errors import HeisdError
from heisd.storage import atomic_files
from heisd.targets.vla.text_tokenizer import TextTokenizer

if TYPE_CHECKING:
    from heisd.targets.vla.model import VLA

CONFIG_FILE = "config.json"
WEIGHTS_FILE = "model.safetensors"
NORM_STATS_FILE = "norm_stats.json"
TOKENIZER_FILE = "tokenizer.json"
CHECKPOINT_FILES = (CONFIG_FILE, WEIGHTS_FILE, NORM_STATS_FILE, TOKENIZER_FILE)
LAYOUT_FIELDS = ("text_vocab_size", "n_bins", "action_dim", "chunk")  # what decides the action tokens
LAYOUT_METADATA = "heisd_layout"  # weights-file metadata key: those fields as trained, JSON
TRAIN_INFO_FILE = "train_info.json"  # older checkpoints: its model_config has the layout


class CheckpointError(HeisdError, ValueError):
    """A VLA checkpoint directory is missing, corrupt or inconsistent."""


def nonfinite_count(tensor: torch.Tensor) -> int:
    """NaN/inf values in a floating-point tensor (0 for other dtypes): one pass, counted only when some."""
    if not tensor.is_floating_point() or bool(torch.isfinite(tensor).all()):
        return 0
    return tensor.numel() - int(torch.isfinite(tensor).sum())


def check_finite(path: Path, key: str, tensor: torch.Tensor, error: type[HeisdError] | None = None) -> None:
    """Refuse a weight holding NaN/inf (raised as `error`, default `CheckpointError`): such a model
    loads and runs, and decodes the same edge-of-range action every step instead of failing."""
    bad = nonfinite_count(tensor)
    if bad:
        raise (error or CheckpointError)(f"{path}: tensor {key!r} holds {bad} non-finite values (NaN/inf); "
                                         "the checkpoint is corrupt")


def _state(model: "VLA") -> dict[str, torch.Tensor]:
    return {k: v.detach().cpu().contiguous() for k, v in model.state_dict().items()}  # same file from any device


def _layout(config: dict[str, Any]) -> dict[str, Any]:
    return {k: config.get(k) for k in LAYOUT_FIELDS}


def save_vla(model: "VLA", directory: Path) -> None:
    """Write all files, then rename them into place together.

    A reader never sees a half-written file; other files in `directory` (training logs,
    train_state.pt) are left alone.
    """
    config = model.config.to_dict()
    with atomic_files(directory, CHECKPOINT_FILES) as tmp:
        tmp[CONFIG_FILE].write_text(json.dumps(config, indent=2))
        tmp[NORM_STATS_FILE].write_text(json.dumps(model.norm_stats.to_dict(), indent=2))
        model.text_tokenizer.save(tmp[TOKENIZER_FILE])
        save_file(_state(model), str(tmp[WEIGHTS_FILE]),
                  metadata={"format": "pt", LAYOUT_METADATA: json.dumps(_layout(config))})
        for path in tmp.values():
            os.chmod(path, 0o644)  # safetensors writes 0600; checkpoints are shared read-only


def _trained_layout(directory: Path) -> tuple[dict[str, Any] | None, str]:
    """The token layout the weights were trained with, and where it was read from (None if unrecorded)."""
    with safe_open(str(directory / WEIGHTS_FILE), "pt") as f:
        recorded = (f.metadata() or {}).get(LAYOUT_METADATA)
    if recorded is not None:
        return json.loads(recorded), WEIGHTS_FILE
    info = directory / TRAIN_INFO_FILE
    if info.is_file():
        config = read_json(info).get("model_config")
        if isinstance(config, dict):
            return _layout(config), TRAIN_INFO_FILE
    return None, ""


def _check_layout(directory: Path, config: dict[str, Any]) -> None:
    trained, source = _trained_layout(directory)
    if trained is None:
        return
    diff = [f"{k} {config.get(k)!r} vs {trained[k]!r}" for k in LAYOUT_FIELDS if config.get(k) != trained[k]]
    if diff:
        raise CheckpointError(f"{directory}: {CONFIG_FILE} disagrees with the model as trained ({source}): "
                              + ", ".join(diff) + "; restore the original config.json")


def read_json(path: Path, missing: str | None = None) -> dict[str, Any]:
    """A checkpoint's JSON object; `missing` is the error when the file is absent (None: the
    caller has checked). Every checkpoint kind reads its JSON files through here."""
    if missing is not None and not path.is_file():
        raise CheckpointError(missing)
    try:
        data = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise CheckpointError(f"corrupt {path.name} in {path.parent}: {e}") from e
    if not isinstance(data, dict):
        raise CheckpointError(f"{path}: expected a JSON object")
    return data


def load_vla(directory: Path) -> "VLA":
    from heisd.targets.vla.model import VLA, NormStats, VLAConfig

    if not directory.is_dir():
        raise CheckpointError(f"no VLA checkpoint directory at {directory}")
    missing = [n for n in CHECKPOINT_FILES if not (directory / n).is_file()]
    if missing:
        raise CheckpointError(f"VLA checkpoint {directory} lacks {', '.join(missing)}")
    try:
        raw_config = read_json(directory / CONFIG_FILE)
        config = VLAConfig.from_dict(raw_config)
        norm_stats = NormStats.from_dict(read_json(directory / NORM_STATS_FILE))
        tokenizer = TextTokenizer.load(directory / TOKENIZER_FILE)
        model = VLA(config, norm_stats, tokenizer)
    except (KeyError, TypeError, ValueError) as e:
        raise CheckpointError(f"invalid VLA checkpoint {directory}: {e}") from e
    try:
        weights = load_file(str(directory / WEIGHTS_FILE))
        _check_layout(directory, raw_config)
    except (SafetensorError, OSError) as e:
        raise CheckpointError(f"corrupt {WEIGHTS_FILE} in {directory}: {e}") from e
    expected = {k: tuple(v.shape) for k, v in model.state_dict().items()}
    found = {k: tuple(v.shape) for k, v in weights.items()}
    if expected != found:
        lines = [f"missing {k}" for k in sorted(set(expected) - set(found))]
        lines += [f"unexpected {k}" for k in sorted(set(found) - set(expected))]
        lines += [f"{k}: weights {found[k]} vs config {expected[k]}"
                  for k in sorted(set(expected) & set(found)) if expected[k] != found[k]]
        raise CheckpointError(f"{directory}: config.json does not match the weights: " + "; ".join(lines[:8]))
    for key, tensor in weights.items():
        check_finite(directory / WEIGHTS_FILE, key, tensor)
    model.load_state_dict(weights)
    model.eval()
    return model


def fingerprint(model: "VLA") -> str:
    """sha256 over config, norm stats, tokenizer and every weight: identifies the target exactly."""
    h = hashlib.sha256()
    h.update(json.dumps(model.config.to_dict(), sort_keys=True).encode())
    h.update(json.dumps(model.norm_stats.to_dict(), sort_keys=True).encode())
    h.update(model.text_tokenizer.tokenizer.to_str().encode())
    for name, tensor in sorted(_state(model).items()):
        h.update(f"{name}:{tensor.dtype}:{tuple(tensor.shape)}".encode())
        h.update(tensor.cpu().numpy().tobytes())
    return h.hexdigest()
