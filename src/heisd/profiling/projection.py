"""Projected latency of a bench run on another device (docs/design.md §5.3): every recorded step's
passes priced with the per-piece costs a `heisd profile` measured there, over the whole step
distribution (mean, median and p90 latency, the steps in each mode and each fallback).

Two projections per method:
- **recorded choices**: every step as it ran (its mode, its fallback), priced with the profile;
- **re-decided**: where the method chooses by cost (the cost switch, the cost fallback) and the
  run recorded every option (`heisd bench --record-options`), the same rules are replayed with
  the profile's costs and choose again, step by step (`heisd.profiling.redecide`). The threshold
  switch's modes and fixed fallbacks do not depend on costs: they stay as they ran.

A step costs vision, in retrieval mode its proposal (the query and the group tree; a prefill skip
the query alone), the prefill unless it was skipped, and per verify pass the verification of its
draft tokens (linear between the profiled tree sizes; no draft is a decode step) plus its drafter
proposal (the profiled proposal less the levels it did not run). A fused step's first tree rode in
its prefill pass: it adds its share of the profiled fused prefill's extra cost over the prefill.

Plus the step's **host time** (`host_ms`), carried over per step as the run measured it: the time
the run spent outside the profiled pieces, which is Python/host bookkeeping that does not change
with the device's compute or the thread count. It is the step's `other` (acceptance, cache
compaction, the loop's bookkeeping, token-to-action decoding, the switch's update) plus the part
of its `vision` column beyond the profiled vision pass on the run's own device (the switch's
decision and F, the frame's conversion, the retrieval key's copy to the host), the latter only
where that device's profile is given (`source_profile`; never below 0). Without it only `other`
is carried and projected milliseconds are a lower bound (BENCHMARKS 6.4.1). A re-decided step
keeps its own measured host time, whatever mode it moves to. The executed actions stay the
recorded ones: a re-decided choice changes which passes run and what they cost, not the episode.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

from heisd.runtime.passes import Pass, StepPasses, split_step


@dataclass(frozen=True)
class PieceCosts:
    """A profile's median ms per piece (None: not profiled)."""

    vision: float
    prefill: float
    decode_step: float
    tree: tuple[tuple[int, float], ...]  # (draft tokens, one verification pass over them), by size
    drafter_pass: float | None = None
    query: float | None = None
    # whole proposals, where profiled (older profiles: passes and the query alone)
    drafter_proposal: float | None = None  # a proposal of `proposal_depth` levels, its tree choice included
    proposal_depth: int = 0
    retrieval_proposal: float | None = None  # the query and the group tree
    fused_prefill: float | None = None  # the prefill pass verifying a tree of `fused_nodes` nodes
    fused_nodes: int = 0

    @classmethod
    def from_profile(cls, profile: dict[str, Any]) -> PieceCosts:
        pieces = profile["pieces_ms"]
        ms = lambda name: float(pieces[name]["median_ms"]) if name in pieces else None  # noqa: E731
        tree = tuple(sorted((int(n), float(v["median_ms"])) for n, v in pieces.get("tree_verify", {}).items()))
        depth = int(profile.get("drafter_tree", {}).get("depth", 0))
        return cls(ms("vision"), ms("prefill"), ms("decode_step"), tree, ms("drafter_pass"), ms("datastore_query"),
                   ms("drafter_proposal") if depth else None, depth, ms("retrieval_proposal"),
                   ms("fused_prefill"), int(profile.get("fused_prefill_nodes", 0)))

    def with_host_pieces(self, source: PieceCosts) -> PieceCosts:
        """These costs, with the datastore query and the retrieval proposal taken from `source` where
        this profile has none. Both run on the host (the datastore stays in host memory), so a device
        profiled without the bench's datastore (a GPU profile of random 7B weights, say) prices them
        as the bench's own host ran them."""
        if self.query is not None or source.query is None:
            return self
        return replace(self, query=source.query, retrieval_proposal=source.retrieval_proposal)

    def fused_extra(self, nodes: int) -> float:
        """What a tree of `nodes` draft tokens adds to the prefill pass that verifies it: linear in
        the nodes from the profiled fused prefill; without one (older profiles), a verification
        pass over them less a plain decode step."""
        if self.fused_prefill is not None and self.fused_nodes:
            return max(self.fused_prefill - self.prefill, 0.0) * nodes / self.fused_nodes
        return max(self.verify(nodes) - self.decode_step, 0.0)

    def proposal(self, levels: int) -> float:
        """One drafter proposal of `levels` passes: the profiled proposal less the passes it ran
        beyond `levels` (at least the passes alone)."""
        if self.drafter_pass is None:
            raise ValueError("the profile has no 'drafter_pass' (profile again with --drafter or --random-drafter)")
        if self.drafter_proposal is None:
            return levels * self.drafter_pass
        unrun = (self.proposal_depth - levels) * self.drafter_pass
        return max(self.drafter_proposal - unrun, levels * self.drafter_pass)

    def verify(self, nodes: int) -> float:
        """One verification pass over `nodes` draft tokens: linear between the profiled sizes
        (beyond the largest: the largest's cost)."""
        xs, ys = [0] + [n for n, _ in self.tree], [self.decode_step] + [v for _, v in self.tree]
        return float(np.interp(nodes, xs, ys))

    def passes_ms(self, passes: Sequence[Pass]) -> tuple[float, float]:
        """(verification ms, drafter ms) of some verify passes."""
        return sum(self.verify(n) for n, _ in passes), sum(self.proposal(levels) for _, levels in passes if levels)

    def step(self, mode: str, prefill: bool, passes: Sequence[Pass], fused: bool = False) -> Priced:
        """`fused`: the first of `passes` rode in the prefill pass, priced as what its draft tokens
        add to that pass (`fused_extra`), not as a pass of its own."""
        if mode == "retrieval" and self.query is None:
            raise ValueError("the profile has no 'datastore_query' (profile again with --datastore, or give a "
                             "--source-profile that has one: the query runs on the host)")
        verify, draft = self.passes_ms(passes)
        prefill_ms = self.prefill if prefill else 0.0
        if fused and passes:  # as the loop times it: the first tree's share is in the prefill pass
            verify -= self.verify(passes[0][0])
            prefill_ms += self.fused_extra(passes[0][0])
        query = 0.0
        if mode == "retrieval":  # a prefill skip queried and built no tree; other steps proposed one
            query = self.retrieval_proposal if prefill and self.retrieval_proposal is not None else self.query
        forwards = len(passes) + (not (fused and passes)) if prefill else 0
        return Priced(self.vision, prefill_ms, verify, draft, query or 0.0, forwards)


