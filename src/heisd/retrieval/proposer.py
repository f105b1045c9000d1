"""Retrieval-based drafts (docs/design.md §2.3): Top-K demonstration entries -> a sequence-wise group tree.

Per control step, the first `first_draft` or `propose` call queries the datastore with the current image
feature and hands back one tree whose nodes are whole action groups (xyz | g | xyz' | g').
The loop verifies it once. After a rejected group (the verify pass emitted the target's own
token there), a later call of the same step first drafts the rest from the step's retrieved
sequences that agree with everything emitted so far (`continue_drafts`, ours: no new query,
no draft model); when none agrees it goes to the fallback proposer (the drafter; None = plain
AR; or `CostFallback`, the cheapest of several), as in HeiSD. The loop's `begin_step` marks each new control step.

Where drafts start. With the fused prefill (opt-in), the step's first tree covers the whole
action and the prefill pass verifies it (`first_draft`); its first token must equal the target's
own (the acceptance rules keep position 0 exact, as the paper's prefill emits it), and when it
does not, the tree the paper's order verifies first follows (`_retry_first`). In the paper's
order (`fused_prefill=False`), the prefill already emitted the target's free greedy first token
(emitted[0], the first position of group 0), so drafts cover positions `state.position`..n-1:
group 0 enters the tree cut to its remaining positions (y z), and the acceptance rule starts a
fresh segment at the root's children, so the cut group is judged on y z alone.
A retrieved sequence whose own tokens at the emitted positions disagree with them (beyond
the acceptance rule's per-token bound) most likely continues another motion: such results
are dropped when at least one consistent result exists, kept otherwise (their later groups
may still be right, and the target's token is already emitted either way).
"""

from __future__ import annotations

import heapq
import itertools
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np
import torch

from heisd.decoding import ActionVocab, DecodeState, DraftTree, Outcome, Proposal, Proposer
from heisd.decoding.cost_rule import CostChoice
from heisd.retrieval.config import RetrievalConfig
from heisd.retrieval.datastore import Datastore, RetrievalResult

if TYPE_CHECKING:
    from heisd.retrieval.verify_skip import PrefillSkip, VerifySkip


def group_tree(
    sequences: np.ndarray,
    weights: np.ndarray,
    start: int,
    groups: Sequence[Sequence[int]],
    exact_groups: Sequence[int],
    budget: int,
) -> DraftTree:
    """Sequence-wise group tree over `sequences` [M, n] (best first) for positions start..n-1.

    A node is one distinct value of one group (deduplicated: equal values vote with their
    summed `weights`). Below any node, the next non-exact group may take its value from ANY
    sequence (groups combine at boundaries); an exact (gripper) group only takes values of
    the sequences that produced its parent group, so a gripper stays with its own result.
    The best sequence's own path goes in first (whole groups, as far as the budget allows);
    then nodes are added by estimated path probability (product of vote shares) while their
    new tokens fit the budget. Groups sharing leading tokens share trie nodes.
    """
    segments = [(g, [p for p in group if p >= start]) for g, group in enumerate(groups)]
    segments = [(g, pos) for g, pos in segments if pos]
    exact = {level for level, (g, _) in enumerate(segments) if g in set(exact_groups)}
    w = [float(x) for x in weights]
    values = [[tuple(row) for row in np.asarray(sequences)[:, pos].tolist()] for _, pos in segments]

    def options(level: int, allowed: Sequence[int]) -> list[tuple[tuple[int, ...], list[int], float]]:
        """(distinct value, sequences holding it, vote share) among `allowed`, best-ranked first."""
        members: dict[tuple[int, ...], list[int]] = {}
        for j in allowed:
            members.setdefault(values[level][j], []).append(j)
        total = sum(w[j] for j in allowed)
        return [(v, m, sum(w[j] for j in m) / total) for v, m in members.items()]

    everyone = list(range(len(sequences)))
    free = {level: options(level, everyone) for level in range(len(segments)) if level not in exact}
    tokens: list[int] = []
    parents: list[int] = []
    trie: dict[tuple[int, int], int] = {}  # (parent node, token) -> node
    # (off the best path, -probability, insertion order, level, value, supporting sequences, trie node)
    heap: list[tuple[bool, float, int, int, tuple[int, ...], list[int], int]] = []
    order = itertools.count()  # ties: first pushed (better-ranked) first

    def push_children(level: int, support: list[int], prob: float, node: int, on_best: bool) -> None:
        if level == len(segments):
            return
        for value, members, share in options(level, support) if level in exact else free[level]:
            heapq.heappush(
                heap, (not (on_best and members[0] == 0), -prob * share, next(order), level, value, members, node)
            )

    push_children(0, everyone, 1.0, -1, True)
    while heap and len(tokens) < budget:
        off_best, neg_prob, _, level, value, members, node = heapq.heappop(heap)
        if len(tokens) + _new_tokens(trie, node, value) > budget:
            continue  # a shorter group (a gripper) may still fit
        for tok in value:
            if (node, tok) not in trie:
                trie[(node, tok)] = len(tokens)
                tokens.append(tok)
                parents.append(node)
            node = trie[(node, tok)]
        push_children(level + 1, members, -neg_prob, node, not off_best)
    return DraftTree(torch.tensor(tokens, dtype=torch.long), torch.tensor(parents, dtype=torch.long))


