"""Offline replay: decode held-out demonstration frames with a method and with plain AR.

Deterministic and render-free, it measures decoding alone: how far the method's tokens are
from the target's own greedy AR tokens on the same inputs, and what the method costs.
Frames are taken every `chunk` steps (the closed-loop inference cadence), whole episodes at a
time so the kinematic metric sees real trajectories, tasks interleaved.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from heisd.errors import InputError
from heisd.runtime.metrics import decoding_metrics, episode_steps, latency_stats
from heisd.runtime.policy import VLAPolicy
from heisd.storage import OutputKind
from heisd.storage.guard import has_file

REPLAY_FILE = "replay.json"
REPLAY_RUN = OutputKind("replay", has_file(REPLAY_FILE), files=(REPLAY_FILE,))


def replay_frames(paths: list[str | Path], frames: int, stride: int):
    """Yield (episode, t, is_first) over interleaved episodes until `frames` frames."""
    from heisd.data.dataset import DemoFile

    episodes = []
    for path in paths:
        with DemoFile(path) as f:
            episodes += list(f)
    by_task: dict[str, list] = {}
    for ep in episodes:
        by_task.setdefault(ep.task, []).append(ep)
    order = [eps[i] for i in range(max(map(len, by_task.values()), default=0))
             for eps in by_task.values() if i < len(eps)]
    n = 0
    for ep in order:
        for t in range(0, len(ep), stride):
            if n >= frames:
                return
            yield ep, t, t == 0
            n += 1


def replay(policy: VLAPolicy, reference: VLAPolicy, method_label: str, paths: list[str | Path],
           frames: int, progress: bool = True) -> dict:
    from tqdm import tqdm

    tokenizer = policy.target.action_tokenizer
    stride = policy.target.spec.chunk
    rows, ar_latencies = [], []
    for ep, t, first in tqdm(replay_frames(paths, frames, stride), total=frames, desc=f"replay {method_label}",
                             unit="frame", disable=not progress):
        if first:
            policy.reset(ep.instruction, ep.task)
            reference.reset(ep.instruction, ep.task)
        moved = ep.ee_pos[max(t - stride + 1, 0) : t + 1]  # every env step since the last frame
        _, rec = policy.act(ep.images[t], ep.state[t], moved)
        _, ref = reference.act(ep.images[t], ep.state[t], moved)
        ar_latencies.append(ref.latency_ms)
        ours, greedy = np.asarray(rec.tokens), np.asarray(ref.tokens)
        bins = np.abs(tokenizer.vocab.bin(ours.astype(int)) - tokenizer.vocab.bin(greedy.astype(int)))
        rows.append((rec, (ours != greedy).mean(), bins.mean(), bins.max(), ep.task, bins))
    if not rows:
        raise InputError(f"no frames to replay in {[str(p) for p in paths]}")
    ar = latency_stats(ar_latencies)
    result = {"method": method_label, "frames": len(rows), "tasks": sorted({r[4] for r in rows}),
              **decoding_metrics([episode_steps([r[0] for r in rows])])}
    # the AR reference decoded the same frames in the same run: a like-for-like speedup
    result.update(ar_latency_ms=ar, speedup=ar["median"] / result["latency_ms"]["median"])
    result.update(
        token_mismatch_rate=float(np.mean([r[1] for r in rows])),
        mean_bin_deviation=float(np.mean([r[2] for r in rows])),
        max_bin_deviation=int(max(r[3] for r in rows)),
    )
    result["skipped_steps"] = _skipped_deviation(policy, [r[5] for r in rows if r[0].skipped])
    return result


def _skipped_deviation(policy: VLAPolicy, deviations: list[np.ndarray]) -> dict:
    """What the skips let through unverified, against the target's greedy tokens: the share of
    tokens beyond a single token's group bound (any gripper change counts) and the largest
    deviation per action dimension."""
    retrieval = policy.decoders.retrieval
    if retrieval is None or not deviations:
        return {"steps": len(deviations)}
    dev = np.stack(deviations)  # [S, n]
    bounds = np.asarray(retrieval.config.token_bounds())
    spec = policy.target.spec
    return {"steps": len(dev), "out_of_bound_share": float((dev > bounds).mean()),
            "max_bin_deviation_per_dim": dev.reshape(len(dev), spec.chunk, spec.action_dim).max(axis=(0, 1)).tolist()}
