"""`heisd demo`: the quickstart, as the same commands a user would type, each printed first."""

from __future__ import annotations

import argparse

HELP = "Quickstart: shipped target + drafter, a datastore built (or reused), calibration, `bench --quick`."


def add_arguments(p: argparse.ArgumentParser) -> None:
    from heisd.commands.common import SHIPPED_TARGETS

    p.add_argument("--target", default=SHIPPED_TARGETS["mw"], help="shipped target VLA")
    p.add_argument("--drafter", default="checkpoints/drafter", help="shipped drafter")
    p.add_argument("--work", default="outputs/demo", help="where demonstrations, datastore and results go")
    p.add_argument("--episodes", type=int, default=4, help="demonstrations per task for the datastore")


def run(args: argparse.Namespace) -> int:
    import shlex
    from pathlib import Path

    from heisd.commands.runner import main as heisd
    from heisd.errors import InputError

    for path in (args.target, args.drafter):
        if not Path(path, "config.json").is_file():
            raise InputError(f"{path}: no checkpoint there (see checkpoints/README.md for how it is made)")
    work = Path(args.work)
    demos, heldout, store = work / "demos.hdf5", work / "heldout.hdf5", work / "datastore"
    steps = []
    if not demos.exists():
        steps.append(["demos", "--tasks", "all", "--episodes", str(args.episodes), "--seed", "0",
                      "--workers", "2", "--out", str(demos)])
    if not heldout.exists():
        steps.append(["demos", "--tasks", "all", "--episodes", "1", "--seed", "2", "--workers", "2",
                      "--out", str(heldout)])
    if not (store / "manifest.json").exists():
        steps.append(["build-datastore", "--target", args.target, "--demos", str(demos), "--out", str(store)])
        steps.append(["calibrate", "--target", args.target, "--datastore", str(store), "--demos", str(heldout),
                      "--drafter", args.drafter])
    steps.append(["bench", "--quick", "--target", args.target, "--drafter", args.drafter, "--datastore", str(store),
                  "--out", str(work / "bench")])
    for step in steps:
        print(f"\n$ heisd {shlex.join(step)}", flush=True)
        code = heisd(step)
        if code:
            return code
    return 0
