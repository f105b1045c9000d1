"""`heisd bench`: every method on identical seeds in one run, the table and the plots.

The ablation ladder of the paper (docs/design.md §2.14) is three configurations of `heisd` with its
fixed-threshold switch: metric only (retrieval drafts checked exactly, never skipped) ->
+ verify-skip -> + group acceptance (= the paper's full HeiSD); then ours: + prefill skip,
and the cost-aware switch, lossless and with every mechanism; beside them retrieval and HeiSD
with plain AR after a rejected group, HeiSD whose drafter tree the cost rule picks, and HeiSD with
the paper's fixed acceptance tolerance (the paper's rungs keep it too), and HeiSD whose first
retrieval tree is verified inside the prefill pass (ours, opt-in).
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import ExitStack
from dataclasses import replace
from functools import partial
from pathlib import Path

import numpy as np

from heisd.runtime import run_thresholds
from heisd.runtime.evaluation import MUJOCO_LOG, EpisodeWorker, EvalConfig, EvalRun, episode_worker, play
from heisd.runtime.methods import MethodConfig, build_decoders
from heisd.runtime.options import make_recorder
from heisd.runtime.policy import VLAPolicy
from heisd.runtime.runinfo import EVAL_RUN, run_identity
from heisd.storage import OutputKind, directory_lock, refuse_foreign, write_json, write_text

LOCAL_WORKER = "local"  # the worker of episode lines without one (a run in one process)
QUICK_TASKS = ("reach-v3", "drawer-close-v3", "button-press-topdown-v3")
BENCH_FILE = "bench.json"
# a bench folder: its bench.json, or (before the first finishes) the method run folders in it
BENCH_RUN = OutputKind("bench", lambda path: path.is_dir() and ((path / BENCH_FILE).is_file() or any(
    EVAL_RUN.recognize(child) for child in path.iterdir() if child.is_dir())))


def _every_mechanism(base: MethodConfig) -> MethodConfig:
    return replace(base, verify_skip=True, group_acceptance=True, prefill_skip=True, lossless=False)


def full_heisd(base: MethodConfig) -> MethodConfig:
    """The ladder's HeiSD with every mechanism (the configuration `--persist-thresholds` persists)."""
    return replace(_every_mechanism(base), method="heisd")


def ladder(base: MethodConfig) -> list[MethodConfig]:
    """All methods and the ablation rungs, from one set of resources and settings."""
    plain = _every_mechanism(base)
    configs = [replace(plain, method=m) for m in ("ar", "jacobi", "specvla", "specvla-relaxed", "retrieval")]
    configs.append(replace(plain, method="retrieval", lossless=True))
    paper = replace(plain, method="heisd", switch="threshold", tolerance="paper")  # the paper's rule throughout
    configs += [
        replace(paper, lossless=True),  # the paper's "metric only" rung
        replace(paper, group_acceptance=False, prefill_skip=False),  # + verify-skip
        replace(paper, prefill_skip=False),  # + group acceptance: the paper's full HeiSD
        replace(paper),  # + prefill skip (ours)
        replace(plain, method="heisd", lossless=True),  # ours, lossless: cost-aware switch, AR's tokens
        full_heisd(base),  # ours: cost-aware switch, every mechanism
    ]
    # the cost rule's other choices beside the base's, in the same run: plain AR after a rejected
    # group (retrieval, heisd), the drafter tree picked by the cost rule (heisd); and HeiSD with the
    # paper's fixed acceptance tolerance; a variant equal to the base is not run twice
    variants = [replace(plain, method="retrieval", retrieval_fallback="ar"),
                replace(plain, method="heisd", retrieval_fallback="ar"),
                replace(plain, method="heisd", drafter_tree="cost"),
                replace(plain, method="heisd", tolerance="paper"),
                replace(plain, method="heisd", fused_prefill=True)]
    for config in variants:
        if config.label not in {c.label for c in configs}:
            configs.append(config)
    return configs


