"""The robot-side control loop of a delta-action policy served by `heisd serve`, at a fixed rate.

Per inference: the newest camera frame, the arm's pose (as `proprio` when the target takes a state:
[x, y, z in m, rx, ry, rz in rad, gripper opening in m]) and the end-effector positions since the
previous inference (`ee_pos`, for the kinematic switch) go to the server; the chunk that comes back
is executed one action per control tick. An action is [dx, dy, dz, gripper] (4 values) or
[dx, dy, dz, drx, dry, drz, gripper] (7): position deltas in units of `position_scale_m`, rotation
deltas in units of `rotation_scale_deg`, and a gripper value that closes the gripper above
`gripper_close_above`.

Each command is limited before it reaches the arm: the step's translation to `max_speed_mps` /
`rate_hz`, its rotation to `max_rotation_dps` / `rate_hz`, the target position to the workspace box.
The loop stops the arm and returns the reason on: a server error or no answer within
`request_timeout_s`, a non-finite action, arm feedback that is non-finite or older than
`feedback_timeout_s`, no camera frame within `camera_timeout_s`, or Ctrl-C.
"""

from __future__ import annotations

import time
import uuid
from dataclasses import asdict, dataclass, field
from typing import Callable

import numpy as np

from heisd.robots.arm import Arm, ArmState

STATE_DIM = 7  # proprio: position (3, m), rotation (3, rad), gripper opening (m)


@dataclass(frozen=True)
class Workspace:
    """The box the end effector's commanded position stays in (arm base frame, metres)."""

    low_m: tuple[float, float, float] = (0.10, -0.30, 0.05)
    high_m: tuple[float, float, float] = (0.50, 0.30, 0.45)

    def __post_init__(self) -> None:
        if not all(lo < hi for lo, hi in zip(self.low_m, self.high_m)):
            raise ValueError(f"the workspace's low corner must be below its high one on every axis, got {self}")


@dataclass(frozen=True)
class ControlConfig:
    rate_hz: float = 10.0  # control ticks per second (one action per tick)
    execute: int = 0  # actions executed per inference (0: the whole chunk)
    max_steps: int = 0  # ticks before the run ends (0: until stopped)
    position_scale_m: float = 0.01  # metres per unit of a position delta
    rotation_scale_deg: float = 5.0  # degrees per unit of a rotation delta (7-value actions)
    max_speed_mps: float = 0.05  # translation limit: a tick moves at most max_speed_mps / rate_hz
    max_rotation_dps: float = 30.0  # rotation limit per axis: at most max_rotation_dps / rate_hz a tick
    workspace: Workspace = field(default_factory=Workspace)
    gripper_open_m: float = 0.07  # opening commanded for "open"
    gripper_closed_m: float = 0.0  # opening commanded for "closed"
    gripper_close_above: float = 0.0  # an action's gripper value above this closes the gripper
    request_timeout_s: float = 2.0  # the server must answer an inference within this
    feedback_timeout_s: float = 0.5  # arm readings older than this stop the run
    camera_timeout_s: float = 0.5  # no camera frame newer than this stops the run

    def __post_init__(self) -> None:
        positive = ("rate_hz", "position_scale_m", "rotation_scale_deg", "max_speed_mps", "max_rotation_dps",
                    "request_timeout_s", "feedback_timeout_s", "camera_timeout_s")
        bad = [name for name in positive if not getattr(self, name) > 0]
        if bad or self.execute < 0 or self.max_steps < 0 or self.gripper_closed_m < 0 \
                or self.gripper_open_m < self.gripper_closed_m:
            raise ValueError(f"ControlConfig out of range ({', '.join(bad) or 'counts or gripper openings'}): {self}")


class Stop(Exception):
    """Why the loop stopped the arm (a fault, or Ctrl-C)."""


@dataclass
class LoopReport:
    ticks: int = 0  # actions executed
    inferences: int = 0
    stopped: str | None = None  # the fault or interrupt that stopped the run; None: max_steps reached
    overruns: int = 0  # ticks that started more than one period late (a slow server or machine)
    request_ms: list[float] = field(default_factory=list)  # each inference's round trip
    clipped: int = 0  # commands the speed or workspace limits changed

    def summary(self) -> dict:
        ms = np.asarray(self.request_ms)
        pct = lambda q: round(float(np.percentile(ms, q)), 3) if len(ms) else None  # noqa: E731
        return {**{k: v for k, v in asdict(self).items() if k != "request_ms"},
                "request_ms": {"p50": pct(50), "p90": pct(90), "max": pct(100)}}


