"""`heisd build-datastore`: encode demonstrations with the target into a retrieval datastore."""

from __future__ import annotations

import argparse
from pathlib import Path

LOCKS_OUT = True  # --out has one writer at a time (see heisd.commands.runner)
HELP = "Build the retrieval datastore (keys, own/demonstrator tokens, hidden states) for a target (heisd VLA or OpenVLA)."


def add_arguments(p: argparse.ArgumentParser) -> None:
    from heisd.benchmarks.registry import BENCHMARKS
    from heisd.commands.common import add_ray_arguments, add_target_arguments

    add_target_arguments(p)
    p.add_argument("--demos", type=Path, nargs="+", required=True,
                   help="HDF5 demonstration files: heisd's own, LIBERO's datasets (<task>_demo.hdf5) or "
                        "OpenVLA's regenerated no-noop files")
    p.add_argument("--benchmark", choices=BENCHMARKS, default=None,
                   help="refuse files from another benchmark or LIBERO suite (default: accept any)")
    p.add_argument("--out", type=Path, required=True, help="datastore directory (written atomically)")
    p.add_argument("--batch-size", type=int, default=64, help="frames per target pass")
    p.add_argument("--threads", type=int, default=2, help="torch CPU threads")
    p.add_argument("--index", choices=["auto", "flat", "hnsw"], default="auto",
                   help="FAISS index per collection (auto: flat when small, HNSW when large)")
    p.add_argument("--skip-invalid-episodes", action="store_true",
                   help="leave out demonstrations with non-finite or empty data (counted) instead of refusing")
    p.add_argument("--overwrite", action="store_true",
                   help="replace an existing datastore at --out (never a directory heisd did not make)")
    add_ray_arguments(p, "encoding of the demonstration episodes (the datastore is written here, once, the same "
                         "as a local build's)")


def run(args: argparse.Namespace) -> int:
    from functools import partial

    from heisd.commands.common import check_demos_camera, executor_of, load_target, worker_target
    from heisd.retrieval.build import BuildConfig, build_datastore

    executor = executor_of(args)
    check_demos_camera(args.target, args.demos)
    target = load_target(args)
    summary = build_datastore(target, args.demos, args.out, BuildConfig(args.batch_size, index=args.index),
                              overwrite=args.overwrite, skip_invalid=args.skip_invalid_episodes,
                              benchmark=args.benchmark, executor=executor,
                              make_target=partial(worker_target, args, target.fingerprint()) if executor.remote
                              else None)
    print(f"wrote {summary['frames']} entries from {summary['episodes']} episodes to {args.out} "
          f"in {summary['seconds']:.0f} s ({summary['frames_per_s']:.0f} frames/s, {args.threads} threads); "
          f"dropped {summary['dropped_failed']} failed episodes"
          + (f" and {summary['dropped_invalid']} invalid ones" if summary["dropped_invalid"] else ""))
    return 0
