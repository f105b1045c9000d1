"""One decode loop for every method: AR, drafter SD, retrieval SD, HeiSD.

AR is this loop with no proposer (each step verifies an empty tree); the methods differ
only in the proposer and the acceptance rule they plug in (docs/design.md §2.1).
"""

from __future__ import annotations

import time
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any

import torch
from transformers import Cache

from heisd.decoding.acceptance import AcceptanceRule, ActionVocab, ExactAcceptance
from heisd.decoding.tree import DraftTree
from heisd.decoding.verifier import Verification, Verifier

METRIC = "metric"  # context key: the kinematic metric F of this step, read by phase-aware acceptance rules


@dataclass(frozen=True)
class DecodeConfig:
    n_tokens: int  # action tokens per inference (the target's; mw: 2 actions x (dx dy dz grip))
    vocab_size: int  # base vocab size; action tokens are its last n_bins ids
    n_bins: int  # action bins per dimension

    def __post_init__(self) -> None:
        if self.n_tokens < 1:
            raise ValueError(f"n_tokens must be >= 1, got {self.n_tokens}")
        if not 0 < self.n_bins <= self.vocab_size:
            raise ValueError(f"need 0 < n_bins <= vocab_size, got {self.n_bins}, {self.vocab_size}")


@dataclass(frozen=True)
class Proposal:
    tree: DraftTree  # drafts for the positions after the last emitted token
    skip_verify: bool = False  # accept the tree (a chain) with no verify pass: adaptive verify-skip


@dataclass
class DecodeState:
    """What a proposer sees before each step. Treat verifier and cache as read-only."""

    emitted: list[int]  # action tokens emitted so far (the last one is the tree's root)
    n_tokens: int  # tokens in the whole action
    hidden: torch.Tensor  # [m, d] target lm_head inputs of the latest pass; row j predicted emitted[j - m]
    prefill_hidden: torch.Tensor  # [d] lm_head input at the last prefix position
    verifier: Verifier
    cache: Cache
    context: dict[str, Any]  # per-step info from the caller (e.g. the current image feature)

    @property
    def position(self) -> int:
        """Action position of the first draft token (children of the root)."""
        return len(self.emitted)


@dataclass(frozen=True)
class Outcome:
    """What the target's verify pass made of the latest proposal (`Proposer.observe`)."""

    tree: DraftTree  # the tree that was verified (empty for a plain AR pass)
    target_next: torch.Tensor  # the target's greedy token after each node, root first (`Verification.tree_next`)
    accepted: list[int]  # accepted node indices, root to leaf
    position: int  # action position of the tree's first draft token


class Proposer(ABC):
    """Where drafts come from. ``None`` means: take a plain AR step.

    The loop brackets every control step: ``begin_step`` before anything runs, ``propose``
    any number of times, ``end_step`` once the action is out (its stats land in the result).
    After each verify pass the loop calls ``observe`` with the outcome of what ``propose`` last
    returned (a ``None`` proposal: a plain AR pass); a proposer that delegates passes it on to
    the one that made the proposal, so each learns only from its own drafts.
    """

    @abstractmethod
    def propose(self, state: DecodeState) -> Proposal | None: ...

    def observe(self, outcome: Outcome) -> None:
        """The verify pass of this proposer's latest proposal is done (default: nothing to learn)."""

    def first_draft(self, context: dict[str, Any]) -> DraftTree | None:
        """A draft of the whole action from its first token, known before the target runs (after
        `begin_step`): the loop verifies it inside the prefill pass (`Verifier.prefill_verify`), so
        it costs no target pass of its own. None (the default): a plain prefill, then `propose`."""
        return None

    def begin_step(self, context: dict[str, Any]) -> list[int] | None:
        """A new control step: forget the last step's state. May return a whole action to emit
        with no target forward at all (prefill skip); None lets the step run the target."""
        return None

    def end_step(self) -> Any:
        """What this proposer did in the step just decoded (`DecodeResult.proposer_stats`), or None."""
        return None

    def reset(self) -> None:
        """Forget per-episode state."""


@dataclass
class Timing:
    prefill_ms: float = 0.0
    draft_ms: float = 0.0  # inside proposer.propose
    verify_ms: float = 0.0  # target tree passes
    other_ms: float = 0.0  # acceptance, KV compaction, bookkeeping


@dataclass
class _Passes:
    """Per verify pass of one control step: accepted draft tokens, tree depth and size; summed deviation."""

    accepted: list[int] = field(default_factory=list)
    depths: list[int] = field(default_factory=list)
    sizes: list[int] = field(default_factory=list)
    deviation: int = 0

    def add(self, tree: DraftTree, accepted: int, deviation: int) -> None:
        self.accepted.append(accepted)
        self.depths.append(int(tree.depth.max()) if len(tree) else 0)
        self.sizes.append(len(tree))
        self.deviation += deviation


@dataclass
class DecodeResult:
    tokens: list[int]  # exactly n_tokens
    target_forwards: int  # prefill included (AR: n_tokens; 0 when the step skipped the prefill)
    accepted_lengths: list[int]  # accepted draft tokens per verify pass (0 for an AR step)
    draft_depths: list[int]  # depth of the tree each verify pass checked (0: a plain AR pass)
    skipped_tokens: int  # tokens accepted with no verify pass
    deviation: int  # summed bin deviation of accepted drafts from the target's greedy tokens
    timing: Timing = field(default_factory=Timing)
    proposer_stats: Any = None  # the proposer's `end_step()` for this step (e.g. RetrievalStepStats)
    draft_sizes: list[int] = field(default_factory=list)  # draft tokens each verify pass checked (0: a plain AR pass)

    @property
    def tokens_per_forward(self) -> float:
        """Action tokens per target forward, the prefill included (docs/design.md §4.1); a step with
        no forward counts n, like a skip."""
        return len(self.tokens) / self.target_forwards if self.target_forwards else float(len(self.tokens))


