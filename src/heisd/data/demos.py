"""Scripted-expert demonstrations for the `mw` benchmark, written in the LIBERO/robomimic layout.

Optional DART-style noise: the executed action is the expert's plus Gaussian noise on xyz,
but the recorded label is the clean expert action. The demonstrations then cover the states
a slightly-off policy visits, which is what closed-loop behaviour cloning needs.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import asdict, dataclass
from multiprocessing import get_context
from pathlib import Path

import numpy as np

from heisd import __version__


@dataclass(frozen=True)
class DemoConfig:
    tasks: tuple[str, ...]  # mw task names
    episodes: int  # attempted episodes per task (failed ones are dropped)
    seed: int = 0  # layout and noise seed; evaluation must use a different one
    noise: float = 0.0  # std of Gaussian noise added to executed xyz actions (DART); 0 = clean
    image_size: int = 128
    camera: str = "corner3"
    max_steps: int = 300


def episode_seed(seed: int, task: str, episode: int) -> int:
    """Layout/noise seed of one episode: a pure function of (seed, task, episode)."""
    task_key = int.from_bytes(task.encode()[:16].ljust(16, b"\0"), "little") % (2**32)
    return int(np.random.SeedSequence([seed, task_key, episode]).generate_state(1)[0])


def rollout_expert(task: str, episode: int, cfg: DemoConfig) -> dict:
    from heisd.benchmarks.mw import MetaWorldEnv, MWConfig, expert_policy

    env = MetaWorldEnv(task, MWConfig(cfg.image_size, cfg.camera, cfg.max_steps))
    policy = expert_policy(task)
    s = episode_seed(cfg.seed, task, episode)
    rng = np.random.default_rng(s)
    obs, info = env.reset(options={"layout_seed": s})
    frames = {"actions": [], "images": [], "ee_pos": [], "gripper": [], "goal_pos": []}
    success = False
    while True:
        action = np.clip(policy.get_action(info["sim_obs"]), -1, 1).astype(np.float32)
        frames["actions"].append(action)
        frames["images"].append(obs["image"])
        frames["ee_pos"].append(obs["state"][:3])
        frames["gripper"].append(obs["state"][3:4])
        frames["goal_pos"].append(obs["state"][4:7])
        executed = action.copy()
        if cfg.noise > 0:
            executed[:3] += rng.normal(0, cfg.noise, 3).astype(np.float32)
        obs, _, success, truncated, info = env.step(executed)
        if success or truncated:
            break
    out = {k: np.stack(v) for k, v in frames.items()}
    out.update(task=task, instruction=env.instruction, success=success, layout=env.layout)
    return out


def generate_demos(cfg: DemoConfig, out: Path, workers: int = 1, progress: bool = True) -> dict:
    """Roll out the experts and write the successful episodes to `out` (atomically)."""
    from tqdm import tqdm

    from heisd.benchmarks.mw import check_task

    for t in cfg.tasks:
        check_task(t)
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(out.name + ".partial")
    start = time.time()
    kept, dropped, steps = 0, {}, 0
    bar = tqdm(total=len(cfg.tasks) * cfg.episodes, desc="demos", unit="ep", disable=not progress)
    jobs = [(t, i, cfg) for t in cfg.tasks for i in range(cfg.episodes)]
    import h5py

    with h5py.File(tmp, "w") as h5:
        data = h5.create_group("data")
        data.attrs["benchmark"] = "mw"
        data.attrs["env_args"] = json.dumps(asdict(cfg))
        data.attrs["created"] = time.strftime("%Y-%m-%dT%H:%M:%S%z")
        data.attrs["heisd_version"] = __version__
        # Episodes are independent jobs (each a pure function of its seed); imap keeps their
        # order, so the file is identical for any number of workers.
        pool = get_context("spawn").Pool(workers) if workers > 1 else None
        try:
            results = pool.imap(_episode_job, jobs) if pool else map(_episode_job, jobs)
            for ep in results:
                kept, steps = _write(data, ep, kept, steps, dropped)
                bar.update(1)
        finally:
            if pool:
                pool.close()
        data.attrs["total"] = steps
    bar.close()
    os.replace(tmp, out)
    wall = time.time() - start
    return {"kept": kept, "dropped": dropped, "steps": steps, "seconds": wall, "steps_per_s": steps / wall}


def _episode_job(args: tuple[str, int, DemoConfig]) -> dict:
    task, i, cfg = args
    return rollout_expert(task, i, cfg)


def _write(data, ep: dict, kept: int, steps: int, dropped: dict) -> tuple[int, int]:
    if not ep["success"]:
        dropped[ep["task"]] = dropped.get(ep["task"], 0) + 1
        return kept, steps
    g = data.create_group(f"demo_{kept}")
    g.attrs.update(task=ep["task"], instruction=ep["instruction"], success=True, num_samples=len(ep["actions"]))
    g.attrs["layout"] = ep["layout"]
    g.create_dataset("actions", data=ep["actions"])
    h, w = ep["images"].shape[1:3]
    g.create_dataset("obs/agentview_rgb", data=ep["images"], compression="lzf", chunks=(1, h, w, 3))
    g.create_dataset("obs/ee_pos", data=ep["ee_pos"])
    g.create_dataset("obs/gripper_states", data=ep["gripper"])
    g.create_dataset("obs/goal_pos", data=ep["goal_pos"])
    return kept + 1, steps + len(ep["actions"])
