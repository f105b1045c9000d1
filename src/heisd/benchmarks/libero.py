"""LIBERO suites (`libero_spatial`, `libero_object`, `libero_goal`, `libero_10`) with OpenVLA's protocol.

Observation, as in `mw`: ``{"image": uint8 (H, W, 3) upright (agentview rotated 180 degrees),
"state": float32 (5,) = ee xyz, gripper finger positions (2)}``; ``info`` carries ``success`` and
``ee_pos`` (`robot0_eef_pos`). Episode ``i`` starts from the suite's init state ``i``
(``reset(options={"init_state": i})``), then `NUM_STEPS_WAIT` dummy steps, then at most the
suite's `MAX_STEPS` policy steps; success is the simulator's `done`.

Only the agentview camera is rendered (the protocol also renders a wrist camera OpenVLA never reads), unless
`LiberoConfig.wrist` asks for the wrist camera too: then ``obs["wrist_image"]`` is the eye-in-hand view at the
same size, upright as agentview (small targets that read two cameras, `heisd.data.views`). Under
the "openvla" protocol the frame is robosuite's camera observation, as OpenVLA's eval reads it
(`obs["agentview_image"]`): robosuite samples its observables on their own clock, at a physics substep
before the step's last, so the frame (like `robot0_eef_pos`) lags the end-of-step state a little. The
"raw" protocol renders the end-of-step state, and only for the frames a policy reads. `fast_render`
turns off shadows and reflections for CPU runs of small targets; keep it off for OpenVLA, which saw
rendered shadows.
"""

from __future__ import annotations

import atexit
import gc
import os
import sys
from dataclasses import dataclass

os.environ.setdefault("MUJOCO_GL", "egl")  # headless: must be set before mujoco is imported

import gymnasium as gym
import numpy as np

from heisd.benchmarks.cameras import LIBERO_CAMERA, LIBERO_WRIST_CAMERA, WRIST_KEY
from heisd.benchmarks.libero_protocol import (
    ACTION_DIM, DUMMY_ACTION, MAX_STEPS, NUM_STEPS_WAIT, OPENVLA_IMAGE_SIZE, PROTOCOL_RENDER_SIZE, check_suite,
    openvla_gripper, openvla_image, rotate_180,
)
from heisd.benchmarks.libero_setup import ensure_libero
from heisd.errors import InputError, UsageError

STATE_DIM = 5  # ee xyz, two gripper finger positions (LIBERO datasets' ee_pos + gripper_states)


@dataclass(frozen=True)
class LiberoConfig:
    image_size: int = PROTOCOL_RENDER_SIZE  # square agentview frame, pixels (OpenVLA's protocol: 256)
    fast_render: bool = False  # shadows and reflections off (CPU runs of small targets)
    max_steps: int | None = None  # policy steps after the wait steps; None = the suite's protocol value
    protocol: str = "raw"  # "openvla": observed frames through `openvla_image`, gripper through `openvla_gripper`
    crop: bool = False  # openvla protocol: the 0.9-area center crop (checkpoints trained with crop augmentation)
    wrist: bool = False  # also render the wrist camera into obs["wrist_image"] (raw protocol only)

    def __post_init__(self) -> None:
        if self.protocol not in ("raw", "openvla"):
            raise UsageError(f"LIBERO protocol must be 'raw' or 'openvla', got {self.protocol!r}")
        if self.wrist and self.protocol == "openvla":
            raise UsageError("OpenVLA's protocol shows the policy agentview only: the wrist camera is for raw-protocol "
                             "targets")


def libero_modules():
    """(benchmark, get_libero_path, OffScreenRenderEnv) from LIBERO, imported safely."""
    ensure_libero()
    from libero.libero import benchmark, get_libero_path
    from libero.libero.envs import OffScreenRenderEnv

    return benchmark, get_libero_path, OffScreenRenderEnv


def _suite(suite: str):
    benchmark, _, _ = libero_modules()
    return benchmark.get_benchmark_dict()[check_suite(suite)]()


def suite_tasks(suite: str) -> tuple[str, ...]:
    """The suite's task names in LIBERO's order (task index = position)."""
    return tuple(_suite(suite).get_task_names())