@dataclass(frozen=True)
class Priced:
    """One projected step, by piece (ms)."""

    vision: float
    prefill: float
    verify: float
    draft: float  # drafter passes
    query: float  # the datastore query and the group tree (retrieval mode)
    forwards: int  # target passes, the prefill included

    @property
    def total(self) -> float:
        return self.vision + self.prefill + self.verify + self.draft + self.query


@dataclass(frozen=True)
class RecordedStep:
    """One step of a bench's episodes.jsonl."""

    mode: str
    passes: StepPasses  # as it ran (its fallback, if one ran)
    fallback: str | None  # the fallback that ran
    latency_ms: float  # measured
    options: dict[str, Any] | None  # `--record-options`: every option on this frame
    host_ms: float = 0.0  # measured time outside the profiled pieces, carried over as is (see the module doc)


@dataclass(frozen=True)
class ProjectedStep:
    mode: str
    fallback: str | None
    ms: float  # the priced pieces plus host_ms
    host_ms: float = 0.0


def read_steps(path: Path, config: dict[str, Any], n_tokens: int,
               source_vision_ms: float | None = None) -> list[RecordedStep]:
    """The steps of a method's episodes.jsonl, in the order they ran. `source_vision_ms`: the
    profiled vision pass on the device that ran them (what of the vision column is not host time)."""
    out = []
    for line in path.read_text().splitlines():
        s = json.loads(line)["steps"]
        count = len(s["mode"])
        hosts = host_ms(s, count, source_vision_ms)
        for i in range(count):
            mode, fallback = s["mode"][i], _column(s, "fallback", count)[i]
            ran = _ran_fallback(_column(s, "choices", count, [])[i], config) if mode == "retrieval" else None
            if fallback is not None and fallback[0] == 0:
                ran = None
            passes = split_step(mode, s["target_forwards"][i], s["accepted"][i], s["draft_depth"][i],
                                _column(s, "draft_size", count)[i], None if fallback is None else tuple(fallback), ran,
                                config, n_tokens)
            if not passes.tokens_left:
                ran = None
            out.append(RecordedStep(mode, passes, ran, float(s["latency_ms"][i]), _column(s, "options", count)[i],
                                    hosts[i]))
    return out


