"""The embedded `mw` benchmark: Meta-World v3 tasks as a gymnasium env with an RGB camera.

Observation: ``{"image": uint8 (H, W, 3) upright, "state": float32 (7,) = ee xyz, gripper opening,
goal xyz}``. The goal is Meta-World's goal-observable setting: the goal marker is a 2 cm site, about
one pixel in a 64 px frame, so without it reach, push and pick-place are not observable at all.
``info`` carries ``success``, ``ee_pos`` and the full simulator state vector ``sim_obs`` (for the
scripted expert only; the VLA never sees it).

Layouts (object and goal positions) are drawn by us from the task's own reset space with a
seeded generator, one per episode, instead of MT1's 50 presets: training and evaluation use
different seeds, so no evaluation layout was ever seen in a demonstration.
"""

from __future__ import annotations

import atexit
import os
from dataclasses import dataclass

os.environ.setdefault("MUJOCO_GL", "egl")  # headless: must be set before mujoco is imported

import gymnasium as gym
import mujoco
import numpy as np

from heisd.benchmarks.cameras import DEFAULT_CAMERA
from heisd.errors import InputError, UsageError


@dataclass(frozen=True)
class TaskSpec:
    env_name: str  # Meta-World v3 environment name
    instruction: str  # natural-language instruction given to the VLA


# The task registry: 3 free-space/pushing tasks and 5 contact tasks (drawers, buttons, windows, doors).
TASKS: dict[str, TaskSpec] = {
    t.env_name: t
    for t in (
        TaskSpec("reach-v3", "reach the red target with the gripper"),
        TaskSpec("push-v3", "push the puck to the goal"),
        TaskSpec("pick-place-v3", "pick up the puck and place it at the goal"),
        TaskSpec("drawer-open-v3", "open the drawer"),
        TaskSpec("drawer-close-v3", "close the drawer"),
        TaskSpec("button-press-topdown-v3", "press the button from the top"),
        TaskSpec("window-open-v3", "slide the window open"),
        TaskSpec("door-open-v3", "open the door"),
    )
}

ACTION_DIM = 4  # dx dy dz grip, each in [-1, 1]
STATE_DIM = 7  # ee xyz, gripper opening, goal xyz


@dataclass(frozen=True)
class MWConfig:
    image_size: int = 128  # square RGB frame, pixels
    camera: str = DEFAULT_CAMERA
    max_steps: int = 300  # episode cut; the scripted experts finish every task well before this


def check_task(task: str) -> TaskSpec:
    if task not in TASKS:
        raise UsageError(f"unknown mw task {task!r}; known tasks: {', '.join(TASKS)}")
    return TASKS[task]


def resolve_tasks(names: list[str] | tuple[str, ...]) -> tuple[str, ...]:
    """Command-line task names ('all' = the registry), each checked."""
    tasks = tuple(TASKS) if list(names) == ["all"] else tuple(names)
    for t in tasks:
        check_task(t)
    return tasks


