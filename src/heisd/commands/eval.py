"""`heisd eval`: closed-loop success rate and per-step decoding cost in the simulator."""

from __future__ import annotations

import argparse
import json

HELP = "Closed-loop evaluation of a decoding method (writes summary.json and episodes.jsonl; resumable)."


def add_arguments(p: argparse.ArgumentParser) -> None:
    from heisd.commands.common import (
        add_camera_argument,
        add_episode_arguments,
        add_method_arguments,
        add_ray_arguments,
    )

    add_method_arguments(p)
    p.add_argument("--tasks", nargs="+", default=["all"], help="task names, or 'all' for the registry")
    p.add_argument("--episodes", type=int, default=20, help="episodes per task")
    p.add_argument("--seed", type=int, default=0, help="mw: evaluation layout seed (layouts differ from any demo seed); LIBERO episode i "
                        "starts from the suite's init state i")
    add_episode_arguments(p)
    add_camera_argument(p)
    p.add_argument("--execute", type=int, default=0, help="actions executed per inference (0 = whole chunk)")
    p.add_argument("--out", required=True,
                   help="output directory (an interrupted run resumes from it; other settings are refused)")
    p.add_argument("--server", default=None, metavar="URL",
                   help="run the policy on a `heisd serve` at URL (http://: REST, ws://: openpi's websocket; its "
                        "target and method flags apply, not the local ones); latency_ms is then the server's step time")
    p.add_argument("--persist-thresholds", action="store_true",
                   help="after the last episode, merge the online-adapted skip thresholds into the datastore's "
                        "manifest (by default they stay in --out and the datastore is only read)")
    add_ray_arguments(p)


def run(args: argparse.Namespace) -> int:
    from functools import partial
    from pathlib import Path

    from heisd.benchmarks.registry import check_target, resolve_tasks
    from heisd.commands.common import (
        camera_of,
        closed_loop_unnorm_key,
        executor_of,
        load_policy,
        max_steps_of,
        method_config,
        worker_policy,
    )
    from heisd.errors import InputError, UsageError
    from heisd.runtime.evaluation import EvalConfig, evaluate
    from heisd.runtime.runinfo import run_identity, server_identity

    tasks = resolve_tasks(args.benchmark, args.tasks)
    executor, make_policy = executor_of(args), None
    if args.ray is not None and args.persist_thresholds:
        raise UsageError("--persist-thresholds: with --ray each worker adapts the skip thresholds over its own "
                         "episodes; there is no one sequence of updates to store")
    if args.server:
        from heisd.client import RemotePolicy, ServerUnreachable, connect

        if args.persist_thresholds:
            raise UsageError("--persist-thresholds: with --server the skip thresholds adapt on the server")
        try:
            client = connect(args.server)
        except ValueError as err:
            raise UsageError(f"--server: {err}") from None
        try:
            info = client.info()
        except ServerUnreachable as err:
            raise InputError(f"--server: {err}") from None
        policy, label, identity = (RemotePolicy(client, info["target"].get("views", 1)), info["method"],
                                   server_identity(info, args.server))
        chunk, protocol = info["target"]["action_shape"][0], "raw"
    else:
        cfg = method_config(args)
        closed_loop_unnorm_key(args)
        policy, label = load_policy(args, cfg), cfg.label
        check_target(args.benchmark, policy.target.spec)
        identity, chunk = run_identity(policy.target.fingerprint(), cfg, args.target), policy.target.spec.chunk
        protocol = policy.target.spec.protocol
        if executor.remote:
            make_policy = partial(worker_policy, args, cfg, policy.target.fingerprint())
    if args.execute > chunk:
        raise UsageError(f"--execute {args.execute} exceeds the target's action chunk ({chunk})")
    summary = evaluate(policy, label, EvalConfig(tasks, args.episodes, args.seed, max_steps_of(args), args.execute,
                                                 camera=camera_of(args), benchmark=args.benchmark, protocol=protocol,
                                                 center_crop=not args.no_center_crop,
                                                 sampled_layouts=args.sampled_layouts),
                       Path(args.out), identity=identity, persist_thresholds=args.persist_thresholds,
                       executor=executor, make_policy=make_policy)
    print(json.dumps(summary, indent=2))
    return 0
