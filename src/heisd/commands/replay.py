"""`heisd replay`: offline decoding of held-out demonstration frames, compared with AR greedy."""

from __future__ import annotations

import argparse
import json

HELP = "Offline replay of demonstration frames: acceptance, cost and deviation from AR greedy (replay.json)."


def add_arguments(p: argparse.ArgumentParser) -> None:
    from heisd.commands.common import add_method_arguments

    add_method_arguments(p)
    p.add_argument("--demos", nargs="+", required=True, help="held-out demonstration HDF5 file(s)")
    p.add_argument("--frames", type=int, default=400, help="frames to decode")
    p.add_argument("--out", required=True, help="output directory for replay.json")
    p.add_argument("--overwrite", action="store_true", help="replace an existing replay.json in --out")


def run(args: argparse.Namespace) -> int:
    from pathlib import Path

    from heisd.commands.common import load_policy, method_config
    from heisd.data.dataset import DemoFile
    from heisd.runtime.methods import build_decoders
    from heisd.runtime.policy import VLAPolicy
    from heisd.runtime.replay import REPLAY_FILE, REPLAY_RUN, replay
    from heisd.storage import check_output, directory_lock, write_json

    for path in args.demos:
        with DemoFile(path) as f:
            f.check_benchmark(args.benchmark)
    out = Path(args.out)
    check_output(out, REPLAY_RUN, args.overwrite)
    cfg = method_config(args)
    policy = load_policy(args, cfg)
    reference = VLAPolicy(policy.target, build_decoders(method_config(args, "ar"), policy.target))
    with directory_lock(out):
        result = replay(policy, reference, cfg.label, args.demos, args.frames)
        write_json(out / REPLAY_FILE, result)
    print(json.dumps(result, indent=2))
    return 0