class MetaWorldEnv(gym.Env):
    """One Meta-World task with seeded layouts and a fast headless renderer."""

    metadata = {"render_modes": ["rgb_array"]}

    def __init__(self, task: str, config: MWConfig = MWConfig()):
        self.spec_task = check_task(task)
        self.task = task
        self.config = config
        self._env = _raw_env(task, config.image_size, config.camera)
        size = config.image_size
        self.observation_space = gym.spaces.Dict(
            {
                "image": gym.spaces.Box(0, 255, (size, size, 3), np.uint8),
                "state": gym.spaces.Box(-np.inf, np.inf, (STATE_DIM,), np.float32),
            }
        )
        self.action_space = gym.spaces.Box(-1.0, 1.0, (ACTION_DIM,), np.float32)
        self.render_mode = "rgb_array"
        self.layout: np.ndarray | None = None
        self._steps = 0

    @property
    def instruction(self) -> str:
        return self.spec_task.instruction

    def reset(self, *, seed: int | None = None, options: dict | None = None):
        """Reset to a new layout.

        ``options={"layout_seed": s}`` draws the layout from seed ``s``; ``options={"layout": v}``
        restores a layout vector recorded earlier. Otherwise the layout seed comes from ``seed``.
        """
        super().reset(seed=seed)
        options = options or {}
        env = self._env
        if "layout" in options:
            env._freeze_rand_vec, env.seeded_rand_vec = True, False
            env._last_rand_vec = np.asarray(options["layout"], dtype=np.float64).copy()
        else:
            layout_seed = options.get("layout_seed", int(self.np_random.integers(2**31)))
            # The env draws from its own seeded generator and rejects invalid layouts itself
            # (e.g. goal too close to the object); a frozen vector would loop forever there.
            env.seed(int(layout_seed))
            env._freeze_rand_vec, env.seeded_rand_vec = False, True
        self._steps = 0
        sim_obs, _ = env.reset()
        # Meta-World moves the goal site after its last physics step; without a forward pass the
        # first frame draws it where the previous episode left it, so an episode would depend on
        # the episodes before it (BENCHMARKS 2, determinism)
        mujoco.mj_forward(env.model, env.data)
        self.layout = env._last_rand_vec.copy()
        return self._observe(sim_obs), self._info(sim_obs, success=False)

    def step(self, action, *, render: bool = True):
        """Gymnasium step. ``render=False`` leaves ``obs["image"]`` None: a policy that executes an
        action chunk reads only the last step's frame, and rendering is most of a step's cost."""
        action = np.asarray(action, dtype=np.float32)
        if not np.all(np.isfinite(action)):  # MuJoCo would turn it into a silent reset
            raise InputError(f"{self.task}: the policy's action at env step {self._steps} is not finite "
                             f"({action.tolist()}); stopped before the simulator (check the checkpoint's "
                             "norm_stats.json)")
        action = np.clip(action, -1.0, 1.0)
        sim_obs, reward, _, _, info = self._env.step(action)
        self._steps += 1
        success = bool(info["success"])
        truncated = self._steps >= self.config.max_steps
        info = {**self._info(sim_obs, success), "action": action}  # what the simulator received
        return self._observe(sim_obs, render), float(reward), success, truncated, info

    def render(self) -> np.ndarray:
        # Each simulator has its own GL context; another env's may be current in this process.
        self._env.mujoco_renderer._get_viewer("rgb_array").make_context_current()
        return np.ascontiguousarray(self._env.render()[::-1])  # MuJoCo renders upside down

    def _observe(self, sim_obs: np.ndarray, render: bool = True) -> dict:
        # sim_obs = [ee xyz, gripper, objects..., goal xyz] (the goal is set by the task kwargs)
        state = np.concatenate([sim_obs[:4], sim_obs[-3:]]).astype(np.float32)
        return {"image": self.render() if render else None, "state": state}

    @staticmethod
    def _info(sim_obs: np.ndarray, success: bool) -> dict:
        return {"success": success, "ee_pos": sim_obs[:3].astype(np.float32), "sim_obs": sim_obs}


_SIMULATORS: dict[tuple[str, int, str], object] = {}  # the per-process cache of _raw_env


def _raw_env(task: str, image_size: int, camera: str):
    """One simulator per (task, size, camera) per process, never closed.

    Closing a MuJoCo EGL renderer frees the process's current GL context and every later
    renderer returns black frames (seen with mujoco 3.3.0), so environments are reused.
    With several alive, `render` must make its own context current first (else it draws
    with another model's context: garbage frames).
    """
    key = (task, image_size, camera)
    if key not in _SIMULATORS:
        _SIMULATORS[key] = _make_simulator(task, image_size, camera)
        if len(_SIMULATORS) == 1:
            # registered after mujoco.egl's own exit hook (which terminates the EGL display and
            # is registered when the first renderer is made), so ours runs first: atexit is LIFO
            atexit.register(_close_simulators)
    return _SIMULATORS[key]


def _make_simulator(task: str, image_size: int, camera: str):
    import metaworld

    mt1 = metaworld.MT1(task, seed=0)  # only to set the task's kwargs (goal visible to the expert)
    env = mt1.train_classes[task](
        render_mode="rgb_array", width=image_size, height=image_size, camera_name=camera
    )
    cameras = [env.model.camera(i).name for i in range(env.model.ncam)]
    if camera not in cameras:  # MuJoCo would silently render from its free camera instead
        raise UsageError(f"--camera {camera!r}: Meta-World has no such camera; its cameras: {', '.join(cameras)}")
    env.set_task(mt1.train_tasks[0])
    env.max_path_length = 10**9  # episode length is ours (MWConfig.max_steps)
    env.model.vis.quality.offsamples = 0  # no anti-aliasing: ~7x faster software rendering
    env.reset()
    viewer = env.mujoco_renderer._get_viewer("rgb_array")
    viewer.scn.flags[mujoco.mjtRndFlag.mjRND_SHADOW] = 0
    return env


def _close_simulators() -> None:
    # Free the GL contexts while the interpreter is whole; left to garbage collection at
    # shutdown, MuJoCo's EGL destructors print a traceback for every simulator.
    while _SIMULATORS:
        _, env = _SIMULATORS.popitem()
        env.close()


def expert_policy(task: str):
    """Meta-World's scripted expert for a task: `policy.get_action(sim_obs) -> action`."""
    from metaworld.policies import ENV_POLICY_MAP

    return ENV_POLICY_MAP[check_task(task).env_name]()
