"""The metrics of docs/design.md §4, defined once: per-episode aggregation and the run summary."""

from __future__ import annotations

import numpy as np

from heisd.runtime.policy import StepRecord

BREAKDOWN_KEYS = ("vision", "prefill", "retrieval", "draft", "verify", "other")


def episode_steps(records: list[StepRecord]) -> dict:
    """The per-step numbers an episode line keeps (lists, so summaries can pool all steps)."""
    return {
        "latency_ms": [round(r.latency_ms, 4) for r in records],
        "breakdown_ms": {k: [round(r.breakdown_ms[k], 4) for r in records] for k in BREAKDOWN_KEYS},
        "target_forwards": [r.target_forwards for r in records],
        "tokens_per_forward": [round(r.tokens_per_forward, 4) for r in records],
        "accepted": [r.accepted for r in records],  # per step: accepted draft tokens per verify pass
        "draft_depth": [r.draft_depths for r in records],  # per step: the verified tree's depth per pass
        "draft_size": [r.draft_sizes for r in records],  # per step: the verified tree's draft tokens per pass
        "fallback": [list(r.fallback) for r in records],  # per step: [passes, tokens] of retrieval's fallback
        "skipped": [r.skipped for r in records],
        "mode": [r.mode for r in records],
        "metric": [None if r.metric is None else round(r.metric, 5) for r in records],
        "decode_ms": [round(r.decode_ms, 4) for r in records],
        "expected_ms": [None if r.expected_ms is None else round(r.expected_ms, 4) for r in records],
        # per step: [rule, option, expected ms or None, actual ms, tokens] of each cost-rule choice
        "choices": [[[c.rule, c.option, None if c.expected_ms is None else round(c.expected_ms, 4),
                      round(c.actual_ms, 4), c.tokens] for c in r.choices] for r in records],
        # per step (`--record-options`): what each mode and fallback would have done (`runtime.options`)
        **({"options": [r.options for r in records]} if any(r.options is not None for r in records) else {}),
    }


def latency_stats(values) -> dict:
    values = np.asarray(values, dtype=float)
    return {"median": float(np.median(values)), "p90": float(np.percentile(values, 90))}


def decoding_metrics(step_lists: list[dict]) -> dict:
    """Decoding numbers pooled over all control steps of `episode_steps` dicts."""
    pooled = lambda key: np.concatenate([np.asarray(s[key], dtype=float) for s in step_lists])  # noqa: E731
    latency = pooled("latency_ms")
    return {
        "control_steps": int(len(latency)),
        "latency_ms": latency_stats(latency),
        "breakdown_ms": {k: float(np.mean(np.concatenate([s["breakdown_ms"][k] for s in step_lists])))
                         for k in BREAKDOWN_KEYS},
        "target_forwards": float(pooled("target_forwards").mean()),
        "tokens_per_forward": float(pooled("tokens_per_forward").mean()),
        **acceptance_metrics(step_lists),
        "skip_rate": float(pooled("skipped").mean()),  # any skip: verify-skip or prefill skip
        "prefill_skip_rate": float((pooled("target_forwards") == 0).mean()),  # the target did not run
        "retrieval_fraction": float(np.mean(np.concatenate([np.asarray(s["mode"]) for s in step_lists]) == "retrieval")),
        "switch": switch_metrics(step_lists),
    }


def acceptance_metrics(step_lists: list[dict]) -> dict:
    """Acceptance as the speculative-decoding literature (EAGLE, vLLM) counts it, over the verify
    passes that checked a draft: `acceptance_length` = 1 + accepted draft tokens per such pass
    (1.0 when nothing was drafted, as for AR); `acceptance_rate_by_position[k-1]`: of the passes
    whose draft reached depth k, the fraction that accepted k or more. Tokens accepted with no
    verify pass (skips) are not in these; `tokens_per_forward` counts them."""
    passes = [(a, d) for s in step_lists for step_a, step_d in zip(s["accepted"], s["draft_depth"])
              for a, d in zip(step_a, step_d) if d > 0]
    accepted = np.array([a for a, _ in passes], dtype=float)
    depths = np.array([d for _, d in passes], dtype=int)
    rates = [float((accepted[depths >= k] >= k).mean()) for k in range(1, int(depths.max(initial=0)) + 1)]
    return {"acceptance_length": 1.0 + (float(accepted.mean()) if len(passes) else 0.0),
            "drafted_passes": len(passes), "acceptance_rate_by_position": rates}


