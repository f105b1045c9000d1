"""Recording one episode for a demonstration file: who acts (the scripted expert, with optional
DART noise on the executed xyz; the target's own AR rollouts; or the target with the expert's
labels, DAgger), from which layout (each episode's own seed, never an evaluation layout), and
what is kept. `heisd.runtime.demos` (mw) and `heisd.runtime.libero_demos` (LIBERO's layout) write
the files; see `demos` for why failed episodes of the target are kept.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from heisd.benchmarks.cameras import DEFAULT_CAMERA
from heisd.data.views import WRIST_KEY, observed_frame
from heisd.storage import OutputKind
from heisd.storage.guard import hdf5_with_attr

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
    max_steps: int | None = None  # episode step limit; None: the benchmark's (LIBERO: only its protocol's)
    policy: str = "expert"  # "expert" (scripted), or a target checkpoint directory: its own AR rollouts
    expert_labels: bool = False  # DAgger: the target acts, the recorded actions are the expert's
    benchmark: str = "mw"  # mw or a LIBERO suite with experts (heisd.benchmarks.libero_experts)
    render: bool = True  # False: no frames (measuring the expert, `measure_expert`); nothing to write
    shadows: bool = False  # LIBERO: render shadows and reflections as OpenVLA's protocol does (its targets saw them)
    wrist: bool = False  # LIBERO: record the wrist camera too (targets that read both cameras)

    def __post_init__(self) -> None:
        from heisd.errors import UsageError
        if not 0 <= self.seed < EVAL_SEED_OFFSET:
            raise UsageError(f"--seed must be in [0, {EVAL_SEED_OFFSET}): seeds from {EVAL_SEED_OFFSET} on "
                             "make the evaluation layouts")
        if self.expert_labels and self.policy == "expert":
            raise UsageError("expert labels need a target checkpoint as the acting policy (--policy DIR)")
        if not self.render and self.policy != "expert":
            raise UsageError("the target reads frames: its rollouts are always rendered")
        if self.shadows and self.benchmark == "mw":
            raise UsageError("--shadows is a LIBERO setting (Meta-World frames are always rendered alike)")
        if self.wrist and (self.benchmark == "mw" or self.shadows or not self.render):
            raise UsageError("--wrist records LIBERO's wrist camera for small targets: not on mw, with --shadows "
                             "(OpenVLA reads agentview only) or without rendering")
        if self.benchmark != "mw":
            from heisd.benchmarks.libero_experts import check_expert_suite

            check_expert_suite(self.benchmark)
        from heisd.benchmarks.registry import recording_max_steps

        # the limit the episodes run, as the recording's settings record it
        object.__setattr__(self, "max_steps", recording_max_steps(self.benchmark, self.max_steps))
        if self.max_steps < 1:
            raise UsageError(f"--max-steps must be >= 1, got {self.max_steps}")

    @property
    def source(self) -> str:
        """Who acted and who labelled: "expert", "target" or "dagger" (the target acted, the expert
        labelled); the file records it, build-datastore and train-vla read it."""
        if self.policy == "expert":
            return "expert"
        return "dagger" if self.expert_labels else "target"


def ran_settings(saved: dict) -> dict:
    """Saved settings (a recording's, a DAgger run's) as the episodes ran: LIBERO always ran its
    protocol's step limit, though runs saved before the limit was recorded say mw's 300."""
    from heisd.benchmarks.registry import default_max_steps, is_libero

    benchmark = saved.get("benchmark", "mw")
    return {**saved, "max_steps": default_max_steps(benchmark)} if is_libero(benchmark) else saved


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
    policy = None if cfg.source == "expert" else _target_policy(cfg.policy, cfg.benchmark, cfg.image_size,
                                                                  cfg.shadows)
    views = 1 if policy is None else policy.views
    wrist = cfg.wrist or views == 2  # a two-camera actor's rollouts keep its second camera (DAgger trains on them)
    env = make_env(cfg.benchmark, task, cfg.image_size, cfg.camera, cfg.max_steps,
                   fast_render=not cfg.shadows, wrist=wrist)
    s = episode_seed(cfg.seed, task, episode)
    rng = np.random.default_rng(s)
    obs, info = env.reset(options={"layout_seed": s})
    label = _expert_labeller(cfg.benchmark, task, env)  # called once per step: LIBERO's expert keeps a phase
    if policy is None:
        act = lambda obs, info: [label(info)]  # noqa: E731
    else:
        policy.reset(env.instruction, task)
        seen, executed = _protocol_io(policy.target.spec.protocol)
        act = lambda obs, info: [executed(a) for a in policy.act(seen(observed_frame(obs, views)), obs["state"])[0]]  # noqa: E731
    # state: ee xyz, then mw's gripper opening and goal xyz, or LIBERO's two finger positions
    frames = {"actions": [], "images": [], "ee_pos": [], "gripper": []}
    frames.update({"states": []} if libero else {"goal_pos": []})
    frames.update({"wrist_images": []} if wrist else {})
    success, truncated, todo = False, False, []
    while not (success or truncated):
        if not todo:
            todo = [np.asarray(a, dtype=np.float32) for a in act(obs, info)]
        action = todo.pop(0)
        frames["actions"].append(label(info) if cfg.expert_labels else action)
        if cfg.render:
            frames["images"].append(obs["image"])
        if wrist:
            frames["wrist_images"].append(obs[WRIST_KEY])
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


def _protocol_io(protocol: str):
    """(what an acting target reads, what the simulator receives) as the closed loop under `protocol` has
    them, from the recorded frame and the target's action. An OpenVLA target sees `openvla_image` of the
    256 px frame, center-cropped as `eval` does by default, and its gripper goes through `openvla_gripper`,
    so the file keeps the expert's frames and LIBERO's gripper convention. One difference from `eval`: the
    frame is rendered at the end of the step, where robosuite's observation is taken at a physics substep."""
    if protocol != "openvla":
        return (lambda image: image), (lambda action: action)
    from heisd.benchmarks.libero_protocol import openvla_gripper, openvla_image

    return (lambda image: openvla_image(image, crop=True)), (lambda action: openvla_gripper(action).astype(np.float32))