class SpeculativeDecoder:
    def __init__(
        self,
        verifier: Verifier,
        config: DecodeConfig,
        proposer: Proposer | None = None,
        acceptance: AcceptanceRule | None = None,
    ):
        self.verifier, self.config, self.proposer = verifier, config, proposer
        self.acceptance = acceptance or ExactAcceptance()
        self.acceptance.check(config.n_tokens)
        self.vocab = ActionVocab(config.vocab_size, config.n_bins)

    def reset(self) -> None:
        if self.proposer is not None:
            self.proposer.reset()

    def _now(self) -> float:
        if self.verifier.device.type == "cuda":  # time GPU work, not its launch
            torch.cuda.synchronize()
        return time.perf_counter()

    def decode(self, prefix_embeds: torch.Tensor, context: dict[str, Any] | None = None) -> DecodeResult:
        """Greedy-decode one action of ``n_tokens`` tokens after ``prefix_embeds`` [1, P, d]."""
        n, timing, context = self.config.n_tokens, Timing(), context if context is not None else {}
        start = self._now()
        early = self.proposer.begin_step(context) if self.proposer is not None else None
        if early is not None and self.proposer is not None:
            self._check_skip(DraftTree.chain(early))
            if len(early) != n:
                raise ValueError(f"a prefill skip must be a whole action of {n} tokens, got {len(early)}")
            timing.draft_ms = (self._now() - start) * 1e3
            return DecodeResult(list(early), 0, [], [], n, 0, timing, self.proposer.end_step())
        first = self.proposer.first_draft(context) if self.proposer is not None else None
        first = first.truncated(n) if first is not None and len(first) else None
        t = self._now()
        timing.draft_ms = (t - start) * 1e3  # a prefill skip that did not fire, the first draft
        passes = _Passes()
        if first is None:
            pre = self.verifier.prefill(prefix_embeds, "target pass 1 (prefill)")
            emitted, pending, hidden = [pre.token], [pre.token], pre.hidden[None]
        else:  # the prefill pass verifies the first draft too: its root is the last prefix position
            pre, verification = self.verifier.prefill_verify(
                prefix_embeds, first, "target pass 1 (prefill + verify)", margins=self.acceptance.needs_margins
            )
            emitted, hidden = self._accept(first, verification, pre.cache, [], 1, context, passes)
            pending = [emitted[-1]]
        timing.prefill_ms = (self._now() - t) * 1e3
        forwards, skipped = 1, 0
        while len(emitted) < n:
            t = self._now()
            proposal = None
            if self.proposer is not None:
                state = DecodeState(list(emitted), n, hidden, pre.hidden, self.verifier, pre.cache, context)
                proposal = self.proposer.propose(state)
            timing.draft_ms += (self._now() - t) * 1e3
            tree = proposal.tree.truncated(n - len(emitted)) if proposal else DraftTree.empty()
            if proposal is not None and proposal.skip_verify:
                self._check_skip(tree)
                emitted += tree.tokens.tolist()
                pending += tree.tokens.tolist()
                hidden = hidden[:0]  # the target has not seen these tokens
                skipped += len(tree)
                continue
            t = self._now()
            verification = self.verifier.verify(
                pre.cache,
                pending,
                tree,
                f"target pass {forwards + 1} (verify)",
                margins=self.acceptance.needs_margins and len(tree) > 0,
            )
            timing.verify_ms += (self._now() - t) * 1e3
            forwards += 1
            emitted, hidden = self._accept(tree, verification, pre.cache, emitted, len(pending), context, passes)
            pending = [emitted[-1]]
        stats = self.proposer.end_step() if self.proposer is not None else None
        total_ms = (self._now() - start) * 1e3
        timing.other_ms = total_ms - timing.prefill_ms - timing.draft_ms - timing.verify_ms
        return DecodeResult(
            emitted[:n],
            forwards,
            passes.accepted,
            passes.depths,
            skipped,
            passes.deviation,
            timing,
            stats,
            passes.sizes,
        )

    def _accept(
        self,
        tree: DraftTree,
        verification: Verification,
        cache: Cache,
        emitted: list[int],
        n_pending: int,
        context: dict[str, Any],
        passes: _Passes,
    ) -> tuple[list[int], torch.Tensor]:
        """What a verify pass over `tree` (drafts from position len(emitted)) makes of it: the emitted
        tokens after it (accepted drafts, then the target's bonus token) and the lm_head inputs of the
        pass's kept rows (its roots, then the accepted path); the cache keeps the same rows."""
        acc = self.acceptance.select(
            tree, verification.tree_next, len(emitted), self.vocab, verification.tree_margins, context.get(METRIC)
        )
        if self.proposer is not None:  # truncation keeps node order: indices are the proposal's too
            self.proposer.observe(Outcome(tree, verification.tree_next, list(acc.nodes), len(emitted)))
        self.verifier.commit(cache, verification, acc.nodes)
        slots = list(range(n_pending)) + [n_pending + i for i in acc.nodes]
        passes.add(tree, len(acc.nodes), acc.deviation)
        return emitted + acc.tokens + [acc.bonus], verification.hidden[slots]

    def _check_skip(self, tree: DraftTree) -> None:
        # A skipped draft is accepted blindly, so it must be a plain sequence of action tokens.
        if len(tree) == 0 or not tree.is_chain():
            raise ValueError("a skip_verify proposal must be a non-empty chain")
        if not all(self.vocab.is_action(t) for t in tree.tokens.tolist()):
            raise ValueError("a skip_verify proposal may hold action tokens only")
