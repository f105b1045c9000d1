"""`heisd reindex`: copy a datastore under another vector index (no target needed)."""

from __future__ import annotations

import argparse
from pathlib import Path

from heisd.commands.build_datastore import add_index_arguments, index_config

LOCKS_OUT = True  # --out has one writer at a time (see heisd.commands.runner)
HELP = "Copy a datastore with its collections re-indexed (e.g. --index ivfpq for a big store); entries unchanged."


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--datastore", type=Path, required=True, help="datastore directory to copy (never modified)")
    p.add_argument("--out", type=Path, required=True, help="new datastore directory (written atomically)")
    add_index_arguments(p)
    p.add_argument("--threads", type=int, default=2, help="FAISS threads while building")
    p.add_argument("--overwrite", action="store_true",
                   help="replace an existing datastore at --out (never a directory heisd did not make)")


def run(args: argparse.Namespace) -> int:
    import faiss

    from heisd.retrieval.reindex import reindex_datastore

    faiss.omp_set_num_threads(args.threads)
    collections = reindex_datastore(args.datastore, args.out, index_config(args), overwrite=args.overwrite)
    kinds = sorted({c["kind"] for c in collections.values()})
    print(f"wrote {args.out}: {len(collections)} collections re-indexed ({', '.join(kinds)}) "
          f"from {args.datastore}")
    return 0