@functools.cache
def _target_policy(directory: str, benchmark: str, image_size: int, shadows: bool):
    """The target with AR decoding, loaded once per process; it must act in `benchmark` as recorded
    (`image_size`, `shadows`: an OpenVLA target needs the protocol's frames)."""
    import torch

    from heisd.runtime.methods import MethodConfig, build_decoders
    from heisd.runtime.policy import VLAPolicy

    torch.set_num_threads(1)  # one simulator + one model per process
    target = load_recordable(directory, benchmark, "--policy", (image_size, shadows))
    return VLAPolicy(target, build_decoders(MethodConfig("ar"), target))


def load_recordable(directory: str | Path, benchmark: str, flag: str, frames: tuple[int, bool] | None):
    """The target in `directory` loaded to act in `benchmark` (an OpenVLA checkpoint with the suite's
    statistics, as `eval` loads it), refused unless its rollouts can be recorded there (`check_recordable`)."""
    from heisd.benchmarks.registry import is_libero
    from heisd.errors import UsageError
    from heisd.targets.load import closed_loop_unnorm_key, is_openvla, load_target

    if is_openvla(directory) and not is_libero(benchmark):
        raise UsageError(f"{flag} {directory}: an OpenVLA checkpoint acts in LIBERO suites (under OpenVLA's protocol), "
                         f"not in {benchmark}")
    target = load_target(directory, unnorm_key=closed_loop_unnorm_key(directory, benchmark, None))
    check_recordable(target, directory, benchmark, flag, frames)
    return target


def check_recordable(target, directory: str | Path, benchmark: str, flag: str,
                     frames: tuple[int, bool] | None = None) -> None:
    """Rollouts are recorded for targets acting in `benchmark`; `flag` names where the target came from
    in the message (`--policy` for demos, `--init` for dagger). `frames` (image size, shadows) is what the
    rollouts render: given, LIBERO also takes OpenVLA-protocol targets, which read the protocol's 256 px
    frames with shadows; None: heisd's own targets only."""
    from heisd.benchmarks.libero_protocol import PROTOCOL_RENDER_SIZE
    from heisd.benchmarks.registry import action_dim, is_libero
    from heisd.errors import UsageError

    protocols = ("raw", "openvla") if frames is not None and is_libero(benchmark) else ("raw",)
    if target.spec.action_dim != action_dim(benchmark) or target.spec.protocol not in protocols:
        raise UsageError(f"{flag} {directory}: a target with {target.spec.action_dim}-D actions and the "
                         f"{target.spec.protocol!r} protocol cannot be recorded in {benchmark} (it takes "
                         f"{action_dim(benchmark)}-D actions; protocols recorded here: {', '.join(protocols)})")
    if target.spec.protocol == "openvla" and frames != (PROTOCOL_RENDER_SIZE, True):
        raise UsageError(f"{flag} {directory}: an OpenVLA-protocol target reads the protocol's {PROTOCOL_RENDER_SIZE} "
                         f"px frames with shadows; record with --image-size {PROTOCOL_RENDER_SIZE} --shadows")


def episode_work(state: None, job: tuple[str, int, DemoConfig]) -> dict:
    """One (task, episode index, config) job of an executor (`heisd.executors`): the worker's
    state is its process's caches (`_target_policy`)."""
    task, i, cfg = job
    return record_episode(task, i, cfg)