def _new_tokens(trie: dict[tuple[int, int], int], node: int, value: tuple[int, ...]) -> int:
    """Tokens of `value` not yet in the trie below `node` (a shared prefix costs nothing)."""
    for i, tok in enumerate(value):
        if (node, tok) not in trie:
            return len(value) - i
        node = trie[(node, tok)]
    return 0


@dataclass
class RetrievalStepStats:
    """What retrieval did in one control step (`DecodeResult.proposer_stats`)."""

    retrieval_ms: float = 0.0  # datastore query
    tree_ms: float = 0.0  # candidate filtering + tree building (+ the verify-skip test)
    top1_similarity: float = float("nan")  # key cosine similarity of the best entry
    fell_back: bool = False  # the task had no collection: the global one was searched
    collection: str = ""
    n_results: int = 0
    tree_nodes: int = 0  # draft tokens proposed (0: no retrieval proposal this step)
    skipped: bool = False  # the draft was accepted with no verify pass
    prefill_skipped: bool = False  # ... and with no prefill either (the target did not run)
    hidden_similarity: float | None = None  # verify-skip's cosine similarity (None: skip off)
    continuations: int = 0  # later trees of this step drawn from the agreeing retrieved sequences
    first_retry: bool = False  # the fused tree kept nothing: the paper's first tree was drawn after it
    gripper_veto: bool = False  # the guard refused a skip (the draft moves the gripper, or no previous action)
    choices: list[CostChoice] = field(default_factory=list)  # the fallback's cost-rule choices this step
    fallback_from: int | None = None  # tokens emitted when the fallback took over (None: it never did)
    fallback_passes: int = 0  # verify passes of the fallback's proposals (the step's last ones)


