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
    add_index_arguments(p)
    p.add_argument("--skip-invalid-episodes", action="store_true",
                   help="leave out demonstrations with non-finite or empty data (counted) instead of refusing")
    p.add_argument("--overwrite", action="store_true",
                   help="replace an existing datastore at --out (never a directory heisd did not make)")
    add_ray_arguments(p, "encoding of the demonstration episodes (the datastore is written here, once, the same "
                         "as a local build's)")


def add_index_arguments(p: argparse.ArgumentParser) -> None:
    """The vector index flags (defaults from `IndexConfig`), shared with `heisd reindex`."""
    from heisd.retrieval.index_config import INDEX_KINDS, REDUCTIONS, IndexConfig

    c = IndexConfig()
    p.add_argument("--index", choices=INDEX_KINDS, default=c.kind,
                   help="FAISS index per collection: auto picks flat while entries x key dim <= "
                        f"{c.flat_max_floats}, HNSW up to {c.hnsw_max_floats}, IVF-PQ above; the others force one")
    p.add_argument("--ivf-nlist", type=int, default=c.ivf_nlist,
                   help="IVF-PQ coarse cells (0: about sqrt(entries), at least 39 entries per cell)")
    p.add_argument("--pq-m", type=int, default=c.pq_m,
                   help="IVF-PQ sub-quantizers, code bytes per entry at 8 bits (0: one per 8 coded dims, at most 64)")
    p.add_argument("--pq-nbits", type=int, default=c.pq_nbits, help="IVF-PQ bits per sub-quantizer code")
    p.add_argument("--nprobe", type=int, default=c.nprobe, help="IVF-PQ cells scanned per query")
    p.add_argument("--reduction", choices=REDUCTIONS, default=c.reduction,
                   help="IVF-PQ: learned linear map from the key to the coded width")
    p.add_argument("--reduce-dim", type=int, default=c.reduce_dim,
                   help="IVF-PQ: codes cover the largest multiple of --pq-m up to min(key dim, this)")
    p.add_argument("--rerank", type=int, default=c.rerank,
                   help="IVF-PQ: candidates per result re-scored with the exact keys at query time")


def index_config(args: argparse.Namespace):
    from heisd.retrieval.index_config import IndexConfig

    return IndexConfig(kind=args.index, ivf_nlist=args.ivf_nlist, pq_m=args.pq_m, pq_nbits=args.pq_nbits,
                       nprobe=args.nprobe, reduction=args.reduction, reduce_dim=args.reduce_dim, rerank=args.rerank)


def run(args: argparse.Namespace) -> int:
    from functools import partial

    from heisd.commands.common import check_demos_camera, executor_of, load_target, worker_target
    from heisd.retrieval.build import BuildConfig, build_datastore

    executor = executor_of(args)
    check_demos_camera(args.target, args.demos)
    target = load_target(args)
    summary = build_datastore(target, args.demos, args.out, BuildConfig(args.batch_size, index=index_config(args)),
                              overwrite=args.overwrite, skip_invalid=args.skip_invalid_episodes,
                              benchmark=args.benchmark, executor=executor,
                              make_target=partial(worker_target, args, target.fingerprint()) if executor.remote
                              else None)
    print(f"wrote {summary['frames']} entries from {summary['episodes']} episodes to {args.out} "
          f"in {summary['seconds']:.0f} s ({summary['frames_per_s']:.0f} frames/s, {args.threads} threads); "
          f"dropped {summary['dropped_failed']} failed episodes"
          + (f" and {summary['dropped_invalid']} invalid ones" if summary["dropped_invalid"] else ""))
    return 0
