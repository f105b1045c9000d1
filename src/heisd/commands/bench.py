"""`heisd bench`: all methods and the ablation ladder on identical seeds, one report."""

from __future__ import annotations

import argparse

HELP = "Benchmark AR, SpecVLA, retrieval SD, HeiSD and its ablation ladder on identical seeds (bench.json, report.md, plots)."


def add_arguments(p: argparse.ArgumentParser) -> None:
    from heisd.commands.common import (
        add_camera_argument,
        add_episode_arguments,
        add_method_arguments,
        add_ray_arguments,
    )

    add_method_arguments(p, method=False)
    add_camera_argument(p)
    p.add_argument("--tasks", nargs="+", default=["all"], help="task names, or 'all' for the registry")
    p.add_argument("--episodes", type=int, default=20, help="episodes per task and method")
    p.add_argument("--seed", type=int, default=0, help="evaluation layout seed (same for every method)")
    add_episode_arguments(p)
    p.add_argument("--thresholds", type=float, nargs="*", default=[],
                   help="extra heisd runs at these kinematic thresholds (points on the Pareto plot)")
    p.add_argument("--tolerances", nargs="*", default=[], metavar="SPEC",
                   help="extra heisd runs (every mechanism, cost switch) at these acceptance tolerances, the "
                        "syntax of --tolerance (points on the success-speed frontier), e.g. paper scale=0.5,floor=2")
    p.add_argument("--only", nargs="+", default=None, metavar="LABEL",
                   help="run only these configurations of the ladder, by report label (AR always runs: "
                        "speedups are ratios to it), e.g. --only retrieval heisd")
    p.add_argument("--quick", action="store_true",
                   help="preset: 3 tasks, 2 episodes each, 150 steps (under ~10 minutes on 2 CPU cores)")
    p.add_argument("--out", required=True,
                   help="output directory (each method's eval resumes from it; other settings are refused)")
    p.add_argument("--record-options", action="store_true",
                   help="configurations with a cost-based choice (the cost switch, the cost fallback) also record, "
                        "per step and outside its latency, what each mode and fallback would have done on the same "
                        "frame, so `heisd project` can re-decide those choices under another device's costs "
                        "(slower: up to three extra decodes per step)")
    p.add_argument("--persist-thresholds", action="store_true",
                   help="after the last episode, merge the full heisd run's online-adapted skip thresholds into "
                        "the datastore's manifest (by default they stay in --out and the datastore is only read)")
    p.add_argument("--persist-tolerance", action="store_true",
                   help="choose the acceptance tolerance closed loop: of the full heisd runs (the ladder's and "
                        "--tolerances') that succeeded in at least as many episodes as AR, the one that lost the "
                        "fewest of AR's successful episodes, then the fastest; store it with the datastore as every "
                        "command's default --tolerance. Needs layouts the evaluation never uses: --sampled-layouts "
                        "on LIBERO, a --seed other than the evaluation's on mw")
    add_ray_arguments(p, "episodes (each job: one episode with every configuration in turn)")


def run(args: argparse.Namespace) -> int:
    from dataclasses import replace
    from functools import partial
    from pathlib import Path

    from heisd.benchmarks.registry import check_target, resolve_tasks
    from heisd.commands.common import (
        camera_of,
        closed_loop_unnorm_key,
        executor_of,
        load_target,
        max_steps_of,
        method_config,
        worker_target,
    )
    from heisd.errors import UsageError
    from heisd.runtime.bench import (QUICK_TASKS, full_heisd, ladder, report_table, run_bench, tolerance_variant,
                                     write_report)
    from heisd.runtime.evaluation import EvalConfig
    from heisd.storage import recorded_command

    if args.quick:
        if args.benchmark != "mw":
            raise SystemExit("--quick is a mw run; give --tasks and --episodes for a LIBERO suite")
        tasks, episodes, max_steps = QUICK_TASKS, 2, 150
    else:
        tasks = resolve_tasks(args.benchmark, args.tasks)
        episodes, max_steps = args.episodes, max_steps_of(args)
    executor = executor_of(args)
    base = method_config(args, "heisd")
    configs = ladder(base) + [replace(base, switch="threshold", switch_threshold=t) for t in args.thresholds]
    configs += [c for c in (tolerance_variant(base, spec) for spec in args.tolerances)
                if c.label not in {k.label for k in configs}]
    if args.only:
        labels = [c.label for c in configs]
        unknown = sorted(set(args.only) - set(labels))
        if unknown:
            raise SystemExit(f"--only: no configuration labelled {', '.join(unknown)}; the labels are {', '.join(labels)}")
        configs = [c for c in configs if c.method == "ar" or c.label in args.only]
    if args.ray is not None and args.persist_thresholds:
        raise UsageError("--persist-thresholds: with --ray each worker adapts the skip thresholds over its own "
                         "episodes; there is no one sequence of updates to store")
    files = _tolerance_run_files(args, configs, full_heisd(base)) if args.persist_tolerance else None
    closed_loop_unnorm_key(args)
    target = load_target(args)
    check_target(args.benchmark, target.spec)
    cfg = EvalConfig(tasks, episodes, args.seed, max_steps, camera=camera_of(args), benchmark=args.benchmark,
                     protocol=target.spec.protocol, center_crop=not args.no_center_crop,
                     sampled_layouts=args.sampled_layouts)
    out = Path(args.out)
    summaries = run_bench(target, configs, cfg, out, persist=full_heisd(base) if args.persist_thresholds else None,
                          target_path=args.target, record_options=args.record_options, executor=executor,
                          make_target=partial(worker_target, args, target.fingerprint())
                          if executor.remote else None)
    report = write_report(summaries, out, recorded_command(), cfg)
    print(report_table(summaries))
    print(f"report: {report}")
    print("plots: " + ", ".join(str(p) for p in sorted(out.glob("*.png"))))
    if files is not None:
        from heisd.runtime import tolerance

        ar_successes, tried = tolerance.scored(configs, summaries, full_heisd(base), out)
        record = tolerance.persist(args.datastore, files, ar_successes, tried,
                                   {"episodes": summaries[0]["episodes"], "tasks": list(cfg.tasks), "seed": cfg.seed,
                                    "sampled_layouts": cfg.sampled_layouts})
        print(f"stored tolerance {record['tolerance']} with {args.datastore}")
    return 0


def _tolerance_run_files(args: argparse.Namespace, configs: list, full) -> dict:
    """Check a --persist-tolerance run before it starts; the datastore's file records as it starts."""
    from pathlib import Path

    from heisd.benchmarks.registry import is_libero
    from heisd.errors import UsageError
    from heisd.retrieval.manifest import read_manifest
    from heisd.runtime.tolerance import candidate_runs

    if is_libero(args.benchmark) and not args.sampled_layouts:
        raise UsageError("--persist-tolerance on LIBERO needs --sampled-layouts: a tolerance chosen on the suite's "
                         "init states would be scored on the episodes that chose it")
    if args.benchmark == "mw" and args.seed == 0:
        raise UsageError("--persist-tolerance on mw needs a --seed other than the evaluation's (0), so the "
                         "layouts it chooses on are not the ones it is scored on")
    if not args.datastore:
        raise UsageError("--persist-tolerance needs --datastore: the tolerance is stored with it")
    if not candidate_runs(configs, full):
        raise UsageError("--persist-tolerance: no full heisd run to choose from (keep 'heisd' in --only, or "
                         "give --tolerances)")
    return read_manifest(Path(args.datastore))["files"]