class RetrievalProposer(Proposer):
    """Drafts from the datastore on the first call of each control step, then delegates.

    Needs `context["key"]` (np.float32 [Dk], the pooled vision feature) and `context["task"]`
    (str or None). A task without a collection of its own searches the global collection
    (`RetrievalStepStats.fell_back`); an empty result proposes nothing beyond what the fallback
    proposes. With `verify_skip`, a confident top-1 draft skips the verify; with `prefill_skip`,
    one whose image key is close enough skips the target altogether (the query then runs in
    `begin_step`, before the prefill, and the step's first proposal reuses it).
    """

    def __init__(
        self,
        datastore: Datastore,
        config: RetrievalConfig,
        fallback: Proposer | None = None,
        *,
        vocab: ActionVocab,
        verify_skip: VerifySkip | None = None,
        prefill_skip: PrefillSkip | None = None,
    ) -> None:
        if config.n_tokens != datastore.manifest["n_tokens"]:
            raise ValueError(
                f"groups cover {config.n_tokens} tokens, datastore entries hold {datastore.manifest['n_tokens']}"
            )
        self.datastore, self.config, self.fallback = datastore, config, fallback
        self.vocab, self.verify_skip, self.prefill_skip = vocab, verify_skip, prefill_skip
        self._bound = config.token_bounds()
        self._grippers = sorted(p for g in config.exact_groups for p in config.groups[g])
        self._reset_step({})

    def _reset_step(self, context: dict) -> None:
        self._context = context  # this step's query key and task
        self._result: RetrievalResult | None = None  # this step's Top-K, once queried
        self._drafted = False  # the step's first tree was proposed: later calls continue or fall back
        self._missed_first = False  # the fused tree kept no token (its first token was not the target's)
        self._delegated = False  # the latest proposal was the fallback's (its outcome is the fallback's)
        self._step_sequences: np.ndarray | None = None  # this step's retrieved draft sequences
        self._stats = RetrievalStepStats()

    def reset(self) -> None:
        self._reset_step({})
        if self.fallback is not None:
            self.fallback.reset()

    def begin_step(self, context: dict) -> list[int] | None:
        self._reset_step(context)
        if self.fallback is not None:
            self.fallback.begin_step(context)  # a fallback never skips the prefill for us
        if self.prefill_skip is None:
            return None
        result = self._query()
        if not len(result):
            return None
        self._stats.top1_similarity = float(result.similarities[0])
        tokens = self.prefill_skip.tokens(result.similarities[0], self.config.sequences(result)[0], self.vocab)
        if tokens is not None and not self._keeps_gripper(tokens):
            tokens, self._stats.gripper_veto = None, True
        if tokens is not None:
            self._stats.skipped = self._stats.prefill_skipped = True
        return tokens

    def first_draft(self, context: dict) -> DraftTree | None:
        """With `config.fused_prefill`: the step's first tree, over the whole action, for the prefill
        pass to verify (the key comes from the vision pass, so the draft is ready before the target
        runs). None when fusion is off or nothing was retrieved: the prefill runs alone."""
        if not self.config.fused_prefill or self._drafted:
            return None
        result = self._result if self._result is not None else self._query()
        if not len(result):
            return None
        self._drafted = True
        proposal = self._first_tree(0, [], result)
        return proposal.tree if proposal is not None else None

    def end_step(self) -> RetrievalStepStats:
        if self.fallback is not None:  # it may time its own turns up to here
            self._stats.choices = list(getattr(self.fallback.end_step(), "choices", []))
        return self._stats

    def observe(self, outcome: Outcome) -> None:
        if self._delegated and self.fallback is not None:
            self.fallback.observe(outcome)
        elif outcome.position == 0 and not outcome.accepted:
            self._missed_first = True

    def propose(self, state: DecodeState) -> Proposal | None:
        self._delegated = False
        if self._drafted:
            proposal = self._retry_first(state) if self._missed_first else self._continuation(state)
            if proposal is not None:
                return proposal
            return self._fall_back(state)
        self._drafted = True
        result = self._result if self._result is not None else self._query()
        if not len(result):  # nothing retrieved: this step is the fallback's
            return self._fall_back(state)
        proposal = self._first_tree(state.position, state.emitted, result, state)
        return proposal if proposal is not None else self._fall_back(state)

    def _first_tree(
        self, position: int, emitted: list[int], result: RetrievalResult, state: DecodeState | None = None
    ) -> Proposal | None:
        """The step's first proposal from its Top-K (timed): a verify-skip where `state` (the prefill
        done) allows one, else the group tree of the results that agree with what was emitted."""
        stats = self._stats
        t1 = time.perf_counter()
        stats.top1_similarity = float(result.similarities[0])
        sequences = self._step_sequences = self.config.sequences(result)
        proposal = self._verify_skip(state, result, sequences) if state is not None else None
        if proposal is None:
            proposal = self._consistent_tree(position, emitted, sequences)
            stats.tree_nodes = len(proposal.tree) if proposal is not None else 0
        stats.tree_ms = (time.perf_counter() - t1) * 1e3
        return proposal

    def _fall_back(self, state: DecodeState) -> Proposal | None:
        self._delegated = True
        stats = self._stats  # a fallback proposal is never skipped: each is one verify pass
        stats.fallback_from = len(state.emitted) if stats.fallback_from is None else stats.fallback_from
        stats.fallback_passes += 1
        return self.fallback.propose(state) if self.fallback is not None else None

    def _query(self) -> RetrievalResult:
        """This step's Top-K, timed."""
        if "key" not in self._context:
            raise ValueError("RetrievalProposer needs context['key'] (the pooled vision feature) in begin_step")
        stats = self._stats
        t0 = time.perf_counter()
        result = self._result = self.datastore.query(self._context["key"], self._context.get("task"), self.config.k)
        stats.retrieval_ms = (time.perf_counter() - t0) * 1e3
        stats.fell_back, stats.collection, stats.n_results = result.fell_back, result.collection, len(result)
        return result

    def _verify_skip(self, state: DecodeState, result: RetrievalResult, sequences: np.ndarray) -> Proposal | None:
        """The paper's adaptive verify-skip of the top-1 draft (None: verify it)."""
        if self.verify_skip is None:
            return None
        stats = self._stats
        skip = self.verify_skip.proposal(state, result.hidden[0], sequences[0], self.vocab)
        stats.hidden_similarity = self.verify_skip.last_similarity
        if skip is not None and not self._keeps_gripper(sequences[0]):
            skip, stats.gripper_veto = None, True
        if skip is not None:
            stats.skipped = True
            stats.tree_nodes = len(skip.tree)
        return skip

    def _keeps_gripper(self, sequence: Sequence[int]) -> bool:
        return self.keeps_gripper(sequence, self._context.get("previous_action"))

    def keeps_gripper(self, sequence: Sequence[int], previous: Sequence[int] | None) -> bool:
        """Safe skips: a draft accepted unverified must leave the gripper as the previous action
        left it (open or closed, the sign of the normalized value); a change is verified instead.
        The first step of an episode has no previous action and is never skipped."""
        if not self.config.gripper_guard or not self._grippers:
            return True
        if previous is None:
            return False
        closed = lambda token: self.vocab.bin(int(token)) >= self.vocab.n_bins // 2  # noqa: E731
        state = closed(previous[self._grippers[-1]])
        return all(closed(sequence[p]) == state for p in self._grippers)

    def _retry_first(self, state: DecodeState) -> Proposal | None:
        """The fused tree kept nothing, so the first token is now the target's own: the tree the paper's
        order would have verified first (the results agreeing with that token), continuation or not."""
        self._missed_first = False
        if self._step_sequences is None:
            return None
        proposal = self._consistent_tree(state.position, state.emitted, self._step_sequences)
        self._stats.first_retry = proposal is not None
        return proposal

    def _continuation(self, state: DecodeState) -> Proposal | None:
        """After a rejection: a tree from the step's sequences that agree with all emitted tokens."""
        if not self.config.continue_drafts or self._step_sequences is None:
            return None
        agree = self._agreeing(self._step_sequences, state.emitted)
        proposal = self._tree(state.position, self._step_sequences[agree]) if agree.any() else None
        if proposal is not None:
            self._stats.continuations += 1
        return proposal

    def _consistent_tree(self, position: int, emitted: list[int], sequences: np.ndarray) -> Proposal | None:
        """The tree of the results that agree with the emitted tokens, or of all of them when none does."""
        agree = self._agreeing(sequences, emitted)
        return self._tree(position, sequences[agree if agree.any() else slice(None)])

    def _tree(self, position: int, sequences: np.ndarray) -> Proposal | None:
        weights = self.config.rank_decay ** np.arange(len(sequences), dtype=np.float64)
        tree = group_tree(
            sequences, weights, position, self.config.groups, self.config.exact_groups, self.config.node_budget
        )
        return Proposal(tree) if len(tree) else None

    def _agreeing(self, sequences: np.ndarray, emitted: Sequence[int]) -> np.ndarray:
        """Mask of the sequences whose tokens at the emitted positions agree with the emitted ones
        (within the acceptance rule's per-token bound; exactly for grippers and non-action tokens)."""
        ok = np.ones(len(sequences), dtype=bool)
        for p, tok in enumerate(emitted):
            if not self.vocab.is_action(tok):
                ok &= sequences[:, p] == tok
                continue
            column = sequences[:, p].astype(np.int64)
            ok &= self.vocab.is_action(column) & (
                np.abs(self.vocab.bin(column) - self.vocab.bin(tok)) <= self._bound[p]
            )
        return ok
