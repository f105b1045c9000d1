"""The verifier on a static KV cache, its passes replayed as CUDA graphs.

At batch 1 a 7B target's pass is bound by the host launching its kernels, not by the GPU
(BENCHMARKS 19.1: 1,466 kernels, 6.5 ms of GPU time in a 19.1 ms decode step). A CUDA graph
launches a whole pass at once, but it replays fixed tensors: the KV cache must not move
(transformers' `StaticCache`, one per verifier, written in place), the inputs go through
fixed buffers, and a graph is captured per pass shape (query rows and which rows reach the
lm_head), the first time that shape runs. The mask covers every cache column, so rows past the
cache's length (a rolled-back pass, a rejected branch) are never seen.

Without ``graphs`` (or off CUDA) the same static-cache passes run eagerly, which is how the
CPU tests check this path against the dynamic-cache `Verifier`, token for token.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import cast

import torch
from transformers import Cache, PreTrainedModel, StaticCache
from transformers.cache_utils import StaticLayer

from heisd.cuda_graphs import capture, require_cuda
from heisd.decoding.tree import DraftTree
from heisd.decoding.verifier import Prefill, Verifier
from heisd.errors import ConfigError

_ROUND = 128  # cache lengths are multiples of this (fewer reallocations, aligned columns)

Outputs = tuple[torch.Tensor, torch.Tensor, torch.Tensor]  # lm_head inputs, greedy tokens, top-2 logits


@dataclass
class _Graph:
    """One captured pass shape: the buffers it reads and the outputs it writes."""

    graph: torch.cuda.CUDAGraph
    inputs: torch.Tensor  # ids [1, q] or embeddings [1, q, d]
    positions: torch.Tensor  # [1, q]
    mask: torch.Tensor  # [1, 1, q, max_len]
    outputs: Outputs


class StaticVerifier(Verifier):
    """`Verifier` on one preallocated KV cache; with ``graphs`` each pass shape is a CUDA graph.

    The verifier owns the cache: a prefill empties it, so one decode runs at a time (the decode
    loop and the server's single model worker do). ``headroom``: positions kept free after a
    prefix for the action and a pass's draft tree; the cache grows (and its graphs are captured
    again) when a pass needs more.
    """

    def __init__(self, model: PreTrainedModel, graphs: bool = False, headroom: int = 384):
        super().__init__(model)
        if graphs:
            require_cuda(self.device, "the target")
        if headroom < 1:
            raise ConfigError(f"headroom must be >= 1 position, got {headroom}")
        self.graphs, self.headroom = graphs, headroom
        self.max_len = 0
        self._cache: StaticCache | None = None
        self._length = 0  # positions the cache holds (the host's count: reading the device's would sync)
        self._captured: dict[tuple[bool, int, int], _Graph] = {}
        self._pool = torch.cuda.graph_pool_handle() if graphs else None

    @property
    def captured(self) -> int:
        """Pass shapes captured as CUDA graphs so far (each capture costs about a pass)."""
        return len(self._captured)

    @torch.no_grad()
    def prefill(self, prefix_embeds: torch.Tensor, label: str = "its prefill pass") -> Prefill:
        # a prefill is a fused prefill with an empty tree: the same pass shape, so the same graph
        return self.prefill_verify(prefix_embeds, DraftTree.empty(), label)[0]

    def _new_cache(self) -> Cache:
        cache = self._cache if self._cache is not None else self._allocate(0)
        self._set_length(0)  # the prefill's pass grows the cache if its prefix does not fit
        return cache

    def cache_length(self, cache: Cache) -> int:
        self._check_own(cache)
        return self._length

    def rollback(self, cache: Cache, n: int) -> None:
        self._check_own(cache)
        if not 0 <= n <= self._length:
            raise ValueError(f"cannot roll back {n} of the cache's {self._length} positions")
        self._set_length(self._length - n)

    def _kv_length(self, length: int) -> int:
        return self.max_len if length <= self.max_len else _round_up(length + self.headroom)

    def _forward(self, cache, inputs, embeds, mask, positions, kept, margins):
        self._check_own(cache)
        q = inputs.shape[1]
        if self._length + q > self.max_len:  # the mask was built for the grown cache (`_kv_length`)
            self._grow(self._length + q)
        if not self.graphs:
            hidden, tokens, top = self._run(
                inputs.to(self.device), positions.to(self.device), mask.to(self.device), kept
            )
        else:
            graph = self._graph(embeds, inputs, kept)
            graph.inputs.copy_(inputs)
            graph.positions.copy_(positions)
            graph.mask.copy_(mask)
            graph.graph.replay()
            hidden, tokens, top = graph.outputs
            hidden = hidden.clone()  # the next replay writes over the graph's outputs
        self._length += q
        tokens, top = tokens.cpu(), top.float().cpu()
        return hidden, tokens, top if margins else top[:, :1]

    def _run(self, inputs: torch.Tensor, positions: torch.Tensor, mask: torch.Tensor, kept: int) -> Outputs:
        """One pass over the static cache: the lm_head inputs of rows ``kept:``, their greedy tokens and
        top-2 logits, all on the device (a graph's outputs must be tensors it wrote)."""
        embeds = inputs.is_floating_point()
        out = self.decoder(
            **{"inputs_embeds" if embeds else "input_ids": inputs},
            attention_mask=mask,
            position_ids=positions,
            cache=self._cache,
            use_cache=True,
        )
        hidden = out.last_hidden_state[0, kept:]
        logits = self.lm_head(hidden)
        return hidden, logits.argmax(-1), logits.topk(2, dim=-1).values

    def _graph(self, embeds: bool, inputs: torch.Tensor, kept: int) -> _Graph:
        key = (embeds, inputs.shape[1], kept)
        if key not in self._captured:
            self._captured[key] = self._capture(inputs, kept)
        return self._captured[key]

    def _capture(self, like: torch.Tensor, kept: int) -> _Graph:
        q = like.shape[1]
        inputs = torch.zeros_like(like, device=self.device)
        positions = torch.arange(q, device=self.device)[None] + self._length
        mask = torch.zeros(1, 1, q, self.max_len, dtype=self.model.dtype, device=self.device)
        # the warm-up runs write rows past the cache's length (masked, overwritten later) and advance
        # the layers' write position, which is put back
        length = self._length
        graph, outputs = capture(
            lambda: self._run(inputs, positions, mask, kept), self._pool, lambda: self._set_length(length)
        )
        return _Graph(graph, inputs, positions, mask, outputs)

    def _allocate(self, need: int) -> StaticCache:
        self.max_len = _round_up(need + self.headroom)
        self._cache = StaticCache(config=self.model.config, max_cache_len=self.max_len)
        return self._cache

    def _grow(self, need: int) -> None:
        """Longer tensors for the same cache (a longer prefix, or a tree bigger than the headroom),
        holding its positions; graphs read the old tensors, so they are captured again."""
        self.max_len = _round_up(need + self.headroom)
        for layer in self._layers():
            layer.max_cache_len = self.max_len
            if layer.is_initialized:
                keys, values = layer.keys, layer.values
                assert keys is not None and values is not None  # initialized
                layer.lazy_initialization(keys, values)  # allocates at the new length
                cast(torch.Tensor, layer.keys)[:, :, : self._length] = keys[:, :, : self._length]
                cast(torch.Tensor, layer.values)[:, :, : self._length] = values[:, :, : self._length]
        self._captured.clear()

    def _set_length(self, length: int) -> None:
        self._length = length
        assert self._cache is not None
        set_write_position(self._cache, length)

    def _layers(self) -> list[StaticLayer]:
        assert self._cache is not None
        return [cast(StaticLayer, layer) for layer in self._cache.layers]  # what StaticCache builds for a Llama

    def _check_own(self, cache: Cache) -> None:
        if cache is not self._cache:
            raise ValueError("a StaticVerifier runs passes on the cache of its own latest prefill only")


def set_write_position(cache: StaticCache, length: int) -> None:
    """`cache` holds ``length`` positions: the next pass writes its rows from there."""
    for layer in cache.layers:
        cast(StaticLayer, layer).cumulative_length.fill_(length)  # in place: graphs captured it at its address


def _round_up(n: int) -> int:
    return -(-n // _ROUND) * _ROUND


def make_verifier(target, cuda_graphs: bool = False) -> Verifier:
    """The verifier a method runs over `target` (a `heisd.targets.Target`): the dynamic-cache one, or
    with ``cuda_graphs`` the static-cache one replaying CUDA graphs, and the target's vision replayed
    as graphs too (the target must be on a CUDA device)."""
    if not cuda_graphs:
        return Verifier(target.llm)
    verifier = StaticVerifier(target.llm, graphs=True)
    target.use_cuda_graphs()
    return verifier