def next_command(state: ArmState, action: np.ndarray, hold_rotation_deg: np.ndarray,
                 cfg: ControlConfig) -> tuple[np.ndarray, np.ndarray, float, bool]:
    """One action on the measured pose -> (position m, rotation deg, gripper m, whether a limit cut it).
    4-value actions keep the orientation at `hold_rotation_deg` (the episode's first)."""
    period = 1.0 / cfg.rate_hz
    delta = action[:3] * cfg.position_scale_m
    step_cap = cfg.max_speed_mps * period
    norm = float(np.linalg.norm(delta))
    clipped = norm > step_cap
    if clipped:
        delta = delta * (step_cap / norm)
    goal = state.position_m + delta
    bounded = np.clip(goal, cfg.workspace.low_m, cfg.workspace.high_m)
    clipped |= not np.array_equal(bounded, goal)
    if len(action) == 7:
        turn_cap = cfg.max_rotation_dps * period
        turn = action[3:6] * cfg.rotation_scale_deg
        clipped |= bool((np.abs(turn) > turn_cap).any())
        rotation = (state.rotation_deg + np.clip(turn, -turn_cap, turn_cap) + 180.0) % 360.0 - 180.0
    else:
        rotation = hold_rotation_deg
    gripper = cfg.gripper_closed_m if action[-1] > cfg.gripper_close_above else cfg.gripper_open_m
    return bounded, rotation, gripper, clipped


def proprio(state: ArmState) -> np.ndarray:
    return np.concatenate([state.position_m, np.deg2rad(state.rotation_deg), [state.gripper_m]]).astype(np.float32)


def run_loop(arm: Arm, frame: Callable[[float], np.ndarray], client, instruction: str, cfg: ControlConfig,
             *, task: str | None = None, takes_state: bool = False, action_dim: int = 7,
             clock: Callable[[], float] = time.monotonic, sleep: Callable[[float], None] = time.sleep) -> LoopReport:
    """Run one episode on a connected `arm`; `frame(max_age_s)` gives the newest camera frame (or
    raises); `client`: a `heisd.client` client (REST or websocket) whose timeout is the request's.
    The arm is stopped on every way out."""
    from heisd.client import ServerError, ServerUnreachable
    from heisd.robots.camera import CameraTimeout

    if action_dim not in (4, 7):
        raise ValueError(f"the target's actions have {action_dim} values; this loop drives 4 (xyz + gripper) "
                         "or 7 (xyz + rotation + gripper)")
    report, episode = LoopReport(), f"robot-{uuid.uuid4().hex[:12]}"
    period = 1.0 / cfg.rate_hz
    try:
        state = _checked(arm.read(), cfg)
        hold = state.rotation_deg.copy()
        path = [state.position_m]
        next_tick = clock()
        while not cfg.max_steps or report.ticks < cfg.max_steps:
            image = frame(cfg.camera_timeout_s)
            t0 = clock()
            try:
                step = client.act(image, instruction, proprio=proprio(state) if takes_state else None,
                                  ee_pos=np.stack(path), episode_id=episode, reset=report.inferences == 0, task=task)
            except (ServerError, ServerUnreachable) as err:
                raise Stop(f"server: {err}") from None
            report.request_ms.append((clock() - t0) * 1e3)
            report.inferences += 1
            actions = np.asarray(step.actions, dtype=np.float64)
            if actions.ndim != 2 or actions.shape[1] != action_dim:
                raise Stop(f"server: actions of shape {list(actions.shape)}, expected [chunk, {action_dim}]")
            if not np.isfinite(actions).all():
                raise Stop(f"non-finite action from the server: {actions.tolist()}")
            path = []
            for k, action in enumerate(actions[: cfg.execute or None]):
                if cfg.max_steps and report.ticks >= cfg.max_steps:
                    break
                late = clock() - next_tick
                if late > period:  # behind by a whole tick: start again from now, do not rush
                    report.overruns += 1
                    next_tick = clock()
                elif late < 0:
                    sleep(-late)
                state = _checked(arm.read(), cfg)
                if k:
                    path.append(state.position_m)  # where the previous action took the arm
                position, rotation, gripper, clipped = next_command(state, action, hold, cfg)
                arm.command(position, rotation, gripper)
                report.clipped += clipped
                report.ticks += 1
                next_tick += period
            state = _checked(arm.read(), cfg)
            path.append(state.position_m)
    except Stop as err:
        report.stopped = str(err)
    except CameraTimeout as err:
        report.stopped = f"camera: {err}"
    except KeyboardInterrupt:
        report.stopped = "interrupted (Ctrl-C)"
    finally:
        arm.stop()
    if report.inferences:
        try:
            client.end(episode, success=None)
        except (ServerError, ServerUnreachable):
            pass  # the server is the fault we stopped for; its episode expires there
    return report


def _checked(state: ArmState, cfg: ControlConfig) -> ArmState:
    if not state.finite:
        raise Stop(f"arm feedback is not finite: position {state.position_m.tolist()}, "
                   f"rotation {state.rotation_deg.tolist()}, gripper {state.gripper_m}")
    if state.age_s > cfg.feedback_timeout_s:
        raise Stop(f"arm feedback is {state.age_s:.2f} s old (limit {cfg.feedback_timeout_s:g} s): link lost?")
    return state