def host_ms(steps: dict[str, Any], count: int, source_vision_ms: float | None = None) -> list[float]:
    """Per step, the measured time outside the profiled pieces: the breakdown's `other`, plus the
    vision column beyond `source_vision_ms` (the profiled vision on the run's device) where given.
    0 where an older run kept no breakdown."""
    breakdown = steps.get("breakdown_ms") or {}
    other = breakdown.get("other", [0.0] * count)
    vision = breakdown.get("vision", [0.0] * count)
    beyond = (lambda v: max(float(v) - source_vision_ms, 0.0)) if source_vision_ms is not None else (lambda v: 0.0)
    return [float(o) + beyond(v) for o, v in zip(other, vision, strict=True)]


def _column(steps: dict[str, list], key: str, count: int, empty: Any = None) -> list:
    """A per-step column of an episode line; `empty` per step where an older run did not keep it."""
    return steps.get(key, [empty] * count)


def _ran_fallback(choices: list, config: dict[str, Any]) -> str:
    """The fallback a retrieval step ran: the cost rule's pick, else the configured one."""
    return next((option for rule, option, *_ in choices if rule == "fallback"),
                "ar" if config["retrieval_fallback"] == "cost" else config["retrieval_fallback"])


def price_recorded(steps: Sequence[RecordedStep], costs: PieceCosts) -> list[ProjectedStep]:
    """Each step as it ran, priced with `costs`, plus its own measured host time."""
    return [ProjectedStep(s.mode, s.fallback, s.host_ms + costs.step(s.mode, s.passes.prefill,
                                                                     s.passes.passes(s.fallback), s.passes.fused).total,
                          s.host_ms)
            for s in steps]


def distribution(steps: Sequence[ProjectedStep]) -> dict[str, Any]:
    """Mean, median and p90 of the projected step latencies (host time included, and on its own);
    steps per mode and per fallback."""
    ms, host = np.asarray([s.ms for s in steps]), np.asarray([s.host_ms for s in steps])
    return {"mean_ms": float(ms.mean()), "median_ms": float(np.median(ms)), "p90_ms": float(np.percentile(ms, 90)),
            "host_median_ms": float(np.median(host)), "host_mean_ms": float(host.mean()),
            "modes": dict(sorted(Counter(s.mode for s in steps).items())),
            "fallbacks": dict(sorted(Counter(s.fallback for s in steps if s.fallback).items()))}


def redecided_what(config: dict[str, Any]) -> list[str]:
    """The cost-based choices of a method configuration (what a projection re-decides)."""
    what = []
    if config["method"] == "heisd" and config.get("switch") == "cost":
        what.append("mode")
    if config["method"] in ("retrieval", "heisd") and config.get("retrieval_fallback") == "cost":
        what.append("fallback")
    return what


def measured(steps: Sequence[RecordedStep]) -> dict[str, Any]:
    """The measured latency distribution and the mode and fallback mix of a run's steps."""
    ms = np.asarray([step.latency_ms for step in steps])
    return {"mean_ms": float(ms.mean()), "median_ms": float(np.median(ms)), "p90_ms": float(np.percentile(ms, 90)),
            "modes": dict(sorted(Counter(step.mode for step in steps).items())),
            "fallbacks": dict(sorted(Counter(step.fallback for step in steps if step.fallback).items()))}


