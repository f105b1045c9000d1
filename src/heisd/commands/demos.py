"""`heisd demos`: scripted-expert demonstrations in the LIBERO/robomimic HDF5 layout."""

from __future__ import annotations

import argparse

HELP = ("Record demonstrations as HDF5: scripted experts (successful episodes only), or the target's own "
        "closed-loop rollouts (--policy DIR, every episode) for a self-datastore.")


def add_arguments(p: argparse.ArgumentParser) -> None:
    from heisd.benchmarks.registry import BENCHMARKS

    p.add_argument("--benchmark", default="mw", choices=BENCHMARKS,
                   help="benchmark to record in (LIBERO suites: no scripted experts yet; use LIBERO's datasets)")
    p.add_argument("--tasks", nargs="+", default=["all"], help="task names, or 'all' for the registry")
    p.add_argument("--episodes", type=int, default=50, help="episodes attempted per task")
    p.add_argument("--seed", type=int, default=0, help="layout/noise seed (use another one for evaluation)")
    p.add_argument("--noise", type=float, default=0.0,
                   help="std of Gaussian noise on executed xyz actions (DART); labels stay clean")
    p.add_argument("--image-size", type=int, default=128, help="square camera image size in pixels")
    p.add_argument("--camera", default="corner3", help="Meta-World camera name")
    p.add_argument("--max-steps", type=int, default=300, help="episode step limit")
    p.add_argument("--policy", default="expert",
                   help="who acts: 'expert' (scripted) or a target checkpoint directory (its own AR rollouts, "
                        "kept whether they succeed or not: a datastore drafts the target's own tokens)")
    p.add_argument("--expert-labels", action="store_true",
                   help="with --policy DIR: record the scripted expert's action at every state the target visits "
                        "(DAgger training data; `heisd dagger` runs whole rounds)")
    p.add_argument("--workers", type=int, default=1, help="parallel simulator processes")
    p.add_argument("--out", required=True, help="output .hdf5 file (written atomically)")
    p.add_argument("--overwrite", action="store_true",
                   help="replace an existing demonstration file at --out (never a file heisd did not make)")


def run(args: argparse.Namespace) -> int:
    from heisd.benchmarks.mw import resolve_tasks
    from heisd.data.demos import DemoConfig, generate_demos
    from heisd.errors import UsageError

    if args.benchmark != "mw":
        raise UsageError(f"demos --benchmark {args.benchmark}: there are no scripted LIBERO experts yet; "
                         "build datastores from LIBERO's own datasets (build-datastore --demos <task>_demo.hdf5)")
    tasks = resolve_tasks(args.tasks)
    cfg = DemoConfig(tasks, args.episodes, args.seed, args.noise, args.image_size, args.camera, args.max_steps,
                     args.policy, args.expert_labels)
    r = generate_demos(cfg, args.out, workers=args.workers, overwrite=args.overwrite)
    dropped = sum(r["dropped"].values())
    print(f"wrote {r['kept']} episodes ({r['steps']} steps) to {args.out} in {r['seconds']:.0f} s "
          f"({r['steps_per_s']:.1f} steps/s); dropped {dropped} failed episodes {r['dropped'] or ''}")
    return 0
