"""`heisd profile`: per-piece cost of a target on this device (vision, prefill, decode step, tree
verification, drafter pass, datastore query), as JSON and a table."""

from __future__ import annotations

import argparse
import platform
from pathlib import Path

from heisd.storage import OutputKind, check_output, recorded_path, write_json
from heisd.storage.guard import json_file_with

LOCKS_OUT = True  # --out has one writer at a time (see heisd.commands.runner)
HELP = "Measure the per-piece cost of a target (or a random OpenVLA-7B) on this device."
PROFILE = OutputKind("profile", json_file_with("target", "device", "versions"))


def add_arguments(p: argparse.ArgumentParser) -> None:
    from heisd.commands.common import CUDA_GRAPHS_HELP, TARGET_HELP, add_target_arguments

    which = p.add_mutually_exclusive_group(required=True)
    which.add_argument("--target", type=Path, help=TARGET_HELP)
    which.add_argument("--random-openvla-7b", action="store_true",
                       help="build an OpenVLA-7B-shaped model with random weights on --device (no download)")
    p.add_argument("--random-shape", choices=("7b", "tiny"), default="7b",
                   help="shape of the --random-openvla-7b model: the real 7b, or the tiny-openvla test shape "
                        "(a cheap dry run)")
    p.add_argument("--out", type=Path, required=True, help="JSON file to write")
    p.add_argument("--overwrite", action="store_true", help="replace an existing profile at --out")
    add_target_arguments(p, target=False)
    drafter = p.add_mutually_exclusive_group()
    drafter.add_argument("--drafter", type=Path, default=None,
                         help="drafter directory: time one drafter pass (any drafter of the target's width)")
    drafter.add_argument("--random-drafter", action="store_true",
                         help="time one pass of an untrained drafter of the target's shape")
    p.add_argument("--datastore", type=Path, default=None, help="datastore directory: time one Top-K query")
    p.add_argument("--repeats", type=int, default=20, help="timed runs per piece (median reported)")
    p.add_argument("--warmup", type=int, default=3, help="untimed runs before them")
    p.add_argument("--tree-sizes", type=int, nargs="+", default=[4, 8, 16, 32, 64],
                   help="draft-tree sizes (nodes) to time one verification pass for")
    p.add_argument("--rounds", type=int, default=10,
                   help="the pieces take turns this many times, each timed in a tight loop of repeats / rounds runs "
                        "per turn, so a change in machine load hits every piece alike (1: each piece once, start to "
                        "end; capped at --repeats)")
    p.add_argument("--device-work", action="store_true",
                   help="CUDA only: also read each piece's GPU kernel time and kernel count per call with "
                        "torch.profiler (5 more calls each, after the timing); a kernel time far below the median "
                        "means the piece is bound by the host launching its kernels, not by the GPU")
    p.add_argument("--cuda-graphs", action="store_true", help=CUDA_GRAPHS_HELP + "; each pass shape is "
                   "captured in the untimed warm-up runs")
    p.add_argument("--threads", type=int, default=1, help="torch CPU threads")
    p.add_argument("--seed", type=int, default=0, help="seed of random weights and of the profiled frame")


def _device_name(device) -> str:
    import torch

    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.is_file():
        for line in cpuinfo.read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor() or "cpu"


def _load(args: argparse.Namespace, device, dtype):
    """(target, its name for the report, drafter or None, datastore or None)."""
    import torch

    from heisd.profiling import random_drafter

    if args.random_openvla_7b:
        from heisd.targets.openvla import random_openvla

        target = random_openvla(args.random_shape, device, dtype, seed=args.seed)
        name = f"random OpenVLA ({args.random_shape} shape)"
    else:
        from heisd.targets import load_target

        target = load_target(args.target, device, dtype, unnorm_key=args.unnorm_key)
        name = recorded_path(args.target)
    drafter = None
    if args.random_drafter:
        torch.manual_seed(args.seed)
        drafter = random_drafter(target)
    elif args.drafter is not None:
        from heisd.drafter.model import Drafter, DrafterTarget

        bound = DrafterTarget.from_target(target)
        # any drafter of the right width costs the same; training against this target is not needed here
        drafter = Drafter.from_pretrained(args.drafter, bound, allow_fingerprint_mismatch=True)
    datastore = None
    if args.datastore is not None:
        from heisd.retrieval.datastore import Datastore

        datastore = Datastore.load(args.datastore)
    return target, name, drafter, datastore


def run(args: argparse.Namespace) -> int:
    import torch
    import transformers

    from heisd.commands.common import target_device
    from heisd.drafter.model import DrafterError
    from heisd.profiling import ProfileConfig, format_table, profile_target
    from heisd.retrieval.manifest import DatastoreError
    from heisd.targets.vla import CheckpointError

    check_output(args.out, PROFILE, args.overwrite)
    torch.set_num_threads(args.threads)
    device, dtype = target_device(args)
    for flag, why in (("device_work", "reads CUDA's kernel records"), ("cuda_graphs", "replays CUDA graphs")):
        if getattr(args, flag) and device.type != "cuda":
            raise SystemExit(f"heisd profile: --{flag.replace('_', '-')} {why}; --device is {device} "
                             "(use --device cuda, or leave the flag out)")
    try:
        target, name, drafter, datastore = _load(args, device, dtype)
    except (CheckpointError, DrafterError, DatastoreError) as e:
        raise SystemExit(f"heisd profile: {e}") from e
    config = ProfileConfig(repeats=args.repeats, warmup=args.warmup, tree_sizes=tuple(args.tree_sizes),
                           seed=args.seed, rounds=args.rounds, device_work=args.device_work,
                           cuda_graphs=args.cuda_graphs)
    try:
        pieces = profile_target(target, config, drafter, datastore)
    except ValueError as e:  # e.g. a datastore whose keys do not fit this target
        raise SystemExit(f"heisd profile: {e}") from e
    result = {"target": name, "device": str(device), "device_name": _device_name(device), "dtype": args.dtype,
              "threads": torch.get_num_threads(),
              "versions": {"torch": torch.__version__, "transformers": transformers.__version__}, **pieces}
    write_json(args.out, result)
    print(format_table(result))
    print(f"\nwrote {args.out}")
    return 0
