"""`heisd tiny-openvla`: write a random OpenVLA checkpoint in the real file layout, a few MB."""

from __future__ import annotations

import argparse
from pathlib import Path

LOCKS_OUT = True  # --out has one writer at a time (see heisd.commands.runner)
HELP = "Write a tiny random OpenVLA checkpoint (real config keys, key names, sharding and tokenizer layout)."


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--out", type=Path, required=True, help="new or empty directory to write the checkpoint into")
    p.add_argument("--seed", type=int, default=0, help="seed of the random weights")
    p.add_argument("--shards", type=int, default=2,
                   help="safetensors files (1: model.safetensors; more: model-0000i-of-0000n + index json)")


def run(args: argparse.Namespace) -> int:
    from heisd.targets.openvla import write_tiny_openvla

    if args.out.exists() and any(args.out.iterdir()):
        raise SystemExit(f"--out {args.out} is not empty; choose a new directory")
    files = write_tiny_openvla(args.out, seed=args.seed, shards=args.shards)
    size = sum(p.stat().st_size for p in args.out.iterdir()) / 2**20
    print(f"wrote a tiny OpenVLA checkpoint to {args.out} ({size:.1f} MB; {sum(files.values())} tensors "
          f"in {len(files)} safetensors files; seed {args.seed})")
    return 0
