"""`heisd tiny-openvla`: a random OpenVLA checkpoint in the real file layout, a few MB.

Real file names (config.json, preprocessor_config.json, tokenizer files, sharded
`model-0000i-of-0000n.safetensors` + `model.safetensors.index.json`), real state-dict keys
(`scale_factor`, the unused last blocks, norms and SigLIP's attention pool included),
bf16 tensors; only the sizes are small. Tests generate it; it is never committed.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import torch
from safetensors.torch import save_file

from heisd.storage import atomic_directory
from heisd.targets.openvla.load import build_on_meta, file_shapes, read_parts
from heisd.targets.openvla.standin_tokenizer import save_standin_tokenizer
from heisd.targets.openvla.synthetic import NORM_STATS, config_dict, preprocessor_dict, random_tensors
from heisd.targets.openvla.weights import INDEX_FILE, SINGLE_FILE

STORAGE_DTYPE = torch.bfloat16  # as openvla-7b's files


def shard_names(n: int) -> list[str]:
    return [SINGLE_FILE] if n == 1 else [f"model-{i:05d}-of-{n:05d}.safetensors" for i in range(1, n + 1)]


def write_tiny_openvla(out: str | Path, seed: int = 0, shards: int = 2) -> dict[str, int]:
    """Write the checkpoint into the new or empty directory `out`; returns {file: tensors}."""
    out = Path(out)
    if shards < 1:
        raise ValueError(f"shards must be >= 1, got {shards}")
    if out.exists() and any(out.iterdir()):
        raise FileExistsError(f"{out} is not empty; tiny-openvla writes into a new or empty directory")
    with atomic_directory(out) as tmp:  # an interrupted write leaves no half checkpoint
        (tmp / "config.json").write_text(json.dumps(config_dict("tiny"), indent=2))
        (tmp / "preprocessor_config.json").write_text(json.dumps(preprocessor_dict(), indent=2))
        save_standin_tokenizer(tmp)
        parts = read_parts(tmp, unnorm_key=next(iter(NORM_STATS)))
        expected, ignorable = file_shapes(build_on_meta(parts))
        vocab = parts.config.vocab_size
        tensors = random_tensors({**expected, **ignorable}, seed, torch.device("cpu"), STORAGE_DTYPE,
                                 range(vocab - parts.config.n_action_bins, vocab))
        return save_sharded(tmp, tensors, shards)


def save_sharded(out: Path, tensors: dict[str, torch.Tensor], shards: int) -> dict[str, int]:
    names = shard_names(shards)
    groups: list[dict[str, torch.Tensor]] = [{} for _ in names]
    sizes = [0] * shards
    for key in sorted(tensors, key=lambda k: -tensors[k].nbytes):  # largest first onto the lightest shard
        i = sizes.index(min(sizes))
        groups[i][key] = tensors[key].contiguous()
        sizes[i] += tensors[key].nbytes
    for name, group in zip(names, groups):
        save_file(group, str(out / name), metadata={"format": "pt"})
        os.chmod(out / name, 0o644)  # safetensors writes 0600; checkpoints are shared read-only
    if shards > 1:
        weight_map = {k: name for name, group in zip(names, groups) for k in sorted(group)}
        index = {"metadata": {"total_size": sum(sizes)}, "weight_map": dict(sorted(weight_map.items()))}
        (out / INDEX_FILE).write_text(json.dumps(index, indent=2))
    return {name: len(group) for name, group in zip(names, groups)}