def suite_instructions(suite: str) -> dict[str, str]:
    """Task name -> language instruction, in LIBERO's order (read from the suite, no simulator built)."""
    s = _suite(suite)
    return {task.name: task.language for task in (s.get_task(i) for i in range(s.get_num_tasks()))}


def resolve_tasks(suite: str, names: list[str] | tuple[str, ...]) -> tuple[str, ...]:
    """Command-line task names ('all' = the whole suite), each checked against the suite."""
    known = suite_tasks(suite)
    tasks = known if list(names) == ["all"] else tuple(names)
    for t in tasks:
        if t not in known:
            raise UsageError(f"{t!r} is not a {suite} task; its tasks: {', '.join(known)}")
    return tasks


class LiberoEnv(gym.Env):
    """One LIBERO task under OpenVLA's protocol, with `mw`'s observation conventions (a gymnasium env)."""

    metadata = {"render_modes": ["rgb_array"]}

    def __init__(self, suite: str, task: str, config: LiberoConfig = LiberoConfig()):
        self.suite, self.task, self.config = check_suite(suite), task, config
        self.max_steps = config.max_steps or MAX_STEPS[suite]
        size = OPENVLA_IMAGE_SIZE if config.protocol == "openvla" else config.image_size
        spaces = {"image": gym.spaces.Box(0, 255, (size, size, 3), np.uint8),
                  "state": gym.spaces.Box(-np.inf, np.inf, (STATE_DIM,), np.float32)}
        if config.wrist:
            spaces[WRIST_KEY] = gym.spaces.Box(0, 255, (size, size, 3), np.uint8)
        self.observation_space = gym.spaces.Dict(spaces)
        self.action_space = gym.spaces.Box(-1.0, 1.0, (ACTION_DIM,), np.float32)
        self.render_mode = "rgb_array"
        # the simulator's cache key: agentview is observed by robosuite under the openvla protocol
        self._key = (self.suite, task, config.image_size, config.fast_render, config.protocol == "openvla")
        sim = _simulator(*self._key)
        self._env, self._init_states, self.instruction = sim.env, sim.init_states, sim.instruction
        self.bddl_file = sim.bddl_file  # the task's BDDL file (LIBERO's dataset files name it)
        self.layout: np.ndarray | None = None  # [init state index], or the start state of a fresh layout
        self._steps = 0

    @property
    def n_init_states(self) -> int:
        return len(self._init_states)

    @property
    def simulator(self):
        """The robosuite environment underneath (scripted experts read object poses from its `sim`)."""
        return self._env.env

    @property
    def problem_info(self) -> dict:
        """The task's BDDL header, as LIBERO's dataset files record it in their `data` attrs."""
        e = self._env
        return {"problem_name": e.problem_name, "domain_name": e.domain_name,
                "language_instruction": e.language_instruction}

    def sim_state(self) -> np.ndarray:
        """The flattened MuJoCo state (time, qpos, qvel): what LIBERO's init states and `states` hold."""
        return self._env.get_sim_state().copy()

    def reset(self, *, seed: int | None = None, options: dict | None = None):
        """``options={"init_state": i}``: the suite's init state ``i`` (OpenVLA: episode i uses state i;
        `layout` = [i]). ``options={"layout_seed": s}``: a fresh layout drawn by LIBERO's own placement
        samplers from seed ``s`` (demonstrations: never one of the init states evaluation uses;
        `layout` = the simulator state it starts from). ``options={"layout": v}``: that state again.
        None of them (gymnasium's plain ``reset(seed=...)``): a fresh layout drawn from the env's own
        generator, which ``seed`` seeds."""
        super().reset(seed=seed)
        options = dict(options or {})
        if not {"init_state", "layout_seed", "layout"} & set(options):
            options["layout_seed"] = int(self.np_random.integers(2**31))
        # What OpenVLA's hard reset (rebuilding the model, seconds each) leaves fresh, done in place:
        # the simulator data (solver warm starts the init state does not set) and the gripper's
        # command, which robosuite integrates across steps and never resets otherwise
        self._env.env.sim.reset()
        for robot in self._env.env.robots:
            robot.gripper.current_action = np.zeros(robot.gripper.dof)
        # LIBERO's samplers draw from numpy's global generator: seed it for this reset only. Also before
        # an init state is set over the drawn layout: the draw leaves traces the init state does not
        # overwrite, so an unseeded draw made an episode depend on what the process ran before it
        # (a resumed or distributed run then differed from an uninterrupted one, late in an episode)
        seed = options["layout_seed"] if "layout_seed" in options else options.get("init_state", 0)
        saved = np.random.get_state()
        np.random.seed(int(seed) % 2**32)
        try:
            self._unplace_fixtures()  # the samplers add a fixture's position to its sites'
            self._env.reset()
        finally:
            np.random.set_state(saved)
        if "layout_seed" in options:
            layout = self.sim_state()
        else:
            layout = self._start_state(options)
            self._env.set_init_state(layout)
        for _ in range(NUM_STEPS_WAIT):  # the protocol ignores `done` during the wait
            sim_obs, _, _, _ = self._env.step(DUMMY_ACTION.tolist())
        self.layout = np.array([options["init_state"]]) if "init_state" in options else layout
        self._steps = 0
        return self._observe(sim_obs), self._info(sim_obs, success=False)

    def _unplace_fixtures(self) -> None:
        """Fixtures back at the origin, as LIBERO's hard reset rebuilds them: its samplers add a
        fixture's sampled position to its sites' world positions, so an object sampled onto a fixture
        (a bowl on the stove, in a drawer) would otherwise land a fixture's offset away, off the table."""
        env = self._env.env
        for fixture in env.fixtures_dict.values():
            body = env.sim.model.body_name2id(fixture.root_body)
            env.sim.model.body_pos[body] = 0.0
            env.sim.model.body_quat[body] = (1.0, 0.0, 0.0, 0.0)

    def _start_state(self, options: dict) -> np.ndarray:
        if "layout" in options:
            state = np.asarray(options["layout"], dtype=np.float64)
            if state.shape != self._init_states.shape[1:]:
                raise UsageError(f"a {self.task} layout is a simulator state of {self._init_states.shape[1]} "
                                 f"numbers, got shape {state.shape}")
            return state
        i = int(options["init_state"])
        if not 0 <= i < self.n_init_states:
            raise UsageError(f"init state {i} out of range: {self.suite}/{self.task} has {self.n_init_states}")
        return self._init_states[i]

    def step(self, action, *, render: bool = True):
        """Gymnasium step; ``render=False`` leaves ``obs["image"]`` None (a mid-chunk frame nobody reads)."""
        action = np.asarray(action, dtype=np.float64)
        if self.config.protocol == "openvla" and action.shape == (ACTION_DIM,):
            action = openvla_gripper(action)  # the model's [0, 1] gripper -> LIBERO's -1 open / +1 close
        if action.shape != (ACTION_DIM,) or not np.all(np.isfinite(action)):
            raise InputError(f"{self.task}: the policy's action at env step {self._steps} is not {ACTION_DIM} "
                             f"finite numbers ({action.tolist()}); stopped before the simulator")
        sim_obs, reward, done, _ = self._env.step(action.tolist())
        self._steps += 1
        success = bool(done)
        truncated = self._steps >= self.max_steps
        info = {**self._info(sim_obs, success), "action": action}  # what the simulator received
        return self._observe(sim_obs, render), float(reward), success, truncated, info

    def close(self) -> None:
        """Free the simulator (~0.5 GB) now rather than at exit. It is shared by every `LiberoEnv` of the
        same task, image size and quality in this process: those stop working; a new one builds anew."""
        sim = _SIMULATORS.pop(self._key, None)
        if sim is not None:
            sim.env.close()

    def render(self, camera: str = LIBERO_CAMERA) -> np.ndarray:
        """`camera`'s frame of the current state, upright."""
        size = self.config.image_size
        # each simulator has its own GL context and robosuite renders into whichever is current
        self._env.env.sim._render_context_offscreen.gl_ctx.make_current()
        # the same call robosuite's camera observable makes; the frame is upside down (OpenGL rows)
        frame = self._env.sim.render(camera_name=camera, width=size, height=size)
        return rotate_180(frame)

    def _observe(self, sim_obs: dict, render: bool = True) -> dict:
        state = np.concatenate([sim_obs["robot0_eef_pos"], sim_obs["robot0_gripper_qpos"]]).astype(np.float32)
        if not render:
            image = None
        elif self.config.protocol == "openvla":  # the frame robosuite observed this step, as OpenVLA's eval reads it
            image = openvla_image(rotate_180(sim_obs[f"{LIBERO_CAMERA}_image"]), self.config.crop)  # JPEG'd, 224 px
        else:
            image = self.render()
        obs = {"image": image, "state": state}
        if self.config.wrist:
            obs[WRIST_KEY] = self.render(LIBERO_WRIST_CAMERA) if render else None
        return obs

    @staticmethod
    def _info(sim_obs: dict, success: bool) -> dict:
        return {"success": success, "ee_pos": np.asarray(sim_obs["robot0_eef_pos"], dtype=np.float32)}


