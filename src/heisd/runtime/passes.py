"""What one control step did, pass by pass, in the terms a projection prices (docs/design.md §5.3).

A step is the prefill (or none: a prefill skip) and its verify passes; a fused step's first
verify pass rode in its prefill pass (retrieval's first tree, `Verifier.prefill_verify`). A pass is priced by the
draft tokens it verified and the drafter passes its proposal ran: 0 for retrieval's group trees,
Jacobi chains and plain AR passes; for a drafter tree one per level, min(depth, tokens left),
as `DrafterProposer` runs them. In retrieval mode the step's last passes may be the fallback's,
which took over with `tokens_left` tokens to emit. A recorded step holds the one fallback that
ran; an option record (`heisd bench --record-options`) holds every fallback's passes on the same
frame, so `heisd project` can re-decide which one runs.

Torch-free: `heisd project` reads these from episodes.jsonl.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

Pass = tuple[int, int]  # (draft tokens the pass verified, drafter passes its proposal ran)


@dataclass(frozen=True)
class StepPasses:
    prefill: bool  # the target ran (False: a prefill skip, no target pass at all)
    head: tuple[Pass, ...]  # verify passes before the fallback took over (all of them if it never did)
    tokens_left: int = 0  # tokens the fallback had to emit (0: it never took over)
    fallbacks: Mapping[str, tuple[Pass, ...]] = field(default_factory=dict)  # per fallback option: its passes
    fused: bool = False  # head[0] was verified inside the prefill pass (no target pass of its own)

    def passes(self, fallback: str | None) -> tuple[Pass, ...]:
        """The step's verify passes with `fallback` finishing it (None or no fallback needed: the head)."""
        if not self.tokens_left or fallback is None:
            return self.head
        if fallback not in self.fallbacks:
            raise ValueError(f"no passes recorded for the {fallback!r} fallback (have: {', '.join(self.fallbacks)})")
        return self.head + self.fallbacks[fallback]

    def to_json(self) -> dict[str, Any]:
        return {"prefill": self.prefill, "head": [list(p) for p in self.head], "tokens_left": self.tokens_left,
                "fallbacks": {k: [list(p) for p in v] for k, v in self.fallbacks.items()}, "fused": self.fused}

    @classmethod
    def from_json(cls, record: Mapping[str, Any]) -> StepPasses:
        def passes(rows) -> tuple[Pass, ...]:
            return tuple((int(n), int(d)) for n, d in rows)

        return cls(bool(record["prefill"]), passes(record["head"]), int(record.get("tokens_left", 0)),
                   {k: passes(v) for k, v in record.get("fallbacks", {}).items()}, bool(record.get("fused", False)))


def pass_costs(accepted: Sequence[int], depths: Sequence[int], sizes: Sequence[int], drafted: Sequence[bool],
               tree_depth: int, n_tokens: int, cost_tree: bool = False, fused: bool = False) -> list[Pass]:
    """(nodes, drafter passes) per verify pass. `drafted[i]`: pass i checked a drafter tree. A
    drafter tree of depth 1 under `cost_tree` is the rule's one-pass tree; any other ran
    min(tree_depth, tokens left) drafter passes, whatever depth the kept nodes reach. `fused`: the
    first pass is the prefill's (nothing emitted before it)."""
    out, emitted = [], 0 if fused else 1  # a plain prefill emitted the first token
    for a, d, n, by_drafter in zip(accepted, depths, sizes, drafted, strict=True):
        levels = 0 if not (by_drafter and d) else 1 if (cost_tree and d == 1) else min(tree_depth, n_tokens - emitted)
        out.append((int(n), int(levels)))
        emitted += int(a) + 1
    return out


def split_step(mode: str, forwards: int, accepted: Sequence[int], depths: Sequence[int],
               sizes: Sequence[int] | None, fallback: tuple[int, int] | None, fallback_option: str | None,
               config: Mapping[str, Any], n_tokens: int) -> StepPasses:
    """A decoded step (a `DecodeResult`'s or an episodes.jsonl step's numbers) as `StepPasses`.

    `fallback`: (the fallback's passes, the tokens it emitted), None for a run recorded before
    heisd kept it (then a retrieval step's first pass is taken as its tree and the rest as the
    fallback's). `sizes`: draft tokens per pass, None for such a run (then estimated: the
    configured tree budgets, a Jacobi chain as deep as it is long). `fallback_option`: the
    fallback that ran (a drafter fallback's passes run the drafter)."""
    verifies = len(accepted)
    fused = forwards > 0 and verifies == forwards  # the prefill pass verified the first tree
    if (verifies != max(forwards - 1, 0) and not fused) or len(depths) != verifies:
        raise ValueError(f"a step with {forwards} target passes lists {verifies} accepted and {len(depths)} depths")
    if fallback is None:  # older runs: the first pass was retrieval's tree, the rest the fallback's
        tail = max(verifies - 1, 0) if mode == "retrieval" else 0
        fallback = (tail, n_tokens - (not fused) - sum(a + 1 for a in accepted[: verifies - tail]) if tail else 0)
    tail, tokens_left = (fallback if mode == "retrieval" else (0, 0))
    by_drafter = [_drafter_made(mode, i >= verifies - tail, fallback_option, config) for i in range(verifies)]
    if sizes is None:
        sizes = [_estimated_size(mode, d, i >= verifies - tail, drafter, fallback_option, config)
                 for i, (d, drafter) in enumerate(zip(depths, by_drafter, strict=True))]
    passes = pass_costs(accepted, depths, sizes, by_drafter, int(config["tree_depth"]), n_tokens,
                        config.get("drafter_tree") == "cost", fused)
    head, rest = tuple(passes[: verifies - tail]), tuple(passes[verifies - tail :])
    option = fallback_option or str(config.get("retrieval_fallback", "ar"))
    return StepPasses(forwards > 0, head, tokens_left if tail else 0, {option: rest} if tail else {}, fused)


def _drafter_made(mode: str, in_fallback: bool, fallback_option: str | None, config: Mapping[str, Any]) -> bool:
    if mode == "drafter":
        return config["method"] != "ar"  # AR's passes are plain (depth 0) anyway
    return mode == "retrieval" and in_fallback and fallback_option == "drafter"


def _estimated_size(mode: str, depth: int, in_fallback: bool, drafter: bool, fallback_option: str | None,
                    config: Mapping[str, Any]) -> int:
    if depth == 0:
        return 0
    if drafter:
        return int(config["tree_budget"])
    if mode == "jacobi" or (in_fallback and fallback_option == "jacobi"):
        return depth  # a chain
    return int(config["retrieval_budget"])
