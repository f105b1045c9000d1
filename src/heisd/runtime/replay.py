"""Offline replay: decode held-out demonstration frames with a method and with plain AR.

Deterministic and render-free, it measures decoding alone: how far the method's tokens are
from the target's own greedy AR tokens on the same inputs, and what the method costs.
Frames are taken every `chunk` steps (the closed-loop inference cadence), whole episodes at a
time so the kinematic metric sees real trajectories, tasks interleaved.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np

from heisd.errors import InputError
from heisd.runtime.metrics import decoding_metrics, episode_steps, latency_stats
from heisd.runtime.policy import VLAPolicy
from heisd.storage import OutputKind
from heisd.storage.guard import has_file

REPLAY_FILE = "replay.json"
REPLAY_RUN = OutputKind("replay", has_file(REPLAY_FILE), files=(REPLAY_FILE,))


def replay_plan(paths: list[str | Path], frames: int, stride: int) -> list[tuple[str, str, tuple[int, ...]]]:
    """The frames to decode, `frames` in all, one job per episode: (file, episode, frame indices),
    episodes of the tasks interleaved."""
    from heisd.data.dataset import DemoFile

    by_task: dict[str, list[tuple[str, str, int]]] = {}
    for path in paths:
        with DemoFile(path) as f:
            for name in f.episode_names():  # tasks and lengths only: no frames are read
                by_task.setdefault(f.task_of(name), []).append((str(path), name, len(f.summary(name)[0])))
    order = [eps[i] for i in range(max(map(len, by_task.values()), default=0))
             for eps in by_task.values() if i < len(eps)]
    plan, n = [], 0
    for path, name, length in order:
        ts = tuple(range(0, length, stride))[: frames - n]
        if not ts:
            break
        plan.append((path, name, ts))
        n += len(ts)
    return plan


def replay_frames(paths: list[str | Path], frames: int, stride: int):
    """Yield (episode, t, is_first) in `replay_plan`'s order: the frames replay decodes, as it walks them."""
    from heisd.data.dataset import DemoFile

    for path, name, ts in replay_plan(paths, frames, stride):
        with DemoFile(path) as f:
            ep = f.episode(name)
        for t in ts:
            yield ep, t, t == 0


def replay_episode(policies: tuple[VLAPolicy, VLAPolicy], job: tuple[str, str, tuple[int, ...]]) -> list[tuple]:
    """Decode one episode's frames with the method and with AR (`policies`); per frame: (the
    method's step record, AR's latency, the method's tokens, AR's)."""
    from heisd.data.dataset import DemoFile
    from heisd.data.views import target_frames

    policy, reference = policies
    path, name, ts = job
    with DemoFile(path, views=policy.target.spec.views) as f:
        ep = f.episode(name)
    images = target_frames(policy.target.spec, ep)  # as the closed loop shows them
    policy.reset(ep.instruction, ep.task)
    reference.reset(ep.instruction, ep.task)
    stride = policy.target.spec.chunk
    rows = []
    for t in ts:
        moved = ep.ee_pos[max(t - stride + 1, 0) : t + 1]  # every env step since the last frame
        _, rec = policy.act(images[t], ep.state[t], moved)
        _, ref = reference.act(images[t], ep.state[t], moved)
        rows.append((rec, ref.latency_ms, ep.task, np.asarray(rec.tokens), np.asarray(ref.tokens)))
    return rows


def replay(policy: VLAPolicy, reference: VLAPolicy, method_label: str, paths: list[str | Path],
           frames: int, progress: bool = True, executor=None,
           make_policies: Callable[[], tuple[VLAPolicy, VLAPolicy]] | None = None) -> dict:
    """Decode the frames with `policy` and with AR (`reference`) side by side. `executor`
    (`heisd.executors`; default: this process): where the episodes are decoded, a remote one with
    the policies `make_policies` builds (a picklable function). Episodes come back in order."""
    from tqdm import tqdm

    from heisd.executors import LocalExecutor

    tokenizer = policy.target.action_tokenizer
    plan = replay_plan(paths, frames, policy.target.spec.chunk)
    rows, ar_latencies = [], []
    with tqdm(total=sum(len(ts) for *_, ts in plan), desc=f"replay {method_label}", unit="frame",
              disable=not progress) as bar:
        for _, decoded in (executor or LocalExecutor()).map(replay_episode, plan, setup=make_policies,
                                                            here=(policy, reference), ordered=True):
            for rec, ar_ms, task, ours, greedy in decoded:
                ar_latencies.append(ar_ms)
                bins = np.abs(tokenizer.vocab.bin(ours.astype(int)) - tokenizer.vocab.bin(greedy.astype(int)))
                rows.append((rec, (ours != greedy).mean(), bins.mean(), bins.max(), task, bins))
            bar.update(len(decoded))
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