def tolerance_variant(base: MethodConfig, spec: str) -> MethodConfig:
    """The full HeiSD at acceptance tolerance `spec` (`Tolerance.parse`; a bad one is a UsageError)."""
    from heisd.errors import UsageError

    try:
        return replace(full_heisd(base), tolerance=spec)
    except ValueError as err:
        raise UsageError(f"--tolerances: {err}") from err


def bench_policies(target, configs: list[MethodConfig], record_options: bool = False) -> list[VLAPolicy]:
    """One policy per configuration on the shared target (with its option recorder where asked)."""
    policies = [VLAPolicy(target, build_decoders(mc, target)) for mc in configs]
    if record_options:
        for mc, policy in zip(configs, policies, strict=True):
            policy.recorder = make_recorder(mc, target, policy.decoders)
    return policies


def _remote_policies(make_target: Callable, configs: list[MethodConfig], record_options: bool) -> list[VLAPolicy]:
    return bench_policies(make_target(), configs, record_options)


def run_bench(target, configs: list[MethodConfig], cfg: EvalConfig, out: Path, progress: bool = True,
              persist: MethodConfig | None = None, target_path: str | None = None,
              record_options: bool = False, executor=None, make_target: Callable | None = None) -> list[dict]:
    """Evaluate each configuration into out/<label>/ (each resumable, each run.json with the
    resources' fingerprints). `persist`: the configuration whose online skip thresholds are
    merged into the datastore manifest once all its episodes are done (none when None).
    `record_options`: configurations with a cost-based choice also record, per step and untimed,
    what each of its options would have done (`runtime.options`, for `heisd project`).
    `executor` (`heisd.executors`; default: this process): where the jobs run; a remote one
    loads each worker's target with `make_target` (a picklable function).

    One job is one episode (task, index) with every configuration in turn, on one worker, rather
    than one method after the other, so a change in machine load during the run (this machine is
    shared) hits every method alike; the speedups, ratios to AR's latency, are formed within each
    worker (`worker_speedups`), never across machines of different speed.
    """
    from tqdm import tqdm

    from heisd.executors import LocalExecutor
    from heisd.retrieval.online import check_persistable

    if configs[0].method != "ar":
        raise ValueError("the first configuration must be AR: speedups are ratios to it")
    executor = executor or LocalExecutor()
    out = Path(out)
    refuse_foreign(out, BENCH_RUN)
    policies = bench_policies(target, configs, record_options)
    if persist is not None:
        check_persistable(policies[configs.index(persist)].skip_thresholds())
    fingerprint = target.fingerprint()
    with ExitStack() as held:
        held.enter_context(directory_lock(out))
        runs = [held.enter_context(EvalRun(mc.label, cfg, out / _folder(mc),
                                           _identity(fingerprint, mc, target_path, policy)))
                for mc, policy in zip(configs, policies, strict=True)]
        for run, policy in zip(runs, policies):
            run.attach(policy)
        pending = [set(run.pending()) for run in runs]
        jobs = [(t, i, ks) for t, i in cfg.jobs() if (ks := tuple(k for k in range(len(runs)) if (t, i) in pending[k]))]
        here = EpisodeWorker(policies, cfg, str(out), [run.out / MUJOCO_LOG for run in runs])
        setup = None if make_target is None else partial(
            episode_worker, partial(_remote_policies, make_target, configs, record_options), cfg, str(out),
            [run_thresholds.snapshot(policy.skip_thresholds()) for policy in policies])
        with tqdm(total=sum(len(ks) for *_, ks in jobs), desc="bench", unit="ep", disable=not progress) as bar:
            for (task, _, _), lines in executor.map(play, jobs, setup=setup, here=here):
                for k, line in lines:
                    runs[k].record(line)
                bar.update(len(lines))
                bar.set_postfix(task=task)
        summaries = []
        for mc, run in zip(configs, runs):
            summary = run.summary()
            summary["dir"] = _folder(mc)
            summary["config"] = {k: v for k, v in mc.__dict__.items() if k not in ("drafter", "datastore")}
            summaries.append(summary)
        if persist is not None:
            k = configs.index(persist)
            runs[k].persist_thresholds(policies[k])
        ar = summaries[0]["latency_ms"]["median"]
        for run, s in zip(runs, summaries):
            by_worker = worker_speedups(runs[0].done, run.done)
            # no worker ran both (a resume after AR finished elsewhere): the pooled ratio
            s["speedup"] = float(np.median(list(by_worker.values()))) if by_worker else ar / s["latency_ms"]["median"]
            if len(by_worker) > 1:  # one worker: the plain ratio, nothing to spread
                s["speedup_by_worker"] = by_worker
        write_json(out / BENCH_FILE, summaries)
    return summaries