@dataclass
class _Simulator:
    env: object  # LIBERO's OffScreenRenderEnv
    init_states: np.ndarray  # (n, state_dim) float64, the suite's init states of the task
    instruction: str  # the task's language instruction
    bddl_file: str  # the task's BDDL file inside LIBERO's repository, as LIBERO's datasets name it


# one per (suite, task, size, quality, observed frames) per process
_SIMULATORS: dict[tuple[str, str, int, bool, bool], _Simulator] = {}


def _simulator(suite: str, task: str, image_size: int, fast_render: bool, observed: bool) -> _Simulator:
    """Building a LIBERO env takes seconds (XML assembly, model compile): made once, reused, closed at exit.
    `observed`: agentview is one of robosuite's observations, rendered each step (the openvla protocol)."""
    key = (suite, task, image_size, fast_render, observed)
    if key not in _SIMULATORS:
        _SIMULATORS[key] = _make_simulator(suite, task, image_size, fast_render, observed)
        if len(_SIMULATORS) == 1:
            atexit.register(close_simulators)
    return _SIMULATORS[key]


def _make_simulator(suite: str, task: str, image_size: int, fast_render: bool, observed: bool) -> _Simulator:
    import mujoco

    _, get_libero_path, OffScreenRenderEnv = libero_modules()
    s = _suite(suite)
    names = s.get_task_names()
    if task not in names:
        raise UsageError(f"{task!r} is not a {suite} task; its tasks: {', '.join(names)}")
    i = names.index(task)
    spec = s.get_task(i)
    bddl = os.path.join(get_libero_path("bddl_files"), spec.problem_folder, spec.bddl_file)
    env = OffScreenRenderEnv(
        bddl_file_name=bddl, camera_heights=image_size, camera_widths=image_size,
        camera_names=[LIBERO_CAMERA], use_camera_obs=observed,  # else frames are rendered on demand by LiberoEnv.render
        hard_reset=False,  # LiberoEnv.reset refreshes what a hard reset would
    )
    env.seed(0)  # as the protocol
    env.reset()  # creates the offscreen render context
    if fast_render:
        ctx = env.env.sim._render_context_offscreen
        ctx.scn.flags[mujoco.mjtRndFlag.mjRND_SHADOW] = 0
        ctx.scn.flags[mujoco.mjtRndFlag.mjRND_REFLECTION] = 0
    name = os.path.join("libero", "libero", "bddl_files", spec.problem_folder, spec.bddl_file)
    return _Simulator(env, np.asarray(s.get_task_init_states(i)), spec.language, name)


def close_simulators() -> None:
    """Close every LIBERO env while the interpreter is whole: robosuite's EGL contexts otherwise print
    an EGLError from their destructors at exit. Runs before robosuite's own exit hook, which terminates
    the process's EGL display: `mw`'s renderers share that display, so they are closed here too."""
    while _SIMULATORS:
        _, sim = _SIMULATORS.popitem()
        sim.env.close()
    mw = sys.modules.get("heisd.benchmarks.mw")
    if mw is not None:
        mw._close_simulators()
    gc.collect()  # the render contexts die now, not during interpreter teardown
