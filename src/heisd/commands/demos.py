"""`heisd demos`: scripted-expert demonstrations in the LIBERO/robomimic HDF5 layout (mw: one file;
LIBERO: one `<task>_demo.hdf5` per task in LIBERO's own layout)."""

from __future__ import annotations

import argparse

LOCKS_OUT = True  # --out has one writer at a time (see heisd.commands.runner)
HELP = ("Record demonstrations as HDF5: scripted experts (mw; the LIBERO suites in LIBERO's own layout; "
        "successful episodes only), or the target's own closed-loop rollouts (--policy DIR, every episode) for a "
        "self-datastore or, with --expert-labels, DAgger.")


def add_arguments(p: argparse.ArgumentParser) -> None:
    from heisd.benchmarks.cameras import DEFAULT_CAMERA
    from heisd.benchmarks.registry import BENCHMARKS
    from heisd.commands.common import add_ray_arguments

    p.add_argument("--benchmark", default="mw", choices=BENCHMARKS,
                   help="benchmark to record in; every LIBERO suite has scripted experts, composed per task from "
                        "its BDDL goal (BENCHMARKS.md sections 7 and 12 give their success rates)")
    p.add_argument("--tasks", nargs="+", default=["all"], help="task names, or 'all' for the registry")
    p.add_argument("--episodes", type=int, default=50, help="episodes attempted per task")
    p.add_argument("--seed", type=int, default=0, help="layout/noise seed (mw: use another one for evaluation; LIBERO: layouts drawn by LIBERO's "
                        "placement samplers, never the init states evaluation starts from)")
    p.add_argument("--noise", type=float, default=0.0,
                   help="std of Gaussian noise on executed xyz actions (DART); labels stay clean")
    p.add_argument("--image-size", type=int, default=128,
                   help="square camera image size in pixels (LIBERO: agentview, shadows off as small targets see it)")
    p.add_argument("--shadows", action="store_true",
                   help="LIBERO: render shadows and reflections, as OpenVLA's protocol does; record at --image-size 256 "
                        "for an OpenVLA-architecture target (`train-vla --arch openvla`), which sees the protocol's frames")
    p.add_argument("--wrist", action="store_true",
                   help="LIBERO: record the wrist camera too (obs/eye_in_hand_rgb, at --image-size), for targets that "
                        "read both cameras (`train-vla --wrist`); a second render per step (its cost: BENCHMARKS.md 18.8)")
    p.add_argument("--camera", default=DEFAULT_CAMERA, help="Meta-World camera name (LIBERO: always agentview); "
                   "corner3's arm can hide the puck at the start of push and pick-place")
    p.add_argument("--max-steps", type=int, default=None,
                   help="Meta-World episode step limit (default 300); LIBERO records its protocol's "
                        "220/280/300/520 steps per suite")
    p.add_argument("--policy", default="expert",
                   help="who acts: 'expert' (scripted) or a target checkpoint directory (its own AR rollouts, "
                        "kept whether they succeed or not: a datastore drafts the target's own tokens); on LIBERO an "
                        "OpenVLA checkpoint acts on the frames OpenVLA's eval shows it (record with --image-size 256 "
                        "--shadows), and the file keeps the recorded frames and LIBERO's gripper convention")
    p.add_argument("--expert-labels", action="store_true",
                   help="with --policy DIR: record the scripted expert's action at every state the target visits "
                        "(DAgger training data; `heisd dagger` runs whole rounds)")
    p.add_argument("--workers", type=int, default=1, help="parallel simulator processes")
    p.add_argument("--measure", action="store_true",
                   help="measure the expert instead of recording: roll out --episodes per task on the same "
                        "layouts and noise, without rendering or writing, and print its success rate per task")
    p.add_argument("--out",
                   help="mw: output .hdf5 file; LIBERO: output directory for <task>_demo.hdf5 files (written "
                        "atomically); required unless --measure. Finished episodes wait in OUT.partial until the "
                        "output is written: a killed recording, run again with the same settings, records only the "
                        "rest")
    p.add_argument("--overwrite", action="store_true",
                   help="replace an existing demonstration file at --out (never a file heisd did not make)")
    add_ray_arguments(p, "episodes (the file is the same as a local run's: episodes are written in order)")


def run(args: argparse.Namespace) -> int:
    from heisd.benchmarks.registry import resolve_tasks
    from heisd.commands.common import executor_of
    from heisd.errors import UsageError
    from heisd.runtime.demos import generate_demos, measure_expert
    from heisd.runtime.recording import DemoConfig

    if args.benchmark != "mw":
        from heisd.benchmarks.libero_experts import check_expert_suite

        check_expert_suite(args.benchmark)  # before the suite's tasks are loaded
    tasks = resolve_tasks(args.benchmark, args.tasks)
    cfg = DemoConfig(tasks, args.episodes, args.seed, args.noise, args.image_size, args.camera, args.max_steps,
                     args.policy, args.expert_labels, args.benchmark, shadows=args.shadows,
                     wrist=args.wrist)
    executor = executor_of(args, args.workers)
    if args.measure:
        return _print_measure(measure_expert(cfg, executor=executor), cfg)
    if args.out is None:
        raise UsageError("demos needs --out (the file or directory to record into), or --measure")
    r = generate_demos(cfg, args.out, overwrite=args.overwrite, executor=executor)
    dropped = sum(r["dropped"].values())
    print(f"wrote {r['kept']} episodes ({r['steps']} steps) to {args.out} in {r['seconds']:.0f} s "
          f"({r['steps_per_s']:.1f} steps/s); dropped {dropped} failed episodes {r['dropped'] or ''}")
    return 0


def _print_measure(table: dict, cfg) -> int:
    """The expert table: one line per task, then all tasks (markdown, for BENCHMARKS.md)."""
    print(f"| task | success | mean steps |  ({cfg.benchmark}, seed {cfg.seed}, noise {cfg.noise})")
    print("|---|---|---|")
    for task, r in table.items():
        print(f"| {task} | {r['successes']}/{r['episodes']} | {r['mean_steps']:.0f} |")
    n, k = sum(r["episodes"] for r in table.values()), sum(r["successes"] for r in table.values())
    print(f"| all | {k}/{n} ({100 * k / n:.1f}%) | |")
    return 0