def worker_speedups(ar_lines: list[dict], lines: list[dict]) -> dict[str, float]:
    """Per worker that ran both (`worker` of a Ray run's lines; a local run is one worker): AR's
    median step latency over its episodes / the method's over its episodes. Each ratio compares
    steps timed on one machine under one load."""
    def latencies(episodes: list[dict]) -> dict[str, list[float]]:
        by: dict[str, list[float]] = {}
        for e in episodes:
            by.setdefault(e.get("worker", LOCAL_WORKER), []).extend(e["steps"]["latency_ms"])
        return by

    ar, ours = latencies(ar_lines), latencies(lines)
    return {w: float(np.median(ar[w]) / np.median(ours[w])) for w in sorted(ours) if w in ar and ours[w]}


def _identity(fingerprint: str, mc: MethodConfig, target_path: str | None, policy: VLAPolicy) -> dict:
    identity = run_identity(fingerprint, mc, target_path)
    if policy.recorder is not None:  # a resume must record them too: a projection re-decides every step or none
        identity["record_options"] = True
    return identity


def _folder(mc: MethodConfig) -> str:
    return mc.label.replace("+", "_").replace("@", "_t")


def report_table(summaries: list[dict]) -> str:
    head = ("| method | SR (episodes) | speedup | tokens / fwd | AL | target fwd | latency median / p90 ms "
            "| skip rate (prefill) | retrieval frac | vision / prefill / retrieval / draft / verify / other ms |")
    rows = [head, "|" + "---|" * 10]
    for s in summaries:
        b = s["breakdown_ms"]
        rows.append(
            f"| {s['method']} | {100 * s['sr']:.1f}% ({s['episodes']}) | {s['speedup']:.2f}x{_spread(s)} | "
            f"{s['tokens_per_forward']:.2f} | {s['acceptance_length']:.2f} | {s['target_forwards']:.2f} | "
            f"{s['latency_ms']['median']:.1f} / {s['latency_ms']['p90']:.1f} | "
            f"{s['skip_rate']:.2f} ({s['prefill_skip_rate']:.2f}) | "
            f"{s['retrieval_fraction']:.2f} | "
            + " / ".join(f"{b[k]:.1f}" for k in ("vision", "prefill", "retrieval", "draft", "verify", "other"))
            + " |"
        )
    return "\n".join(rows) + "\n"


def _spread(summary: dict) -> str:
    """A Ray run's speedup is the median of per-worker ratios: their range beside it."""
    ratios = list(summary.get("speedup_by_worker", {}).values())
    return f" ({min(ratios):.2f}-{max(ratios):.2f} over {len(ratios)} workers)" if ratios else ""


def position_table(summaries: list[dict]) -> str:
    """Per method that drafts: the acceptance rate at each draft depth (what trees are tuned with)."""
    drafting = [s for s in summaries if s["acceptance_rate_by_position"]]
    if not drafting:
        return ""
    depth = max(len(s["acceptance_rate_by_position"]) for s in drafting)
    rows = ["## Acceptance by draft position\n",
            "Of the verify passes whose draft reached depth k, the fraction that accepted k tokens or more.\n",
            "| method | drafted passes | " + " | ".join(f"k={k}" for k in range(1, depth + 1)) + " |",
            "|" + "---|" * (depth + 2)]
    for s in drafting:
        rates = s["acceptance_rate_by_position"]
        cells = [f"{r:.2f}" for r in rates] + ["-"] * (depth - len(rates))
        rows.append(f"| {s['method']} | {s['drafted_passes']} | " + " | ".join(cells) + " |")
    return "\n".join(rows) + "\n\n"


