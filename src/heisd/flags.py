"""Flag checks run before any command does work, with messages that name the flag as typed.

The rules are keyed by argparse `dest`, which means one thing in every command that has it
(`--episodes` is a count of episodes wherever it appears), so each rule is written once and
applies to every command with that flag. A command checks what needs its own context (e.g.
`--execute` against the target's action chunk) in its `run`.
"""

from __future__ import annotations

import argparse
import math
from pathlib import Path
from typing import Any, Callable

from heisd.errors import UsageError

Rule = tuple[Callable[[Any], bool], str]  # (predicate on one value, what it must be)

_AT_LEAST_1: Rule = (lambda v: v >= 1, "must be >= 1")
_AT_LEAST_0: Rule = (lambda v: v >= 0, "must be >= 0")
_FINITE_AT_LEAST_0: Rule = (lambda v: math.isfinite(v) and v >= 0, "must be a finite number >= 0")

RULES: dict[str, Rule] = {
    **dict.fromkeys(("episodes", "frames", "steps", "batch_size", "threads", "workers", "k", "tree_topk",
                     "tree_depth", "tree_budget", "retrieval_k", "retrieval_budget", "eval_every", "save_every",
                     "max_steps", "max_frames", "hidden_size", "layers", "image_size", "shards", "repeats",
                     "tree_sizes", "pq_nbits", "nprobe", "reduce_dim", "rerank"), _AT_LEAST_1),
    **dict.fromkeys(("seed", "execute", "relaxed_r", "warmup_steps", "warmup", "ray_workers", "ivf_nlist", "pq_m"),
                    _AT_LEAST_0),
    **dict.fromkeys(("noise", "feature_weight", "gpus_per_worker", "token_weight", "switch_threshold", "thresholds"),
                    _FINITE_AT_LEAST_0),
    "lr": (lambda v: math.isfinite(v) and v > 0, "must be a finite number > 0"),
    "precision": (lambda v: 0 < v <= 1, "must be in (0, 1]"),
    "val_fraction": (lambda v: 0 <= v < 1, "must be in [0, 1)"),
}


def flag_name(parser: argparse.ArgumentParser, dest: str) -> str:
    """The long option string of `dest` in `parser` (what the user typed), else the dest."""
    for action in parser._actions:
        if action.dest == dest and action.option_strings:
            return max(action.option_strings, key=len)
    return dest


def check_args(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """Raise `UsageError` for the first flag value outside its rule, or a bad `--demos` list."""
    for dest, value in vars(args).items():
        if dest in RULES and value is not None:
            ok, must = RULES[dest]
            for v in value if isinstance(value, list) else [value]:
                if not ok(v):
                    raise UsageError(f"{flag_name(parser, dest)} {must}, got {v}")
    if getattr(args, "demos", None):
        _check_demo_files(flag_name(parser, "demos"), args.demos)


def _check_demo_files(flag: str, paths: list) -> None:
    """Each file exists and is listed once (twice would weigh its episodes double)."""
    seen: dict[Path, str] = {}
    for p in paths:
        path = Path(p)
        if not path.is_file():
            raise UsageError(f"{flag} {p}: no such file")
        key = path.resolve()
        if key in seen:
            raise UsageError(f"{flag} lists the same file twice ({seen[key]} and {p})")
        seen[key] = str(p)
