"""Draft trees as flat arrays: what a proposer hands to the verifier.

A tree hangs below a *root*: the last emitted token, which the target has not yet
processed. Node ``i`` holds one draft token; ``parents[i] == -1`` makes it a child of
the root. Nodes are in topological order (``parents[i] < i``), so one forward sweep
over the arrays visits every parent before its children (EAGLE keeps tree shapes as
data in the same way). A group-wise tree (retrieval, docs/design.md §2.3) is just a token tree
whose branching happens at group boundaries.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import torch


@dataclass(frozen=True)
class DraftTree:
    tokens: torch.Tensor  # LongTensor [N]: the draft token of each node
    parents: torch.Tensor  # LongTensor [N]: parent node index, -1 = child of the root
    depth: torch.Tensor = field(init=False)  # LongTensor [N]: 1 for children of the root

    def __post_init__(self) -> None:
        # Trees are small bookkeeping arrays: kept on the CPU whatever device proposed them.
        tokens, parents = self.tokens.cpu(), self.parents.cpu()
        object.__setattr__(self, "tokens", tokens)
        object.__setattr__(self, "parents", parents)
        if tokens.dim() != 1 or parents.dim() != 1:
            raise ValueError(f"tokens and parents must be 1-D, got {tuple(tokens.shape)} and {tuple(parents.shape)}")
        if len(tokens) != len(parents):
            raise ValueError(f"tokens ({len(tokens)}) and parents ({len(parents)}) differ in length")
        if tokens.dtype != torch.long or parents.dtype != torch.long:
            raise ValueError("tokens and parents must be LongTensors")
        if (tokens < 0).any():
            raise ValueError("draft tokens must be non-negative ids")
        index = torch.arange(len(parents))
        bad = (parents < -1) | (parents >= index)
        if bad.any():
            i = int(bad.nonzero()[0])
            raise ValueError(
                f"node {i} has parent {int(parents[i])}: parents must be -1 (root) or an earlier node index"
            )
        depth = [0] * len(parents)
        for i, p in enumerate(parents.tolist()):
            depth[i] = 1 if p < 0 else depth[p] + 1
        object.__setattr__(self, "depth", torch.tensor(depth, dtype=torch.long))

    def __len__(self) -> int:
        return len(self.tokens)

    @classmethod
    def empty(cls) -> DraftTree:
        """No draft: verifying it is a plain autoregressive step."""
        return cls(torch.zeros(0, dtype=torch.long), torch.zeros(0, dtype=torch.long))

    @classmethod
    def chain(cls, tokens: Sequence[int]) -> DraftTree:
        n = len(tokens)
        return cls(torch.tensor(list(tokens), dtype=torch.long).reshape(n), torch.arange(n) - 1)

    @classmethod
    def from_sequences(cls, sequences: Sequence[Sequence[int]]) -> DraftTree:
        """Prefix trie of the sequences: equal prefixes share nodes (deduplication)."""
        tokens: list[int] = []
        parents: list[int] = []
        children: dict[tuple[int, int], int] = {}  # (parent node, token) -> node
        for seq in sequences:
            node = -1
            for tok in seq:
                key = (node, int(tok))
                if key not in children:
                    children[key] = len(tokens)
                    tokens.append(int(tok))
                    parents.append(node)
                node = children[key]
        return cls(torch.tensor(tokens, dtype=torch.long), torch.tensor(parents, dtype=torch.long))

    @property
    def max_depth(self) -> int:
        return int(self.depth.max()) if len(self) else 0

    def is_chain(self) -> bool:
        return bool((self.parents == torch.arange(len(self)) - 1).all())

    def path(self, node: int) -> list[int]:
        """Node indices from the root's child down to ``node`` (inclusive)."""
        out = []
        parents = self.parents.tolist()
        while node >= 0:
            out.append(node)
            node = parents[node]
        return out[::-1]

    def truncated(self, max_depth: int) -> DraftTree:
        """Drop nodes deeper than ``max_depth`` (drafts running past the action's end)."""
        keep = (self.depth <= max_depth).nonzero().flatten()
        if len(keep) == len(self):
            return self
        new_index = torch.full((len(self),), -1, dtype=torch.long)
        new_index[keep] = torch.arange(len(keep))
        old_parents = self.parents[keep]
        parents = torch.where(old_parents < 0, old_parents, new_index[old_parents.clamp(min=0)])
        return DraftTree(self.tokens[keep], parents)

    def ancestor_mask(self) -> torch.Tensor:
        """Bool [N+1, N+1] over slots (0 = root, i+1 = node i): True where column is an ancestor-or-self of row."""
        n = len(self)
        mask = torch.zeros(n + 1, n + 1, dtype=torch.bool)
        mask[0, 0] = True
        for i, p in enumerate(self.parents.tolist()):
            mask[i + 1] = mask[p + 1]  # the parent's ancestors (p = -1 -> the root row)
            mask[i + 1, i + 1] = True
        return mask
