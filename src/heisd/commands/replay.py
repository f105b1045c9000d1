"""`heisd replay`: offline decoding of held-out demonstration frames, compared with AR greedy."""

from __future__ import annotations

import argparse
import json

HELP = "Offline replay of demonstration frames: acceptance, cost and deviation from AR greedy (replay.json)."


def add_arguments(p: argparse.ArgumentParser) -> None:
    from heisd.commands.common import add_method_arguments, add_ray_arguments

    add_method_arguments(p)
    p.add_argument("--demos", nargs="+", required=True, help="held-out demonstration HDF5 file(s)")
    p.add_argument("--frames", type=int, default=400, help="frames to decode")
    p.add_argument("--out", required=True, help="output directory for replay.json")
    p.add_argument("--overwrite", action="store_true", help="replace an existing replay.json in --out")
    add_ray_arguments(p, "demonstration episodes (each worker decodes an episode with the method and AR)")


def run(args: argparse.Namespace) -> int:
    from pathlib import Path

    from functools import partial

    from heisd.commands.common import executor_of, load_policy, method_config
    from heisd.data.dataset import DemoFile
    from heisd.runtime.methods import build_decoders
    from heisd.runtime.policy import VLAPolicy
    from heisd.runtime.replay import REPLAY_FILE, REPLAY_RUN, replay
    from heisd.storage import check_output, directory_lock, write_json

    for path in args.demos:
        with DemoFile(path) as f:
            f.check_benchmark(args.benchmark)
    out = Path(args.out)
    executor = executor_of(args)
    check_output(out, REPLAY_RUN, args.overwrite)
    cfg = method_config(args)
    policy = load_policy(args, cfg)
    reference_cfg = method_config(args, "ar")
    reference = VLAPolicy(policy.target, build_decoders(reference_cfg, policy.target))
    make_policies = partial(worker_policies, args, cfg, reference_cfg, policy.target.fingerprint())
    with directory_lock(out):
        result = replay(policy, reference, cfg.label, args.demos, args.frames, executor=executor,
                        make_policies=make_policies if executor.remote else None)
        write_json(out / REPLAY_FILE, result)
    print(json.dumps(result, indent=2))
    return 0


def worker_policies(args: argparse.Namespace, cfg, reference_cfg, fingerprint: str):
    """A Ray worker's (method, AR reference) on one copy of the target."""
    from heisd.commands.common import worker_target
    from heisd.runtime.methods import build_decoders
    from heisd.runtime.policy import VLAPolicy

    target = worker_target(args, fingerprint)
    return VLAPolicy(target, build_decoders(cfg, target)), VLAPolicy(target, build_decoders(reference_cfg, target))
