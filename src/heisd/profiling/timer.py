"""Timing one piece of work: warm-up runs, then the median of N, with the GPU synchronized; on CUDA,
also what each piece asks of the GPU (`device_work`)."""

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


Piece = tuple[Callable[[], object], Callable[[object], None] | None]  # (work, untimed `after(result)`)


def measure(work: Callable[[], object], device: torch.device, repeats: int, warmup: int,
            after: Callable[[object], None] | None = None) -> Timing:
    """Time `work()`; `after(result)` runs untimed after each call (e.g. roll a KV cache back)."""
    return measure_rounds({"work": (work, after)}, device, repeats, warmup)["work"]


def measure_rounds(pieces: dict[str, Piece], device: torch.device, repeats: int, warmup: int,
                   rounds: int = 1) -> dict[str, Timing]:
    """Time several pieces, each in a tight loop (warm, as consecutive passes of a step are), in
    `rounds` turns: per turn each piece runs its share of the `repeats`, after one untimed run
    (and `warmup` of them in the first turn). On a shared machine a change in load then hits
    every piece alike, and their ratios hold; `rounds=1` times each piece once, start to end."""
    if repeats < 1 or warmup < 0 or not 1 <= rounds <= repeats:
        raise ValueError(f"need repeats >= 1, warmup >= 0 and 1 <= rounds <= repeats, "
                         f"got {repeats}, {warmup}, {rounds}")
    times: dict[str, list[float]] = {name: [] for name in pieces}
    for r in range(rounds):
        share = repeats // rounds + (r < repeats % rounds)
        untimed = warmup if r == 0 else 1  # the other pieces ran in between: one run to warm up again
        for name, (work, after) in pieces.items():
            for i in range(untimed + share):
                _sync(device)
                start = time.perf_counter()
                result = work()
                _sync(device)
                if i >= untimed:
                    times[name].append((time.perf_counter() - start) * 1e3)
                if after is not None:
                    after(result)
    return {name: _timing(t) for name, t in times.items()}


def _timing(times: list[float]) -> Timing:
    t = np.asarray(times)
    return Timing(float(np.median(t)), float(np.percentile(t, 10)), float(np.percentile(t, 90)), len(t))


@dataclass(frozen=True)
class DeviceWork:
    kernel_ms: float  # GPU time in kernels and copies, per call
    device_ops: float  # kernels and copies run on the GPU, per call

    def to_dict(self) -> dict[str, float]:
        return asdict(self)


def device_work(pieces: dict[str, Piece], device: torch.device, calls: int = 5) -> dict[str, DeviceWork]:
    """Each piece's GPU kernel time and kernel count per call, read with torch.profiler over `calls`
    calls (run after the timing: the pieces are warm). Beside the wall-clock median it says what
    bounds a piece: kernel time far below the wall time means the GPU waits on the host launching
    the kernels one by one. CUDA only: other devices keep no kernel records."""
    if device.type != "cuda":
        raise ValueError(f"GPU kernel time is read from CUDA's kernel records; the device is {device}")
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    out = {}
    for name, (work, after) in pieces.items():
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            for _ in range(calls):
                result = work()
                _sync(device)
                if after is not None:
                    after(result)
        # the kernel records alone: the CPU op that launched a kernel reports its time again
        kernels = [e for e in prof.events() if e.device_type == DeviceType.CUDA]
        busy_us = sum(e.self_device_time_total for e in kernels)
        out[name] = DeviceWork(busy_us / 1e3 / calls, len(kernels) / calls)
    return out
