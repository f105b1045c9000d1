"""`heisd dagger`: DAgger rounds for the target VLA (rollouts labelled by the scripted experts)."""

from __future__ import annotations

import argparse
from pathlib import Path

HELP = ("Improve the target with DAgger: roll it out, label the states it visits with the scripted expert, "
        "fine-tune on demonstrations + all rollouts; a few rounds, resumable.")


def add_arguments(p: argparse.ArgumentParser) -> None:
    from heisd.commands.common import add_ray_arguments
    from heisd.benchmarks.libero_experts import EXPERT_SUITES
    from heisd.runtime.dagger import DaggerConfig
    from heisd.runtime.methods import default_of

    d = lambda name: default_of(DaggerConfig, name)  # noqa: E731
    p.add_argument("--benchmark", default=d("benchmark"), choices=("mw", *EXPERT_SUITES),
                   help="where to roll out: the benchmarks with scripted experts to label the visited states")
    p.add_argument("--init", required=True,
                   help="checkpoint to start from (behaviour-cloned on --demos): heisd's VLA, or on LIBERO an "
                        "OpenVLA-architecture checkpoint (`train-vla --arch openvla`; rollouts are recorded at the "
                        "protocol's 256 px frames with shadows, fine-tuning uses that trainer's defaults)")
    p.add_argument("--demos", nargs="+", required=True,
                   help="the demonstration files --init was trained on (aggregated in every round)")
    p.add_argument("--out", type=Path, required=True,
                   help="run directory: round_<r>/rollouts.hdf5 (LIBERO: round_<r>/rollouts/<task>_demo.hdf5) "
                        "and round_<r>/vla per round, dagger_log.jsonl")
    p.add_argument("--tasks", nargs="+", default=["all"], help="tasks of --benchmark to roll out, or 'all'")
    p.add_argument("--rounds", type=int, default=d("rounds"), help="rollout + fine-tune rounds")
    p.add_argument("--episodes", type=int, default=d("episodes"), help="rollout episodes per task per round")
    p.add_argument("--seed", type=int, default=d("seed"),
                   help="round r rolls out on layouts of seed SEED+r-1 (must differ from the demos' seeds; "
                        "evaluation seeds are never reachable)")
    p.add_argument("--steps", type=int, default=d("steps"), help="fine-tuning optimizer steps per round")
    p.add_argument("--batch-size", type=int, default=d("batch_size"), help="frames per fine-tuning step")
    p.add_argument("--lr", type=float, default=d("lr"), help="peak fine-tuning learning rate (10%% warmup, cosine)")
    p.add_argument("--threads", type=int, default=d("threads"), help="torch threads for fine-tuning")
    p.add_argument("--workers", type=int, default=d("workers"), help="parallel simulator processes for rollouts")
    p.add_argument("--max-steps", type=int, default=d("max_steps"),
                   help="episode step limit of mw's rollouts (default 300); LIBERO rolls out its protocol's "
                        "220/280/300/520 steps per suite")
    p.add_argument("--keyframe-weight", type=float, default=d("keyframe_weight"),
                   help="fine-tuning: loss weight of the frames just after each change of the gripper command "
                        "(train-vla's flag; 1: every frame alike)")
    p.add_argument("--keyframe-window", type=int, default=d("keyframe_window"),
                   help="fine-tuning: how many frames from each gripper command change get --keyframe-weight")
    p.add_argument("--overwrite", action="store_true",
                   help="start over in --out (a run with the same settings resumes without it)")
    add_ray_arguments(p, "rollout episodes (fine-tuning stays on this machine)")


def run(args: argparse.Namespace) -> int:
    from heisd.benchmarks.registry import resolve_tasks
    from heisd.commands.common import executor_of
    from heisd.runtime.dagger import DaggerConfig, run_dagger

    cfg = DaggerConfig(init=str(args.init), demos=tuple(str(p) for p in args.demos),
                       tasks=resolve_tasks(args.benchmark, args.tasks), rounds=args.rounds, episodes=args.episodes,
                       seed=args.seed, steps=args.steps, batch_size=args.batch_size, lr=args.lr,
                       threads=args.threads, workers=args.workers, max_steps=args.max_steps,
                       benchmark=args.benchmark, keyframe_weight=args.keyframe_weight,
                       keyframe_window=args.keyframe_window)
    # a rollout worker runs one torch thread (recording's `_target_policy`), whatever --threads fine-tunes with
    final = run_dagger(cfg, args.out, overwrite=args.overwrite, executor=executor_of(args, args.workers, cpus=1))
    print(f"final checkpoint: {final}  (per-round success of each actor: {args.out}/dagger_log.jsonl)")
    return 0
