"""CUDA graphs: a fixed-shape GPU computation recorded once and replayed with a single launch.

At batch 1 a transformer's forward is a long series of small kernels, each launched from Python;
on a fast GPU the host launching them, not the GPU running them, sets the time (BENCHMARKS 19.1).
A captured graph replays the same kernels on the same tensors, so its inputs are copied into
fixed buffers and its outputs read (or cloned) before the next replay.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

_captures = 0  # graphs captured in this process (`captures`)


def captures() -> int:
    """Graphs captured in this process so far: a timing that spans a capture measured it, not the work
    (the cost rule learns nothing from such a turn)."""
    return _captures


def capture(run: Callable[[], Any], pool: Any, reset: Callable[[], None] | None = None) -> tuple[torch.cuda.CUDAGraph, Any]:
    """(the graph of ``run()``, the outputs it writes on each replay). ``run`` is warmed up twice on a
    side stream first, as capture requires; ``reset`` undoes the state a run changes (a KV cache's
    write position), after each warm-up and after the capture. Graphs sharing ``pool`` share memory:
    replay them one at a time and read a graph's outputs before replaying another."""
    global _captures
    _captures += 1
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(2):
            run()
            if reset is not None:
                reset()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, pool=pool):
        outputs = run()
    if reset is not None:
        reset()
    return graph, outputs


class GraphedCall:
    """``fn(x)`` on device tensors: each input shape captured the first time it comes, replayed after.
    For inference (no autograd); returns a fresh tensor each call."""

    def __init__(self, fn: Callable[[torch.Tensor], torch.Tensor]):
        self.fn = fn
        self._pool = torch.cuda.graph_pool_handle()
        self._graphs: dict[tuple, tuple[torch.cuda.CUDAGraph, torch.Tensor, torch.Tensor]] = {}

    @torch.no_grad()
    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        key = (tuple(x.shape), x.dtype, x.device)
        if key not in self._graphs:
            buffer = x.clone()
            graph, out = capture(lambda: self.fn(buffer), self._pool)
            self._graphs[key] = (graph, buffer, out)
        graph, buffer, out = self._graphs[key]
        buffer.copy_(x)
        graph.replay()
        return out.clone()


def require_cuda(device: torch.device, what: str) -> None:
    """CUDA graphs need a CUDA device; anything else is a configuration error."""
    from heisd.errors import ConfigError

    if device.type != "cuda":
        raise ConfigError(f"CUDA graphs (--cuda-graphs) need {what} on a CUDA device (--device cuda); it is on {device}")
