"""The profile as a table: one row per piece, with its cost in decode steps."""

from __future__ import annotations

from typing import Any


def rows(pieces: dict[str, Any]) -> list[tuple[str, dict[str, float]]]:
    """(name, timing) in the order of a control step, one row per tree size."""
    out = [(name, pieces[name]) for name in ("vision", "prefill", "fused_prefill", "decode_step") if name in pieces]
    out += [(f"tree_verify_{n}", t) for n, t in pieces.get("tree_verify", {}).items()]
    out += [(name, pieces[name]) for name in ("drafter_pass", "drafter_proposal", "datastore_query",
                                              "retrieval_proposal", "ar_step") if name in pieces]
    return out


def format_table(result: dict[str, Any]) -> str:
    pieces = result["pieces_ms"]
    step = pieces["decode_step"]["median_ms"]
    head = (f"{result['target']} on {result['device_name']} ({result['dtype']}, prefix {result['prefix_len']} tokens, "
            f"median of {result['repeats']} after {result['warmup']} warm-up runs"
            f"{f', the pieces taking {rounds} turns' if (rounds := result.get('rounds', 1)) > 1 else ''})")
    table = rows(pieces)
    gpu = all("kernel_ms" in t for _, t in table)  # `heisd profile --device-work`
    extra = (" GPU kernel ms | GPU kernels |", "---|---|") if gpu else ("", "")
    lines = [head, "", "| piece | median ms | p10 ms | p90 ms | decode steps |" + extra[0],
             "|---|---|---|---|---|" + extra[1]]
    for name, t in table:
        cells = f" {t['kernel_ms']:.2f} | {t['device_ops']:.0f} |" if gpu else ""
        lines.append(f"| {name} | {t['median_ms']:.2f} | {t['p10_ms']:.2f} | {t['p90_ms']:.2f} | "
                     f"{t['median_ms'] / step:.2f} |{cells}")
    if gpu:
        lines += ["", "GPU kernel ms: time the GPU spent in the piece's kernels and copies per call (torch.profiler); "
                      "far below the median, the piece is bound by the host launching its kernels."]
    return "\n".join(lines)
