"""Timing one piece of work: warm-up runs, then the median of N, with the GPU synchronized."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import asdict, dataclass

import numpy as np
import torch


@dataclass(frozen=True)
class Timing:
    median_ms: float  # median over the timed runs
    p10_ms: float  # 10th percentile
    p90_ms: float  # 90th percentile
    runs: int  # timed runs (after warm-up)

    def to_dict(self) -> dict[str, float | int]:
        return asdict(self)


def _sync(device: torch.device) -> None:
    if device.type == "cuda":  # time the GPU work, not its launch
        torch.cuda.synchronize(device)


def measure(work: Callable[[], object], device: torch.device, repeats: int, warmup: int,
            after: Callable[[object], None] | None = None) -> Timing:
    """Time `work()`; `after(result)` runs untimed after each call (e.g. roll a KV cache back)."""
    if repeats < 1 or warmup < 0:
        raise ValueError(f"need repeats >= 1 and warmup >= 0, got {repeats}, {warmup}")
    times = []
    for i in range(warmup + repeats):
        _sync(device)
        start = time.perf_counter()
        result = work()
        _sync(device)
        if i >= warmup:
            times.append((time.perf_counter() - start) * 1e3)
        if after is not None:
            after(result)
    t = np.asarray(times)
    return Timing(float(np.median(t)), float(np.percentile(t, 10)), float(np.percentile(t, 90)), len(t))
