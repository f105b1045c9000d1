"""`heisd eval`: closed-loop success rate and per-step decoding cost in the simulator."""

from __future__ import annotations

import argparse
import json

HELP = "Closed-loop evaluation of a decoding method (writes summary.json and episodes.jsonl; resumable)."


def add_arguments(p: argparse.ArgumentParser) -> None:
    from heisd.commands.common import add_method_arguments

    add_method_arguments(p)
    p.add_argument("--tasks", nargs="+", default=["all"], help="task names, or 'all' for the registry")
    p.add_argument("--episodes", type=int, default=20, help="episodes per task")
    p.add_argument("--seed", type=int, default=0, help="evaluation layout seed (layouts differ from any demo seed)")
    p.add_argument("--max-steps", type=int, default=300, help="environment steps per episode")
    p.add_argument("--execute", type=int, default=0, help="actions executed per inference (0 = whole chunk)")
    p.add_argument("--out", required=True, help="output directory (an interrupted run resumes from it)")
    p.add_argument("--server", default=None, metavar="URL",
                   help="run the policy on a `heisd serve` at URL (its target and method flags apply, "
                        "not the local ones); latency_ms is then the server's step time")


def run(args: argparse.Namespace) -> int:
    from pathlib import Path

    from heisd.benchmarks.mw import resolve_tasks
    from heisd.commands.common import load_policy, method_config
    from heisd.runtime.evaluation import EvalConfig, evaluate

    tasks = resolve_tasks(args.tasks)
    if args.episodes < 1:
        raise SystemExit("--episodes must be >= 1")
    if args.server:
        from heisd.client import PolicyClient, RemotePolicy, ServerUnreachable

        client = PolicyClient(args.server)
        try:
            policy, label = RemotePolicy(client), client.info()["method"]
        except ServerUnreachable as err:
            raise SystemExit(f"--server: {err}") from None
    else:
        cfg = method_config(args)
        policy, label = load_policy(args, cfg), cfg.label
    summary = evaluate(policy, label, EvalConfig(tasks, args.episodes, args.seed, args.max_steps, args.execute),
                       Path(args.out))
    print(json.dumps(summary, indent=2))
    return 0
