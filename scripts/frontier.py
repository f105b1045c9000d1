"""The success-speed frontier of acceptance tolerances from `heisd bench` runs (BENCHMARKS section 11).

    python scripts/frontier.py outputs/tolerance/seed0 --out docs/frontier

For every configuration of each bench folder: its tolerance (`--tolerance` syntax), success rate with
the episode count, the episodes it lost and won against AR of the same run (same layouts), the
speedup (ratio to AR's median latency in that run), target passes per step, acceptance length
and skip rate. Writes
`frontier.md` (the table) and `frontier.png` (success vs speedup; a point per configuration).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path


def episodes(folder: Path) -> dict[tuple[str, int], bool]:
    rows = [json.loads(line) for line in (folder / "episodes.jsonl").read_text().splitlines() if line.strip()]
    return {(r["task"], r["episode"]): bool(r["success"]) for r in rows}


def rows_of(bench: Path) -> list[dict]:
    summaries = json.loads((bench / "bench.json").read_text())
    ar = episodes(bench / summaries[0]["dir"])
    rows = []
    for s in summaries[1:]:
        if s["config"]["method"] not in ("retrieval", "heisd"):
            continue
        mine = episodes(bench / s["dir"])
        common = ar.keys() & mine.keys()
        config = s["config"]
        lossless = config["lossless"] or not config["group_acceptance"]
        rows.append(dict(
            run=bench.name, method=s["method"], tolerance="exact" if lossless else config.get("tolerance", "paper"),
            sr=s["sr"], episodes=s["episodes"], speedup=s["speedup"], al=s["acceptance_length"],
            skip=s["skip_rate"], prefill=s["prefill_skip_rate"], fwd=s["target_forwards"],
            fwd_ratio=summaries[0]["target_forwards"] / s["target_forwards"],
            lost=sum(ar[k] and not mine[k] for k in common), won=sum(mine[k] and not ar[k] for k in common),
        ))
    return rows


def table(rows: list[dict]) -> str:
    out = ["| run | configuration | tolerance | SR (episodes) | lost / won vs AR | speedup | target fwd / step "
           "| AL | skip rate (prefill) |", "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        out.append(f"| {r['run']} | {r['method']} | `{r['tolerance']}` | {100 * r['sr']:.1f}% ({r['episodes']}) | "
                   f"{r['lost']} / {r['won']} | {r['speedup']:.2f}x | {r['fwd']:.2f} | {r['al']:.2f} | {r['skip']:.2f} ({r['prefill']:.2f}) |")
    return "\n".join(out) + "\n"


def plot(rows: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    # latency speedups move with the machine's load; target passes per step (AR: one per token) do not
    fig, axes = plt.subplots(1, 2, figsize=(13, 4.8), sharey=True)
    markers = "osD^vP*Xh<>p"
    for ax, key, xlabel in ((axes[0], "speedup", "speedup vs AR (median latency, same run)"),
                            (axes[1], "fwd_ratio", "AR's target passes per step / the configuration's")):
        for i, r in enumerate(rows):
            ax.scatter(r[key], 100 * r["sr"], s=55, marker=markers[i % len(markers)], color=f"C{i % 10}", alpha=0.85,
                       label=f"{r['run']}: {r['method']}  {r['speedup']:.2f}x, {100 * r['sr']:.1f}% "
                             f"(lost {r['lost']}, won {r['won']})")
        ax.axhline(100, color="0.6", lw=0.8, ls=":")
        ax.set_xlabel(xlabel)
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("success rate (%)")
    fig.suptitle("acceptance tolerances: success vs speed")
    axes[1].legend(fontsize=6.5, loc="center left", bbox_to_anchor=(1.01, 0.5), frameon=False)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("benches", nargs="+", type=Path, help="`heisd bench` output folders (each with bench.json)")
    p.add_argument("--out", type=Path, required=True, help="folder for frontier.md and frontier.png")
    args = p.parse_args()
    for bench in args.benches:
        if not (bench / "bench.json").is_file():
            raise SystemExit(f"{bench}: no bench.json (not a finished `heisd bench` folder)")
    rows = [r for bench in args.benches for r in rows_of(bench)]
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "frontier.md").write_text(table(rows))
    plot(rows, args.out / "frontier.png")
    print(table(rows))


if __name__ == "__main__":
    main()
