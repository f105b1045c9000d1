"""`--target DIR`: recognize the kind of checkpoint from its config.json and load it."""

from __future__ import annotations

from pathlib import Path

import torch

from heisd.targets.base import Target
from heisd.targets.vla.checkpoint import CheckpointError, read_json

OPENVLA = "openvla"  # config.json `model_type` of OpenVLA checkpoints
SMALL_VLA = "heisd-vla"  # our own checkpoints (config.json without `model_type`)


def checkpoint_kind(directory: str | Path) -> str:
    """`OPENVLA` or `SMALL_VLA`; a clear error for anything else."""
    if not Path(directory).is_dir():
        # a relative path through a linked folder (cd into outputs/x, then ../../checkpoints) lands elsewhere
        where = "" if Path(directory).is_absolute() else f" (a relative path is read from here, {Path.cwd()})"
        raise CheckpointError(f"{directory}: no such checkpoint directory{where}")
    path = Path(directory) / "config.json"
    config = read_json(path, missing=f"no config.json in {directory}: not a target checkpoint directory")
    kind = config.get("model_type")
    if kind is None and "target_fingerprint" in config and "chunk" not in config:
        raise CheckpointError(f"{directory} is a drafter (made by heisd train-drafter), not a target: "
                              "pass it as --drafter, and the target it was trained for as --target")
    if kind is None:
        return SMALL_VLA
    if kind == OPENVLA:
        return OPENVLA
    raise CheckpointError(f"{path}: model_type {kind!r} is not a supported target (expected 'openvla' or none)")


def is_openvla(directory: str | Path) -> bool:
    return checkpoint_kind(directory) == OPENVLA


def closed_loop_unnorm_key(directory: str | Path, benchmark: str, unnorm_key: str | None) -> str | None:
    """The statistics an OpenVLA target acting in a LIBERO suite de-normalizes with when none is named:
    the suite's, as OpenVLA's eval (run_libero_eval.py) does (`<suite>`, else `<suite>_no_noops`)."""
    from heisd.benchmarks.registry import is_libero

    if unnorm_key is None and is_libero(benchmark) and is_openvla(directory):
        return benchmark
    return unnorm_key


def load_target(directory: str | Path, device: str | torch.device = "cpu", dtype: torch.dtype = torch.float32,
                unnorm_key: str | None = None) -> Target:
    """The target in eval mode on `device`/`dtype`. `unnorm_key` picks OpenVLA's action statistics."""
    if is_openvla(directory):
        from heisd.targets.openvla import load_openvla

        return load_openvla(directory, device=device, dtype=dtype, unnorm_key=unnorm_key)
    if unnorm_key is not None:
        raise CheckpointError(f"{directory} is a heisd VLA checkpoint: it has one set of action statistics, "
                              f"--unnorm-key applies to OpenVLA checkpoints only")
    from heisd.targets.vla.model import VLA

    vla = VLA.from_pretrained(directory)
    vla.pin_fingerprint()  # the stored weights' identity, in whatever dtype they run
    return vla.to(device=device, dtype=dtype).eval()