def switch_table(summaries: list[dict]) -> str:
    """Per hybrid configuration: the steps of each mode and, for the cost-aware switch, how far its
    predicted decode time was from the measured one."""
    rows = ["## Switch decisions\n", "| method | retrieval steps | drafter steps | predicted steps | "
            "median abs. error of the predicted decode time |", "|---|---|---|---|---|"]
    for s in summaries:
        switch = s.get("switch", {})
        modes = switch.get("modes", {})
        if len(modes) < 2 and "predicted_steps" not in switch:
            continue  # a single-mode method makes no mode decision
        error = switch.get("median_relative_error")
        rows.append(f"| {s['method']} | {modes.get('retrieval', 0)} | {modes.get('drafter', 0)} | "
                    f"{switch.get('predicted_steps', 0)} | {_percent(error)} |")
    rules = [(s["method"], rule, option, e) for s in summaries
             for rule, options in s.get("switch", {}).get("rules", {}).items() for option, e in options.items()]
    if rules:
        rows += ["", "Cost-rule choices (fallback: after a rejected retrieval group, per step; tree: per drafter "
                 "proposal), with the median abs. error of the predicted time of each choice:", "",
                 "| method | rule | option | chosen | predicted | median abs. error |", "|---|---|---|---|---|---|"]
        rows += [f"| {m} | {rule} | {option} | {e['chosen']} | {e['predicted']} | {_percent(e['median_relative_error'])} |"
                 for m, rule, option, e in rules]
    return "\n".join(rows) + "\n\n"


def _percent(fraction: float | None) -> str:
    return "-" if fraction is None else f"{100 * fraction:.0f}%"


def write_report(summaries: list[dict], out: Path, command: str, cfg: EvalConfig) -> Path:
    from heisd.benchmarks.libero_protocol import MAX_STEPS, NUM_STEPS_WAIT
    from heisd.benchmarks.registry import is_libero
    from heisd.runtime.plots import plot_all

    plots = plot_all(summaries, out)
    per_task = sorted({t for s in summaries for t in s["per_task"]})
    task_rows = ["| method | " + " | ".join(per_task) + " |", "|" + "---|" * (len(per_task) + 1)]
    for s in summaries:
        task_rows.append(f"| {s['method']} | " + " | ".join(
            f"{100 * s['per_task'][t]['sr']:.0f}% ({s['per_task'][t]['episodes']})" if t in s["per_task"] else "-"
            for t in per_task) + " |")
    if is_libero(cfg.benchmark):
        protocol = MAX_STEPS[cfg.benchmark]
        limit = f"{NUM_STEPS_WAIT} wait steps, then at most {cfg.max_steps} env steps " + (
            "(the suite's protocol)" if cfg.max_steps == protocol else f"(the suite's protocol: {protocol})")
    else:
        limit = f"max {cfg.max_steps} env steps"
    text = (
        f"# heisd bench\n\nCommand: `{command}`\n\n"
        f"Tasks: {', '.join(cfg.tasks)}; {cfg.episodes} episodes per task; evaluation seed {cfg.seed}; "
        f"{limit}. Speedup = AR median latency / method median latency, same run (with --ray: per worker, over "
        f"the episodes it ran; the median of the workers' ratios, their range in brackets).\n\n"
        + report_table(summaries)
        + "\n## Success per task\n\n" + "\n".join(task_rows) + "\n\n" + position_table(summaries) + switch_table(summaries) + "## Plots\n\n"
        + "".join(f"![{p.stem}]({p.name})\n" for p in plots)
    )
    path = out / "report.md"
    write_text(path, text)
    return path
