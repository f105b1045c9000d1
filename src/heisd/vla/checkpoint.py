"""VLA checkpoints: a directory with config.json, model.safetensors, norm_stats.json, tokenizer.json."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file

from heisd.vla.text_tokenizer import TextTokenizer

if TYPE_CHECKING:
    from heisd.vla.model import VLA

CONFIG_FILE = "config.json"
WEIGHTS_FILE = "model.safetensors"
NORM_STATS_FILE = "norm_stats.json"
TOKENIZER_FILE = "tokenizer.json"
CHECKPOINT_FILES = (CONFIG_FILE, WEIGHTS_FILE, NORM_STATS_FILE, TOKENIZER_FILE)


class CheckpointError(ValueError):
    """A VLA checkpoint directory is missing, corrupt or inconsistent."""


def _state(model: "VLA") -> dict[str, torch.Tensor]:
    return {k: v.detach().contiguous() for k, v in model.state_dict().items()}


def save_vla(model: "VLA", directory: Path) -> None:
    """Write all files to a temp dir, then rename each into place (atomic per file).

    A reader never sees a half-written file; other files in `directory` (training logs,
    train_state.pt) are left alone.
    """
    directory.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".ckpt-", dir=directory))
    try:
        (tmp / CONFIG_FILE).write_text(json.dumps(model.config.to_dict(), indent=2))
        (tmp / NORM_STATS_FILE).write_text(json.dumps(model.norm_stats.to_dict(), indent=2))
        model.text_tokenizer.save(tmp / TOKENIZER_FILE)
        save_file(_state(model), str(tmp / WEIGHTS_FILE), metadata={"format": "pt"})
        for name in CHECKPOINT_FILES:
            os.chmod(tmp / name, 0o644)  # safetensors writes 0600; checkpoints are shared read-only
            os.replace(tmp / name, directory / name)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _read_json(path: Path) -> dict[str, Any]:
    try:
        return json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise CheckpointError(f"corrupt {path.name} in {path.parent}: {e}") from e


def load_vla(directory: Path) -> "VLA":
    from heisd.vla.model import VLA, NormStats, VLAConfig

    if not directory.is_dir():
        raise CheckpointError(f"no VLA checkpoint directory at {directory}")
    missing = [n for n in CHECKPOINT_FILES if not (directory / n).is_file()]
    if missing:
        raise CheckpointError(f"VLA checkpoint {directory} lacks {', '.join(missing)}")
    try:
        config = VLAConfig.from_dict(_read_json(directory / CONFIG_FILE))
        norm_stats = NormStats.from_dict(_read_json(directory / NORM_STATS_FILE))
        tokenizer = TextTokenizer.load(directory / TOKENIZER_FILE)
        model = VLA(config, norm_stats, tokenizer)
    except (KeyError, TypeError, ValueError) as e:
        raise CheckpointError(f"invalid VLA checkpoint {directory}: {e}") from e
    try:
        weights = load_file(str(directory / WEIGHTS_FILE))
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
