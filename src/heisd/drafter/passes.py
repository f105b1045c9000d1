"""The drafter's passes within one proposal, on a KV cache that lives for that proposal.

`DrafterPasses` runs them eagerly on a `DynamicCache`. `StaticDrafterPasses` runs them on one
preallocated `StaticCache`, and with ``graphs`` replays each pass shape (its query rows) as a CUDA
graph: a drafter pass is one decoder layer, about 60 kernels whose launches cost four times their
GPU time at batch 1 (BENCHMARKS 19.3: 0.9 ms a pass, 0.2 ms of kernels). The mask covers every
cache column, so the rows of an earlier proposal, past the current length, are never seen.
Without ``graphs`` the static passes run eagerly, which is how the CPU tests check them against
the dynamic ones, draft for draft.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from transformers import DynamicCache, StaticCache

from heisd.cuda_graphs import capture, require_cuda
from heisd.decoding.graphs import set_write_position
from heisd.drafter.model import Drafter, additive_mask


class DrafterPasses:
    """Eager passes on a fresh `DynamicCache` per proposal."""

    def __init__(self, drafter: Drafter):
        self.drafter = drafter
        self.device = drafter.fc.weight.device
        self._cache: DynamicCache | None = None

    def start(self) -> None:
        """An empty cache for a new proposal."""
        self._cache = DynamicCache()

    @property
    def length(self) -> int:
        """Positions the proposal's cache holds."""
        assert self._cache is not None, "start() first"
        return self._cache.get_seq_length()

    def run(self, features: torch.Tensor, tokens: torch.Tensor, positions: torch.Tensor,
            allowed: torch.Tensor) -> torch.Tensor:
        """One pass over q rows: features [1, q, d], tokens and positions [1, q] (on the drafter's device),
        `allowed` bool [q, length + q] (which cached and new rows each row sees) -> outputs [q, d]."""
        mask = additive_mask(allowed).to(self.device)
        return self.drafter(features, tokens, positions, mask, self._cache)[0]


@dataclass
class _Graph:
    graph: torch.cuda.CUDAGraph
    features: torch.Tensor  # [1, q, d]
    tokens: torch.Tensor  # [1, q]
    positions: torch.Tensor  # [1, q]
    mask: torch.Tensor  # [1, 1, q, max_len]
    out: torch.Tensor  # [q, d]


class StaticDrafterPasses(DrafterPasses):
    """Passes on one preallocated cache of ``max_len`` positions (a proposal's context and its tree's
    frontier rows must fit); with ``graphs`` each pass shape is a CUDA graph, captured the first time."""

    def __init__(self, drafter: Drafter, max_len: int, graphs: bool = False):
        super().__init__(drafter)
        if graphs:
            require_cuda(self.device, "the drafter")
        self.max_len, self.graphs = max_len, graphs
        config = drafter.config.llama_config()
        config.num_hidden_layers = 1  # the drafter's one layer: no cache layers for 31 more
        self._static = StaticCache(config=config, max_cache_len=max_len)
        self._length = 0
        self._captured: dict[int, _Graph] = {}
        self._pool = torch.cuda.graph_pool_handle() if graphs else None

    def start(self) -> None:
        self._set_length(0)

    @property
    def length(self) -> int:
        return self._length

    def run(self, features: torch.Tensor, tokens: torch.Tensor, positions: torch.Tensor,
            allowed: torch.Tensor) -> torch.Tensor:
        q = tokens.shape[1]
        if self._length + q > self.max_len:
            raise ValueError(f"a drafter pass of {q} rows after {self._length} does not fit the cache's "
                             f"{self.max_len} positions")
        full = torch.zeros(q, self.max_len, dtype=torch.bool)
        full[:, : allowed.shape[1]] = allowed
        mask = additive_mask(full)
        if not self.graphs:
            out = self._pass(features, tokens, positions, mask.to(self.device))
        else:
            graph = self._captured.get(q) or self._capture(features, tokens, positions, mask)
            graph.features.copy_(features)
            graph.tokens.copy_(tokens)
            graph.positions.copy_(positions)
            graph.mask.copy_(mask)
            graph.graph.replay()
            out = graph.out.clone()  # the next replay writes over the graph's output
        self._length += q
        return out

    def _pass(self, features, tokens, positions, mask) -> torch.Tensor:
        return self.drafter(features, tokens, positions, mask, self._static)[0]

    def _capture(self, features, tokens, positions, mask) -> _Graph:
        buffers = [torch.zeros_like(t, device=self.device) for t in (features, tokens, positions, mask)]
        length = self._length  # the warm-up runs advance the write position, which is put back
        graph, out = capture(lambda: self._pass(*buffers), self._pool, lambda: self._set_length(length))
        self._captured[tokens.shape[1]] = _Graph(graph, *buffers, out)
        return self._captured[tokens.shape[1]]

    def _set_length(self, length: int) -> None:
        self._length = length
        set_write_position(self._static, length)
