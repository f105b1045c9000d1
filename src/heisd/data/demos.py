"""Demonstrations for the `mw` benchmark, written in the LIBERO/robomimic layout.

Scripted experts (the default), with optional DART-style noise: the executed action is the
expert's plus Gaussian noise on xyz, but the recorded label is the clean expert action. The
demonstrations then cover the states a slightly-off policy visits, which is what closed-loop
behaviour cloning needs.

Or the target's own closed-loop rollouts (`DemoConfig.policy` = a checkpoint directory, AR
decoding; ours, DESIGN 9): every episode is kept, failed ones too, since a datastore drafts
the target's own tokens, which are right wherever the target goes. Their layouts must stay
disjoint from the evaluation layouts: seeds from EVAL_SEED_OFFSET on are refused.

Or DAgger data (`expert_labels`): the target acts, and every visited state is labelled with the
scripted expert's action there. Every episode is kept too: the labels are the expert's wherever
the target went, and the states a failing target visits are the ones it must learn to leave.
"""

from __future__ import annotations

import functools
import json
import time
from dataclasses import asdict, dataclass
from multiprocessing import get_context
from pathlib import Path

import numpy as np

from heisd import __version__
from heisd.storage import OutputKind, atomic_file, check_output
from heisd.storage.guard import hdf5_with_attr

VERSION_ATTR = "heisd_version"  # attribute of the `data` group: marks a file heisd wrote
DEMOS = OutputKind("demonstration file", hdf5_with_attr("data", VERSION_ATTR))
KEEP_FAILED = ("target", "dagger")  # sources whose failed episodes are data too (see the module doc)


@dataclass(frozen=True)
class DemoConfig:
    tasks: tuple[str, ...]  # mw task names
    episodes: int  # attempted episodes per task (failed ones are dropped)
    seed: int = 0  # layout and noise seed; evaluation must use a different one
    noise: float = 0.0  # std of Gaussian noise added to executed xyz actions (DART); 0 = clean
    image_size: int = 128
    camera: str = "corner3"
    max_steps: int = 300
    policy: str = "expert"  # "expert" (scripted), or a target checkpoint directory: its own AR rollouts
    expert_labels: bool = False  # DAgger: the target acts, the recorded actions are the expert's

    def __post_init__(self) -> None:
        from heisd.errors import UsageError
        from heisd.runtime.evaluation import EVAL_SEED_OFFSET

        if not 0 <= self.seed < EVAL_SEED_OFFSET:
            raise UsageError(f"--seed must be in [0, {EVAL_SEED_OFFSET}): seeds from {EVAL_SEED_OFFSET} on "
                             "make the evaluation layouts")
        if self.expert_labels and self.policy == "expert":
            raise UsageError("expert labels need a target checkpoint as the acting policy (--policy DIR)")

    @property
    def source(self) -> str:
        """Who acted and who labelled: "expert", "target" or "dagger" (the target acted, the expert
        labelled); the file records it, build-datastore and train-vla read it."""
        if self.policy == "expert":
            return "expert"
        return "dagger" if self.expert_labels else "target"


def episode_seed(seed: int, task: str, episode: int) -> int:
    """Layout/noise seed of one episode: a pure function of (seed, task, episode)."""
    task_key = int.from_bytes(task.encode()[:16].ljust(16, b"\0"), "little") % (2**32)
    return int(np.random.SeedSequence([seed, task_key, episode]).generate_state(1)[0])


def record_episode(task: str, episode: int, cfg: DemoConfig) -> dict:
    """One episode of `cfg.policy`: the scripted expert, or the target (AR, the whole chunk executed);
    the recorded actions are the actor's, or the expert's at every visited state (`expert_labels`)."""
    from heisd.benchmarks.mw import MetaWorldEnv, MWConfig, expert_policy

    env = MetaWorldEnv(task, MWConfig(cfg.image_size, cfg.camera, cfg.max_steps))
    s = episode_seed(cfg.seed, task, episode)
    rng = np.random.default_rng(s)
    obs, info = env.reset(options={"layout_seed": s})
    expert = expert_policy(task)
    label = lambda info: np.clip(expert.get_action(info["sim_obs"]), -1, 1).astype(np.float32)  # noqa: E731
    if cfg.source == "expert":
        act = lambda obs, info: [label(info)]  # noqa: E731
    else:
        policy = _target_policy(cfg.policy)
        policy.reset(env.instruction, task)
        act = lambda obs, info: policy.act(obs["image"], obs["state"])[0]  # noqa: E731
    frames = {"actions": [], "images": [], "ee_pos": [], "gripper": [], "goal_pos": []}
    success, truncated, todo = False, False, []
    while not (success or truncated):
        if not todo:
            todo = [np.asarray(a, dtype=np.float32) for a in act(obs, info)]
        action = todo.pop(0)
        frames["actions"].append(label(info) if cfg.expert_labels else action)
        frames["images"].append(obs["image"])
        frames["ee_pos"].append(obs["state"][:3])
        frames["gripper"].append(obs["state"][3:4])
        frames["goal_pos"].append(obs["state"][4:7])
        executed = action.copy()
        if cfg.noise > 0:
            executed[:3] += rng.normal(0, cfg.noise, 3).astype(np.float32)
        obs, _, success, truncated, info = env.step(executed)
    out = {k: np.stack(v) for k, v in frames.items()}
    out.update(task=task, instruction=env.instruction, success=success, layout=env.layout)
    return out