def project_bench(bench_dir: Path, profile: dict[str, Any], datastore: Path | None = None,
                  compare: Path | None = None, source_profile: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    """Per method of a bench run: measured, projected (recorded choices) and projected
    (re-decided) latency distribution and speedups. `datastore`: where the cost switch's
    calibration is, when not where the run recorded it. `compare`: a bench of the same methods
    measured on the profile's device (its numbers go beside the projection, as "there").
    `source_profile`: a profile of the device that ran the bench; with it the vision column beyond
    its vision pass is host time too (carried over, as `other` always is), and where `profile` has no
    datastore query its host pieces are taken from there (`PieceCosts.with_host_pieces`)."""
    from heisd.profiling.redecide import redecide

    summaries = json.loads((bench_dir / "bench.json").read_text())
    n_tokens = int(profile["spec"]["n_action_tokens"])
    costs = PieceCosts.from_profile(profile)
    source_vision = None
    if source_profile is not None:
        source = PieceCosts.from_profile(source_profile)
        costs, source_vision = costs.with_host_pieces(source), source.vision
    there = {}
    if compare is not None:
        for s in json.loads((compare / "bench.json").read_text()):
            there[s["method"]] = measured(read_steps(compare / s["dir"] / "episodes.jsonl", s["config"], n_tokens))
        missing = [s["method"] for s in summaries if s["method"] not in there]
        if missing:
            raise ValueError(f"{compare} has no run of {', '.join(missing)} to compare with")
    rows = []
    for s in summaries:
        config = s["config"]
        steps = read_steps(bench_dir / s["dir"] / "episodes.jsonl", config, n_tokens, source_vision)
        row: dict[str, Any] = {"method": s["method"], "steps": len(steps), "measured": measured(steps),
                               "recorded": distribution(price_recorded(steps, costs))}
        if there:
            row["there"] = there[s["method"]]
        what = redecided_what(config)
        recorded = sum(step.options is not None for step in steps)
        if not what:
            row["redecided"], row["redecided_what"] = row["recorded"], []  # nothing depends on costs
        elif recorded < len(steps):
            row["redecided"], row["redecided_what"] = None, what
            row["not_redecided"] = (f"{recorded} of {len(steps)} steps recorded their options "
                                    "(run the bench with --record-options)")
        else:
            switch = _switch(bench_dir / s["dir"], datastore, n_tokens) if "mode" in what else None
            row["redecided_what"] = what
            row["redecided"] = distribution(redecide(steps, config, costs, switch, n_tokens))
        rows.append(row)
    _speedups(rows)
    return rows


def _speedups(rows: list[dict[str, Any]]) -> None:
    """AR (the first row) over each method: of the median (as measured runs report it) and of the mean."""
    ar = rows[0]
    for row in rows:
        for key in ("measured", "there", "recorded", "redecided"):
            if row.get(key) is not None:  # AR's projection has nothing to re-decide: its recorded one
                base = ar["recorded"] if key == "redecided" else ar[key]
                row[key]["speedup"] = base["median_ms"] / row[key]["median_ms"]
                row[key]["mean_speedup"] = base["mean_ms"] / row[key]["mean_ms"]
        if "there" in row:  # how far each projected speedup (of the median, of the mean) is from the one measured there
            row["speedup_error"] = {key: {stat: row[key][stat] / row["there"][stat] - 1
                                          for stat in ("speedup", "mean_speedup")}
                                    for key in ("recorded", "redecided") if row[key] is not None}


def _switch(run_dir: Path, datastore: Path | None, n_tokens: int):
    """The cost switch as the run started it: from the calibration in its datastore's manifest."""
    from heisd.kinematics import CostAwareSwitch, KinematicConfig, KinematicStats
    from heisd.retrieval.manifest import read_manifest

    if datastore is None:
        recorded = json.loads((run_dir / "run.json").read_text()).get("paths", {}).get("datastore")
        if recorded is None:
            raise ValueError(f"{run_dir}/run.json names no datastore: give --datastore")
        datastore = Path(recorded)
    extras = read_manifest(Path(datastore))["extras"]
    if "calibration_frames" not in extras or "kinematic_stats" not in extras:
        raise ValueError(f"datastore {datastore} is not calibrated: the cost switch starts from its calibration")
    return CostAwareSwitch(KinematicConfig(**extras.get("kinematic_config", {})),
                           KinematicStats.from_dict(extras["kinematic_stats"]), extras["calibration_frames"], n_tokens)


def _mix(counts: dict[str, int], steps: int) -> str:
    return " ".join(f"{k} {v / steps:.0%}" for k, v in counts.items()) or "-"


def _counts(counts: dict[str, int]) -> str:
    return " ".join(f"{k} {v}" for k, v in sorted(counts.items(), key=lambda kv: -kv[1])) or "-"


def format_projection(rows: list[dict[str, Any]], profile: dict[str, Any]) -> str:
    """The projection as two markdown tables: measured beside projected with the recorded choices,
    then the re-decided choices under the profile's costs."""
    device = f"{profile.get('device_name', profile.get('device'))} ({profile.get('dtype', '')}"
    device += f", {profile['threads']} threads)" if "threads" in profile else ")"
    head = [f"PROJECTION for {profile['target']} on {device}, from the steps of a measured run.",
            "Speedups: AR's median (mean) step over the method's. Modes: share of steps; fallbacks: steps that "
            "reached each. Host: the run's measured time outside the profiled pieces, carried over per step and "
            "included in the projected ms.", "",
            "| method | steps | measured median / mean ms | measured speedup (mean) | modes | fallbacks "
            "| host median / mean ms | projected median / mean ms | projected speedup (mean) |",
            "|---|---|---|---|---|---|---|---|---|"]
    lines = []
    for r in rows:
        m, p, n = r["measured"], r["recorded"], r["steps"]
        lines.append(f"| {r['method']} | {n} | {m['median_ms']:.2f} / {m['mean_ms']:.2f} | {m['speedup']:.2f}x "
                     f"({m['mean_speedup']:.2f}x) | {_mix(m['modes'], n)} | {_counts(m['fallbacks'])} | "
                     f"{p['host_median_ms']:.2f} / {p['host_mean_ms']:.2f} | "
                     f"{p['median_ms']:.2f} / {p['mean_ms']:.2f} | {p['speedup']:.2f}x ({p['mean_speedup']:.2f}x) |")
    re_head = ["", "RE-DECIDED under the profile's costs: the cost switch's mode and the cost fallback replayed "
               "step by step (other choices as recorded).", "",
               "| method | re-decided | modes | fallbacks | projected median / mean ms | projected speedup (mean) |",
               "|---|---|---|---|---|---|"]
    re_lines = []
    for r in rows:
        if not r["redecided_what"]:
            continue
        d = r["redecided"]
        if d is None:
            re_lines.append(f"| {r['method']} | not: {r['not_redecided']} | | | | |")
            continue
        re_lines.append(f"| {r['method']} | {' + '.join(r['redecided_what'])} | {_mix(d['modes'], r['steps'])} | "
                        f"{_counts(d['fallbacks'])} | {d['median_ms']:.2f} / {d['mean_ms']:.2f} | "
                        f"{d['speedup']:.2f}x ({d['mean_speedup']:.2f}x) |")
    text = "\n".join(head + lines + (re_head + re_lines if re_lines else []))
    if any("there" in r for r in rows):
        text += "\n" + _check_table(rows)
    return text


def _check_table(rows: list[dict[str, Any]]) -> str:
    """The projection beside a run measured on the profile's device (`--compare`)."""
    lines = ["", "CHECK against the run measured on the profile's device (--compare): speedups of the median (mean) "
             "step; error = projected / measured - 1.", "",
             "| method | measured there: speedup (mean) | modes | fallbacks | projected, recorded choices | error "
             "| projected, re-decided | error |", "|---|---|---|---|---|---|---|---|"]

    def cells(key: str, r: dict[str, Any]) -> str:
        if r[key] is None:
            return "- | -"
        e = r["speedup_error"][key]
        return (f"{r[key]['speedup']:.2f}x ({r[key]['mean_speedup']:.2f}x) | "
                f"{e['speedup']:+.0%} ({e['mean_speedup']:+.0%})")

    for r in rows:
        t, n = r["there"], sum(r["there"]["modes"].values())
        lines.append(f"| {r['method']} | {t['speedup']:.2f}x ({t['mean_speedup']:.2f}x) | {_mix(t['modes'], n)} | "
                     f"{_counts(t['fallbacks'])} | {cells('recorded', r)} | {cells('redecided', r)} |")
    return "\n".join(lines)
