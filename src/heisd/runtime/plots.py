"""Bench plots (PNG): the success/speed Pareto view, one episode's path by decoding mode, AL per method."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np


def plot_all(summaries: list[dict], out: Path) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    paths = [_pareto(summaries, out), _acceptance(summaries, out)]
    path = _mode_path(summaries, out)
    if path is not None:
        paths.append(path)
    return paths


def _save(fig, path: Path) -> Path:
    import matplotlib.pyplot as plt

    from heisd.storage import atomic_file

    fig.tight_layout()
    with atomic_file(path) as tmp:
        fig.savefig(tmp, dpi=120, format="png")
    plt.close(fig)
    return path


def _pareto(summaries: list[dict], out: Path) -> Path:
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8.5, 4.5))
    markers = "osD^vP*Xh<>p"
    for i, s in enumerate(summaries):
        # methods often share a success rate: a legend entry each, not labels piled on the points
        ax.scatter(s["speedup"], 100 * s["sr"], s=55, marker=markers[i % len(markers)], color=f"C{i % 10}",
                   label=f"{s['method']}  {s['speedup']:.2f}x, {100 * s['sr']:.1f}%", alpha=0.85)
    rates = [100 * s["sr"] for s in summaries]
    ax.set_ylim(max(min(rates) - 10, -2), min(max(rates) + 10, 102))
    ax.axvline(1.0, color="0.6", lw=0.8, ls=":")
    ax.set_xlabel("speedup vs AR (median latency, same run)")
    ax.set_ylabel("success rate (%)")
    ax.set_title(f"success vs speed ({summaries[0]['episodes']} episodes per method)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, loc="center left", bbox_to_anchor=(1.01, 0.5), frameon=False)
    return _save(fig, out / "pareto.png")


def _acceptance(summaries: list[dict], out: Path) -> Path:
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 3.5))
    names, x = [s["method"] for s in summaries], np.arange(len(summaries))
    ax.bar(x - 0.2, [s["tokens_per_forward"] for s in summaries], 0.4, color="tab:blue",
           label="action tokens per target forward")
    ax.bar(x + 0.2, [s["acceptance_length"] for s in summaries], 0.4, color="tab:orange",
           label="acceptance length (1 + accepted per drafted pass)")
    ax.set_xticks(x, names, rotation=30, ha="right", fontsize=8)
    ax.set_ylabel("tokens")
    ax.set_title("acceptance by method")
    ax.legend(fontsize=7, frameon=False)
    return _save(fig, out / "acceptance.png")


def _mode_path(summaries: list[dict], out: Path) -> Path | None:
    """The first successful full-HeiSD episode: its path colored by mode, and F over time."""
    import matplotlib.pyplot as plt

    full = [s for s in summaries if s["config"]["method"] == "heisd" and not s["config"]["lossless"]
            and s["config"]["verify_skip"] and s["config"]["group_acceptance"]]
    if not full:
        return None
    episodes_file = out / full[-1]["dir"] / "episodes.jsonl"
    if not episodes_file.exists():
        return None
    episodes = [json.loads(line) for line in episodes_file.read_text().splitlines()]
    episode = next((e for e in episodes if e["success"]), episodes[0] if episodes else None)
    if episode is None:
        return None
    steps = episode["steps"]
    xyz = np.asarray(steps["ee_pos"])
    retrieval = np.asarray(steps["mode"]) == "retrieval"
    metric = [np.nan if m is None else m for m in steps["metric"]]
    fig = plt.figure(figsize=(10, 4))
    ax = fig.add_subplot(1, 2, 1, projection="3d")
    ax.plot(*xyz.T, color="0.7", lw=1)
    ax.scatter(*xyz[retrieval].T, color="tab:orange", s=12, label="retrieval SD")
    ax.scatter(*xyz[~retrieval].T, color="tab:blue", s=12, label="drafter SD")
    ax.scatter(*xyz[0], color="k", marker="x", s=30, label="start")
    # axes fitted to the path at equal scale (1 cm minimum), so the path fills the box undistorted
    center, half = (xyz.max(0) + xyz.min(0)) / 2, max(float(np.ptp(xyz, axis=0).max()) / 2 * 1.1, 0.005)
    for axis, c in zip("xyz", center):
        getattr(ax, f"set_{axis}lim")(c - half, c + half)
        getattr(ax, f"set_{axis}label")(f"{axis} (m)", fontsize=7)
    ax.set_box_aspect((1, 1, 1))
    ax.tick_params(labelsize=6)
    ax.set_title(f"{episode['task']} episode {episode['episode']}: end-effector path")
    ax.legend(fontsize=7)
    ax2 = fig.add_subplot(1, 2, 2)
    # markers as well as a line: the cost switch computes F only where it can change the decision
    ax2.plot(metric, color="k", lw=1, marker=".", ms=3)
    ax2.scatter(np.flatnonzero(retrieval), np.asarray(metric)[retrieval], color="tab:orange", s=10)
    threshold = full[-1]["config"]["switch_threshold"]
    if threshold is not None:
        ax2.axhline(threshold, color="r", ls="--", lw=1)
    ax2.set_xlabel("control step")
    ax2.set_ylabel("kinematic metric F[w]")
    ax2.set_xlim(-0.5, len(metric) - 0.5)  # every step, with F or not
    known = int(np.isfinite(metric).sum())
    ax2.set_title(f"F over time (orange: retrieval mode; F on {known} of {len(metric)} steps)", fontsize=9)
    return _save(fig, out / "heisd_episode_modes.png")