def switch_metrics(step_lists: list[dict]) -> dict:
    """How often each mode ran and, where the switch predicted the decode time, how well:
    the median of |expected - actual| / actual over those steps."""
    modes = [m for s in step_lists for m in s["mode"]]
    pairs = [(e, a) for s in step_lists for e, a in zip(s.get("expected_ms", []), s.get("decode_ms", []))
             if e is not None and a > 0]
    out: dict = {"modes": {m: modes.count(m) for m in sorted(set(modes))}}
    if pairs:
        out["predicted_steps"] = len(pairs)
        out["median_relative_error"] = float(np.median([abs(e - a) / a for e, a in pairs]))
    rules: dict = {}  # "fallback" / "tree" -> option -> how often chosen and how good the predictions were
    for s in step_lists:
        for step in s.get("choices", []):
            for rule, option, expected, actual, _ in step:
                entry = rules.setdefault(rule, {}).setdefault(option, {"chosen": 0, "errors": []})
                entry["chosen"] += 1
                if expected is not None and actual > 0:
                    entry["errors"].append(abs(expected - actual) / actual)
    if rules:
        out["rules"] = {rule: {option: {"chosen": e["chosen"], "predicted": len(e["errors"]),
                                        "median_relative_error": float(np.median(e["errors"])) if e["errors"] else None}
                               for option, e in sorted(options.items())}
                        for rule, options in sorted(rules.items())}
    return out


def summarize(method: str, benchmark: str, episodes: list[dict]) -> dict:
    """summary.json from episode lines: every number pooled over all control steps."""
    if not episodes:
        raise ValueError("no finished episodes to summarize")
    # runs recorded before the executed actions were kept have no switches to count
    switches = [gripper_switches(e["steps"]["actions"]) if "actions" in e["steps"] else None for e in episodes]
    per_task: dict[str, dict] = {}
    for e, n in zip(episodes, switches):
        t = per_task.setdefault(e["task"], {"successes": 0, "episodes": 0, "switches": []})
        t["successes"] += int(e["success"])
        t["episodes"] += 1
        if n is not None:
            t["switches"].append(n)
    summary = {
        "method": method,
        "benchmark": benchmark,
        "episodes": len(episodes),
        "sr": float(np.mean([e["success"] for e in episodes])),
        "per_task": {k: {"sr": v["successes"] / v["episodes"], "episodes": v["episodes"],
                         **({"gripper_switches_median": float(np.median(v["switches"]))} if v["switches"] else {})}
                     for k, v in sorted(per_task.items())},
        **decoding_metrics([e["steps"] for e in episodes]),
    }
    by_outcome = {ok: [n for e, n in zip(episodes, switches) if n is not None and e["success"] == ok]
                  for ok in (True, False)}
    if by_outcome[True] or by_outcome[False]:
        summary["gripper_switches"] = {
            "median": float(np.median(by_outcome[True] + by_outcome[False])),
            **{f"{name}_median": float(np.median(by_outcome[ok]))
               for name, ok in (("successes", True), ("failures", False)) if by_outcome[ok]}}
    return summary


def gripper_switches(actions: list[list[list[float]]]) -> int:
    """How often the executed gripper command (each action's last value) changed sign in one
    episode's `steps["actions"]`: a policy that flips it every few steps never holds an object
    (BENCHMARKS 18.10), where the experts switch it a few times per task."""
    signs = np.sign([action[-1] for step in actions for action in step])
    signs = signs[signs != 0]  # a zero command (Meta-World's idle effort) is neither
    return int(np.count_nonzero(np.diff(signs)))
