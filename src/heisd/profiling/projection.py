"""Projected latency of a bench run on another device: the run's per-step statistics (mode,
target passes) times the per-piece costs a `heisd profile` measured there.

Per control step: vision, the retrieval query in retrieval mode, the prefill when the target
ran, and per verify pass after it: AR a decode step; the drafter a tree verification of its
budget plus one drafter pass per tree level; Jacobi a chain of the remaining tokens; retrieval
its group tree once, then its fallback (AR decode steps, drafter passes or Jacobi chains; with
`--retrieval-fallback cost`, the one the step chose). Bookkeeping is not modelled. Every number this produces is a projection, and the report says so.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np


def piece(profile: dict[str, Any], name: str) -> float:
    pieces = profile["pieces_ms"]
    if name not in pieces:
        raise ValueError(f"the profile has no '{name}' (profile again with the piece: --drafter / --datastore)")
    return float(pieces[name]["median_ms"])


def verify_ms(profile: dict[str, Any], nodes: int) -> float:
    """One verification pass over `nodes` draft tokens: linear between the profiled sizes."""
    sizes = sorted((int(n), float(v["median_ms"])) for n, v in profile["pieces_ms"]["tree_verify"].items())
    xs, ys = [0] + [n for n, _ in sizes], [piece(profile, "decode_step")] + [v for _, v in sizes]
    return float(np.interp(nodes, xs, ys))  # beyond the largest size: the largest size's cost


def step_ms(step: dict[str, Any], config: dict[str, Any], profile: dict[str, Any], n_tokens: int) -> float:
    """Projected latency of one recorded step (`mode`, `target_forwards`) of a method `config`."""
    mode, forwards = step["mode"], step["target_forwards"]
    ms = piece(profile, "vision") + (piece(profile, "prefill") if forwards > 0 else 0.0)
    verifies = max(forwards - 1, 0)

    def drafter_verify() -> float:  # one drafter proposal (a pass per tree level) and its verification
        return verify_ms(profile, config["tree_budget"]) + config["tree_depth"] * piece(profile, "drafter_pass")

    if mode == "retrieval":
        ms += piece(profile, "datastore_query")
        if verifies:
            # the cost fallback: what this step chose (a step with no choice on record fell back to nothing)
            chosen = config["retrieval_fallback"] if config["retrieval_fallback"] != "cost" else step.get("fallback", "ar")
            fallback = {"drafter": drafter_verify, "jacobi": lambda: verify_ms(profile, n_tokens - 1),
                        "ar": lambda: piece(profile, "decode_step")}[chosen]()
            ms += verify_ms(profile, config["retrieval_budget"]) + (verifies - 1) * fallback
    elif mode == "jacobi":
        ms += verifies * verify_ms(profile, n_tokens - 1)
    elif config["method"] == "ar":
        ms += verifies * piece(profile, "decode_step")
    else:  # drafter mode of specvla* / heisd
        ms += verifies * drafter_verify() if verifies else 0.0
    return ms


def project_bench(bench_dir: Path, profile: dict[str, Any]) -> list[dict[str, Any]]:
    """Per method of a bench run: measured and projected median step latency and speedup."""
    summaries = json.loads((bench_dir / "bench.json").read_text())
    n_tokens = int(profile["spec"]["n_action_tokens"])
    rows = []
    for s in summaries:
        steps = []
        for line in (bench_dir / s["dir"] / "episodes.jsonl").read_text().splitlines():
            record = json.loads(line)["steps"]
            choices = record.get("choices", [[]] * len(record["mode"]))
            steps += [{"mode": m, "target_forwards": f, "fallback": _fallback(c)}
                      for m, f, c in zip(record["mode"], record["target_forwards"], choices)]
        projected = [step_ms(step, s["config"], profile, n_tokens) for step in steps]
        rows.append({"method": s["method"], "steps": len(steps), "measured_ms": s["latency_ms"]["median"],
                     "measured_speedup": s["speedup"], "projected_ms": float(np.median(projected))})
    ar = rows[0]["projected_ms"]
    for row in rows:
        row["projected_speedup"] = ar / row["projected_ms"]
    return rows


def _fallback(choices: list) -> str:
    """The fallback a step's cost rule chose (`episode_steps` choices), "ar" when none ran."""
    return next((option for rule, option, *_ in choices if rule == "fallback"), "ar")


def format_projection(rows: list[dict[str, Any]], profile: dict[str, Any]) -> str:
    head = (f"PROJECTION for {profile['target']} on {profile.get('device_name', profile.get('device'))} "
            f"({profile.get('dtype', '')}), from the steps of a measured run\n\n"
            "| method | steps | measured median ms | measured speedup | projected median ms | projected speedup |\n"
            "|---|---|---|---|---|---|")
    lines = [f"| {r['method']} | {r['steps']} | {r['measured_ms']:.2f} | {r['measured_speedup']:.2f}x | "
             f"{r['projected_ms']:.2f} | {r['projected_speedup']:.2f}x |" for r in rows]
    return "\n".join([head, *lines])
