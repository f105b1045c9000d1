"""Drafter-based proposals (SpecVLA baseline): an EAGLE-2-style dynamic draft tree.

The drafter's context is the action part only: pairs (prefill_hidden, emitted[0]),
(hidden that predicted emitted[1], emitted[1]), ... It is recomputed each call (at most
n_tokens positions, no cache kept between calls); the tree is then grown with ONE drafter
pass per depth over the frontier, on a per-call KV cache and a tree mask.

Dynamic selection (EAGLE-2): each of the ``topk`` best frontier nodes gets its ``topk``
best action tokens as children; the ``topk`` best children by cumulative drafter
log-probability form the next frontier; finally the ``budget`` best nodes of all
expanded candidates make the tree. A child never outscores its parent (log-probs are
<= 0), so the best-first set is closed under ancestors.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from heisd.decoding import DecodeState, DraftTree, Outcome, Proposal, Proposer
from heisd.decoding.cost_rule import CostChoice, OptionCosts
from heisd.drafter.config import TreeConfig
from heisd.drafter.model import Drafter
from heisd.drafter.passes import DrafterPasses, StaticDrafterPasses


@dataclass
class DrafterStepStats:
    choices: list[CostChoice] = field(default_factory=list)  # the tree rule's choices this step (cost rule only)


class DrafterProposer(Proposer):
    """`choose_tree`: per proposal, the configured tree or a one-pass tree (depth 1, its top-k
    children), whichever the shared cost rule expects to cost fewer ms per emitted token.
    `cuda_graphs`: the drafter's passes replay CUDA graphs on a static cache (`StaticDrafterPasses`)
    sized for `n_tokens` of action context and the tree's frontier rows."""

    def __init__(self, drafter: Drafter, tree: TreeConfig | None = None, choose_tree: bool = False,
                 cuda_graphs: bool = False, n_tokens: int = 0):
        self.drafter = drafter.eval()
        self.tree = tree or TreeConfig()
        if self.tree.topk > drafter.config.n_bins:
            raise ValueError(f"topk {self.tree.topk} exceeds the {drafter.config.n_bins} action tokens")
        if cuda_graphs and n_tokens < 1:
            raise ValueError("a graphed drafter needs n_tokens, the action's token count (its cache's size)")
        self.passes = (StaticDrafterPasses(drafter, n_tokens + self.tree.topk * (self.tree.depth - 1), graphs=True)
                       if cuda_graphs else DrafterPasses(drafter))
        self.shapes = {"configured": self.tree}
        if choose_tree:
            self.shapes["depth-1"] = TreeConfig(self.tree.topk, 1, min(self.tree.topk, self.tree.budget))
        self.tree_costs = OptionCosts("tree", list(self.shapes)) if choose_tree else None  # the tree rule
        self._features: dict[int, torch.Tensor] = {}  # this step: action position -> target feature that predicted it
        self._verified = False  # the pass of our latest tree is done (that tree's turn can close)
        self._n_tokens = 0
        self._stats = DrafterStepStats()

    def begin_step(self, context: dict) -> None:
        self._features, self._verified, self._stats = {}, False, DrafterStepStats()
        if self.tree_costs is not None:
            self.tree_costs.drop_turn()

    def end_step(self) -> DrafterStepStats:
        self._close_turn(self._n_tokens)  # the step ends with all its tokens out
        return self._stats

    def reset(self) -> None:
        self._features, self._verified = {}, False
        if self.tree_costs is not None:
            self.tree_costs.drop_turn()

    def observe(self, outcome: Outcome) -> None:
        self._verified = len(outcome.tree) > 0  # an empty tree: the AR pass we left the step to

    def _close_turn(self, emitted: int) -> None:
        if self.tree_costs is not None and self.tree_costs.turn_open:
            self._stats.choices.append(self.tree_costs.close_turn(emitted))

    def _context(self, state: DecodeState) -> torch.Tensor | None:
        """[k, d] target features of the k emitted tokens, or None where some are unknown.

        ``state.hidden`` holds only the latest pass, so features are remembered across the
        calls of one action (`begin_step` forgets them). After a verify-skip the target has not seen the skipped tokens:
        their features do not exist yet and no draft is made (the loop takes an AR step).
        """
        self._features.setdefault(0, state.prefill_hidden)
        k, m = len(state.emitted), len(state.hidden)
        for j in range(m):
            self._features[k - m + j] = state.hidden[j]
        if any(i not in self._features for i in range(k)):
            return None
        return torch.stack([self._features[i] for i in range(k)])

    def propose(self, state: DecodeState) -> Proposal | None:
        shape = self.tree
        if self.tree_costs is not None:
            if self._verified:  # the previous turn (one pass of our tree) ends here
                self._close_turn(len(state.emitted))
            self.tree_costs.drop_turn()
            self._n_tokens = state.n_tokens
            shape = self.shapes[self.tree_costs.open_turn(len(state.emitted))]
            self.tree_costs.count_pass()
        proposal = self._propose(state, shape)
        self._verified = False
        if proposal is None and self.tree_costs is not None:
            self.tree_costs.drop_turn()  # an AR pass: not the shape's
        return proposal

    @torch.inference_mode()
    def _propose(self, state: DecodeState, shape: TreeConfig) -> Proposal | None:
        context = self._context(state)
        k = len(state.emitted)
        depth = min(shape.depth, state.n_tokens - k)
        if context is None or depth < 1:
            return None
        d, topk, passes = self.drafter, shape.topk, self.passes
        device = passes.device
        passes.start()
        out = passes.run(context.to(device)[None], torch.tensor([state.emitted], device=device),
                         torch.arange(k, device=device)[None], torch.ones(k, k, dtype=torch.bool).tril())
        logp = d.action_logits(out[-1:]).log_softmax(-1)[0]
        score, index = logp.topk(topk)
        # every candidate: bin index, parent candidate (-1 = root), score; frontier rows feed the drafter
        bins, parents, scores = index.tolist(), [-1] * topk, score.tolist()
        frontier, frontier_score = list(range(topk)), score
        inputs = out[-1:].expand(topk, -1)  # feature that predicted each frontier token
        ancestors: dict[int, list[int]] = {-1: []}  # candidate -> cache slots of its fed ancestors-or-self
        for level in range(1, depth):
            past, q = passes.length, len(frontier)
            for row, c in enumerate(frontier):
                ancestors[c] = ancestors[parents[c]] + [past + row]
            allowed = torch.zeros(q, past + q, dtype=torch.bool)
            allowed[:, :k] = True
            allowed[[row for row, c in enumerate(frontier) for _ in ancestors[c]],
                    [slot for c in frontier for slot in ancestors[c]]] = True
            tokens = torch.tensor([[bins[c] + d.first_action_id for c in frontier]], device=device)
            positions = torch.full_like(tokens, k - 1 + level)
            out = passes.run(inputs[None], tokens, positions, allowed)
            cum = frontier_score[:, None] + d.action_logits(out).log_softmax(-1)
            child_score, child_bin = cum.topk(topk, dim=-1)  # [frontier, topk]
            first = len(bins)
            bins += child_bin.flatten().tolist()
            scores += child_score.flatten().tolist()
            parents += [c for c in frontier for _ in range(topk)]
            frontier_score, best = child_score.flatten().topk(topk)
            frontier = (first + best).tolist()
            inputs = out[best // topk]
        return Proposal(self._select(bins, parents, scores, d.first_action_id, shape.budget))

    @staticmethod
    def _select(bins: list[int], parents: list[int], scores: list[float], first_id: int, budget: int) -> DraftTree:
        # Best-first with ties broken toward shallower, earlier candidates, so a parent always
        # precedes its children; candidate order is topological, so sorting the kept ones keeps it so.
        depth = [0] * len(bins)
        for i, p in enumerate(parents):
            depth[i] = 1 if p < 0 else depth[p] + 1
        order = sorted(range(len(bins)), key=lambda i: (-scores[i], depth[i], i))
        kept = sorted(order[:budget])
        new_index = {old: new for new, old in enumerate(kept)}
        return DraftTree(
            torch.tensor([bins[i] + first_id for i in kept], dtype=torch.long),
            torch.tensor([new_index[parents[i]] if parents[i] >= 0 else -1 for i in kept], dtype=torch.long),
        )