@functools.cache
def _target_policy(directory: str):
    """The target with AR decoding, loaded once per process."""
    import torch

    from heisd.runtime.methods import MethodConfig, build_decoders
    from heisd.runtime.policy import VLAPolicy
    from heisd.targets import load_target

    torch.set_num_threads(1)  # one simulator + one model per process
    target = load_target(directory)
    return VLAPolicy(target, build_decoders(MethodConfig("ar"), target))


def generate_demos(cfg: DemoConfig, out: Path, workers: int = 1, progress: bool = True,
                   overwrite: bool = False) -> dict:
    """Roll out `cfg.policy` and write the episodes to `out` (atomically): the successful ones of
    an expert, every one of the target's. An existing `out` needs `overwrite`, and is replaced
    only if heisd wrote it."""
    from tqdm import tqdm

    from heisd.benchmarks.mw import check_task

    for t in cfg.tasks:
        check_task(t)
    out = Path(out)
    check_output(out, DEMOS, overwrite)
    start = time.time()
    kept, dropped, steps = 0, {}, 0
    bar = tqdm(total=len(cfg.tasks) * cfg.episodes, desc="demos", unit="ep", disable=not progress)
    jobs = [(t, i, cfg) for t in cfg.tasks for i in range(cfg.episodes)]
    import h5py

    with atomic_file(out) as tmp, h5py.File(tmp, "w") as h5:
        data = h5.create_group("data")
        data.attrs["benchmark"] = "mw"
        data.attrs["source"] = cfg.source
        data.attrs["env_args"] = json.dumps(asdict(cfg))
        data.attrs["created"] = time.strftime("%Y-%m-%dT%H:%M:%S%z")
        data.attrs[VERSION_ATTR] = __version__
        # Episodes are independent jobs (each a pure function of its seed); imap keeps their
        # order, so the file is identical for any number of workers.
        pool = get_context("spawn").Pool(workers) if workers > 1 else None
        try:
            results = pool.imap(_episode_job, jobs) if pool else map(_episode_job, jobs)
            for ep in results:
                kept, steps = _write(data, ep, kept, steps, dropped, keep_failed=cfg.source in KEEP_FAILED)
                bar.update(1)
            if pool:
                pool.close()
        finally:
            if pool:
                pool.terminate()  # after close(): workers are done; on an error or interrupt: stop them
        data.attrs["total"] = steps
    bar.close()
    wall = time.time() - start
    return {"kept": kept, "dropped": dropped, "steps": steps, "seconds": wall, "steps_per_s": steps / wall}


def _episode_job(args: tuple[str, int, DemoConfig]) -> dict:
    task, i, cfg = args
    return record_episode(task, i, cfg)


def _write(data, ep: dict, kept: int, steps: int, dropped: dict, keep_failed: bool) -> tuple[int, int]:
    if not ep["success"] and not keep_failed:
        dropped[ep["task"]] = dropped.get(ep["task"], 0) + 1
        return kept, steps
    g = data.create_group(f"demo_{kept}")
    g.attrs.update(task=ep["task"], instruction=ep["instruction"], success=bool(ep["success"]),
                   num_samples=len(ep["actions"]))
    g.attrs["layout"] = ep["layout"]
    g.create_dataset("actions", data=ep["actions"])
    h, w = ep["images"].shape[1:3]
    g.create_dataset("obs/agentview_rgb", data=ep["images"], compression="lzf", chunks=(1, h, w, 3))
    g.create_dataset("obs/ee_pos", data=ep["ee_pos"])
    g.create_dataset("obs/gripper_states", data=ep["gripper"])
    g.create_dataset("obs/goal_pos", data=ep["goal_pos"])
    return kept + 1, steps + len(ep["actions"])
