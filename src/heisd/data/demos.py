"""Demonstrations for `mw` (one file, heisd's variant of the LIBERO/robomimic layout) and for
LIBERO-Object (one file per task in LIBERO's own layout: `heisd.data.libero_demos`).

Scripted experts (the default), with optional DART-style noise: the executed action is the
expert's plus Gaussian noise on xyz, but the recorded label is the clean expert action. The
demonstrations then cover the states a slightly-off policy visits, which is what closed-loop
behaviour cloning needs. Every episode starts from a layout drawn from its own seed (mw's layouts;
LIBERO's placement samplers), never from the init states LIBERO's evaluation uses.

Or the target's own closed-loop rollouts (`DemoConfig.policy` = a checkpoint directory, AR
decoding; ours, docs/design.md §2.2): every episode is kept, failed ones too, since a datastore drafts
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
from dataclasses import asdict, dataclass, replace
from multiprocessing import get_context
from pathlib import Path

import numpy as np

from heisd import __version__
from heisd.benchmarks.cameras import DEFAULT_CAMERA
from heisd.storage import OutputKind, atomic_file, check_output
from heisd.storage.guard import hdf5_with_attr
from heisd.storage.hdf5 import HDF5Output

VERSION_ATTR = "heisd_version"  # attribute of the `data` group: marks a file heisd wrote
DEMOS = OutputKind("demonstration file", hdf5_with_attr("data", VERSION_ATTR))
KEEP_FAILED = ("target", "dagger")  # sources whose failed episodes are data too (see the module doc)


@dataclass(frozen=True)
class DemoConfig:
    tasks: tuple[str, ...]  # task names of `benchmark`
    episodes: int  # attempted episodes per task (failed ones are dropped)
    seed: int = 0  # layout and noise seed; evaluation must use a different one
    noise: float = 0.0  # std of Gaussian noise added to executed xyz actions (DART); 0 = clean
    image_size: int = 128  # square camera frame, pixels
    camera: str = DEFAULT_CAMERA  # mw camera (LIBERO: agentview)
    max_steps: int = 300  # mw episode limit (LIBERO: the suite's protocol value)
    policy: str = "expert"  # "expert" (scripted), or a target checkpoint directory: its own AR rollouts
    expert_labels: bool = False  # DAgger: the target acts, the recorded actions are the expert's
    benchmark: str = "mw"  # mw or a LIBERO suite with experts (heisd.benchmarks.libero_experts)
    render: bool = True  # False: no frames (measuring the expert, `measure_expert`); nothing to write

    def __post_init__(self) -> None:
        from heisd.errors import UsageError
        if not 0 <= self.seed < EVAL_SEED_OFFSET:
            raise UsageError(f"--seed must be in [0, {EVAL_SEED_OFFSET}): seeds from {EVAL_SEED_OFFSET} on "
                             "make the evaluation layouts")
        if self.expert_labels and self.policy == "expert":
            raise UsageError("expert labels need a target checkpoint as the acting policy (--policy DIR)")
        if not self.render and self.policy != "expert":
            raise UsageError("the target reads frames: its rollouts are always rendered")
        if self.benchmark != "mw":
            from heisd.benchmarks.libero_experts import check_expert_suite

            check_expert_suite(self.benchmark)

    @property
    def source(self) -> str:
        """Who acted and who labelled: "expert", "target" or "dagger" (the target acted, the expert
        labelled); the file records it, build-datastore and train-vla read it."""
        if self.policy == "expert":
            return "expert"
        return "dagger" if self.expert_labels else "target"


EVAL_SEED_OFFSET = 10_000  # evaluation layouts come from seeds no demonstration command uses by default


def episode_seed(seed: int, task: str, episode: int) -> int:
    """Layout/noise seed of one episode: a pure function of (seed, task, episode)."""
    task_key = int.from_bytes(task.encode()[:16].ljust(16, b"\0"), "little") % (2**32)
    return int(np.random.SeedSequence([seed, task_key, episode]).generate_state(1)[0])


def dart_action(label: np.ndarray, noise: float, rng: np.random.Generator) -> np.ndarray:
    """The action executed for a recorded `label`: Gaussian noise of std `noise` on xyz only (DART);
    the label itself is left clean."""
    executed = label.copy()
    if noise > 0:
        executed[:3] += rng.normal(0, noise, 3).astype(executed.dtype)
    return executed


def _expert_labeller(benchmark: str, task: str, env):
    """The scripted expert of the episode `env` was just reset to: `info` -> its float32 action."""
    from heisd.benchmarks.registry import is_libero

    if is_libero(benchmark):
        from heisd.benchmarks.libero_experts import expert_actor

        expert = expert_actor(env)
        return lambda info: expert(info).astype(np.float32)
    from heisd.benchmarks.mw import expert_policy

    mw_expert = expert_policy(task)
    return lambda info: np.clip(mw_expert.get_action(info["sim_obs"]), -1, 1).astype(np.float32)


def record_episode(task: str, episode: int, cfg: DemoConfig) -> dict:
    """One episode of `cfg.policy`: the scripted expert, or the target (AR, the whole chunk executed);
    the recorded actions are the actor's, or the expert's at every visited state (`expert_labels`).
    LIBERO episodes also record the simulator state of every frame (LIBERO's `states`)."""
    from heisd.benchmarks.registry import is_libero, make_env

    libero = is_libero(cfg.benchmark)
    policy = None if cfg.source == "expert" else _target_policy(cfg.policy, cfg.benchmark)
    env = make_env(cfg.benchmark, task, cfg.image_size, cfg.camera, None if libero else cfg.max_steps)
    s = episode_seed(cfg.seed, task, episode)
    rng = np.random.default_rng(s)
    obs, info = env.reset(options={"layout_seed": s})
    label = _expert_labeller(cfg.benchmark, task, env)  # called once per step: LIBERO's expert keeps a phase
    if policy is None:
        act = lambda obs, info: [label(info)]  # noqa: E731
    else:
        policy.reset(env.instruction, task)
        act = lambda obs, info: policy.act(obs["image"], obs["state"])[0]  # noqa: E731
    # state: ee xyz, then mw's gripper opening and goal xyz, or LIBERO's two finger positions
    frames = {"actions": [], "images": [], "ee_pos": [], "gripper": []}
    frames.update({"states": []} if libero else {"goal_pos": []})
    success, truncated, todo = False, False, []
    while not (success or truncated):
        if not todo:
            todo = [np.asarray(a, dtype=np.float32) for a in act(obs, info)]
        action = todo.pop(0)
        frames["actions"].append(label(info) if cfg.expert_labels else action)
        if cfg.render:
            frames["images"].append(obs["image"])
        frames["ee_pos"].append(obs["state"][:3])
        if libero:
            frames["gripper"].append(obs["state"][3:5])
            frames["states"].append(env.sim_state())
        else:
            frames["gripper"].append(obs["state"][3:4])
            frames["goal_pos"].append(obs["state"][4:7])
        obs, _, success, truncated, info = env.step(dart_action(action, cfg.noise, rng), render=cfg.render)
    out = {k: np.stack(v) for k, v in frames.items() if v}
    out.update(task=task, instruction=env.instruction, success=success, layout=env.layout)
    if libero:
        # the instruction evaluation gives (the suite's task language), not the BDDL header's wording
        out.update(problem_info={**env.problem_info, "language_instruction": env.instruction}, bddl_file=env.bddl_file)
        if episode == cfg.episodes - 1:
            env.close()  # the task's last episode: free its simulator (~0.5 GB) before the next task's
    return out


@functools.cache
def _target_policy(directory: str, benchmark: str):
    """The target with AR decoding, loaded once per process; it must act in `benchmark` as recorded
    (heisd's own conventions: an OpenVLA checkpoint needs the protocol's 256 px frames, not these)."""
    import torch

    from heisd.runtime.methods import MethodConfig, build_decoders
    from heisd.runtime.policy import VLAPolicy
    from heisd.targets import load_target

    torch.set_num_threads(1)  # one simulator + one model per process
    target = load_target(directory)
    check_recordable(target, directory, benchmark, "--policy")
    return VLAPolicy(target, build_decoders(MethodConfig("ar"), target))


def check_recordable(target, directory: str | Path, benchmark: str, flag: str) -> None:
    """Rollouts are recorded for heisd's own targets acting in `benchmark`; `flag` names where the
    target came from in the message (`--policy` for demos, `--init` for dagger)."""
    from heisd.benchmarks.registry import action_dim
    from heisd.errors import UsageError

    if target.spec.action_dim != action_dim(benchmark) or target.spec.protocol != "raw":
        raise UsageError(f"{flag} {directory}: a target with {target.spec.action_dim}-D actions and the "
                         f"{target.spec.protocol!r} protocol cannot be recorded in {benchmark} (it takes "
                         f"{action_dim(benchmark)}-D actions; rollouts are recorded for heisd's own targets)")


def generate_demos(cfg: DemoConfig, out: Path, workers: int = 1, progress: bool = True,
                   overwrite: bool = False) -> dict:
    """Roll out `cfg.policy` and write the episodes to `out` (atomically): the successful ones of
    an expert, every one of the target's. An existing `out` needs `overwrite`, and is replaced
    only if heisd wrote it. LIBERO: `out` is a directory of per-task files in LIBERO's layout."""
    from tqdm import tqdm

    from heisd.benchmarks.registry import is_libero, resolve_tasks

    resolve_tasks(cfg.benchmark, cfg.tasks)  # each task checked
    if is_libero(cfg.benchmark):
        from heisd.data.libero_demos import generate_libero_demos

        return generate_libero_demos(cfg, out, workers, progress, overwrite)
    out = Path(out)
    check_output(out, DEMOS, overwrite)
    start = time.time()
    kept, dropped, steps = 0, {}, 0
    jobs = [(t, i, cfg) for t in cfg.tasks for i in range(cfg.episodes)]
    # a full disk stops the recording at the episode it hits and leaves nothing (heisd.storage.hdf5);
    # the bar is closed before an error reaches the command line, which prints it as the last line
    with (tqdm(total=len(jobs), desc="demos", unit="ep", disable=not progress) as bar, atomic_file(out) as tmp,
          HDF5Output(tmp) as h5):
        data = h5.file.create_group("data")
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
                h5.check()
                bar.update(1)
            if pool:
                pool.close()
        finally:
            if pool:
                pool.terminate()  # after close(): workers are done; on an error or interrupt: stop them
        data.attrs["total"] = steps
    wall = time.time() - start
    return {"kept": kept, "dropped": dropped, "steps": steps, "seconds": wall, "steps_per_s": steps / wall}


def measure_expert(cfg: DemoConfig, workers: int = 1, progress: bool = True) -> dict:
    """The expert's success per task on the layouts `cfg` would record (its seeds and noise), rolled
    out without rendering and without writing: {task: {"episodes", "successes", "mean_steps"}}."""
    from tqdm import tqdm

    from heisd.benchmarks.registry import resolve_tasks

    resolve_tasks(cfg.benchmark, cfg.tasks)
    cfg = replace(cfg, render=False)
    jobs = [(t, i, cfg) for t in cfg.tasks for i in range(cfg.episodes)]
    table = {t: {"episodes": 0, "successes": 0, "steps": 0} for t in cfg.tasks}
    pool = get_context("spawn").Pool(workers) if workers > 1 else None
    try:
        results = pool.imap(_episode_job, jobs) if pool else map(_episode_job, jobs)
        for ep in tqdm(results, total=len(jobs), desc="expert", unit="ep", disable=not progress):
            row = table[ep["task"]]
            row["episodes"] += 1
            row["successes"] += int(ep["success"])
            row["steps"] += len(ep["actions"])
        if pool:
            pool.close()
    finally:
        if pool:
            pool.terminate()
    return {t: {"episodes": r["episodes"], "successes": r["successes"], "mean_steps": r["steps"] / r["episodes"]}
            for t, r in table.items()}


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
