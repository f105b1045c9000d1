"""Scripted experts for LIBERO-Object: pick the task's object, place it in the basket.

The expert reads the scene from the simulator (`SceneReader`: end effector, the goal's object and
the region it must end in, from the task's BDDL goal `(In <object> <region>)`, and the other
objects) and drives LIBERO's OSC_POSE controller with 7-D delta actions: xyz proportional to the
end-effector position error (clipped to the controller's [-1, 1]; 1 = 5 cm), a yaw about world z
toward the grasp yaw (`choose_yaw`: the start orientation, fingers across the items' narrow side,
unless the hand, 21 cm long along the finger axis, would hit a neighbouring object, as it hits the
tomato sauce beside the cream cheese in some layouts), gripper -1 open / +1 close. A phase machine
(`Phase`) moves above the object, descends, closes, lifts, carries above the region, lowers, opens
and retreats; a grasp that lost the object goes back to the approach, so noisy (DART) rollouts
show recoveries.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

import numpy as np

from heisd.benchmarks.libero_protocol import ACTION_DIM
from heisd.errors import UsageError

EXPERT_SUITES = ("libero_object",)  # suites with scripted experts


@dataclass(frozen=True)
class ExpertConfig:
    gain: float = 12.0  # xyz action per metre of position error (action 1 = the controller's 5 cm)
    hover: float = 0.06  # approach height of the end effector above the object's top, m
    carry_z: float = 0.30  # end-effector height while carrying, m (clears the basket rim with tall objects)
    grasp_depth: float = 0.5  # grasp point height as a fraction of the object's height above its bottom
    finger_reach: float = 0.03  # deepest grasp below the object's top: the palm sits ~4.5 cm above the tips, m
    floor_clearance: float = 0.012  # lowest end-effector height: the finger tips stay off the floor, m
    place_above: float = 0.05  # release height of the object's bottom above the region's centre, m
    tolerance: float = 0.01  # position error that ends a move phase, m
    close_steps: int = 12  # steps with the gripper closing before lifting
    open_steps: int = 10  # steps with the gripper opening before retreating
    lost_distance: float = 0.05  # object centre this far from the hand while carrying = grasp lost, m
    yaw_gain: float = 1.5  # rotation action per radian of yaw error (action 1 = the controller's 0.5 rad)
    yaw_tolerance: float = 0.05  # yaw error that ends the approach, rad
    max_yaw: float = 0.8  # largest grasp yaw considered, rad
    opening: float = 0.07  # widest object section the open fingers take, m (Panda: 8 cm, less a margin)
    hand_half_length: float = 0.105  # the hand's extent from the grasp point along the finger axis, m
    hand_half_width: float = 0.035  # ... across it, m
    hand_bottom: float = 0.03  # height of the hand's body (not the fingers) above the end effector, m
    clearance: float = 0.01  # wanted gap between the hand and any neighbouring object, m


class Phase(enum.Enum):
    ABOVE = "above"  # move over the object at the approach height, gripper open
    DESCEND = "descend"  # down to the grasp point
    CLOSE = "close"  # hold still while the fingers close
    LIFT = "lift"  # straight up to the carry height
    CARRY = "carry"  # over the region at the carry height
    LOWER = "lower"  # down to the release height
    RELEASE = "release"  # hold still while the fingers open
    RETREAT = "retreat"  # back up, gripper open, until the episode ends


@dataclass(frozen=True)
class Scene:
    """What the expert reads each step (world frame, metres)."""

    eef: np.ndarray  # (3,) end-effector position (robot0_eef_pos)
    object_center: np.ndarray  # (3,) centre of the object's bounding box
    object_bottom: float  # lowest z of the object
    object_top: float  # highest z of the object
    place: np.ndarray  # (3,) centre of the region the object must end in
    yaw: float = 0.0  # finger axis angle about +z from the world y axis, rad
    object_half: np.ndarray = field(default_factory=lambda: np.zeros(2))  # object's xy half extents, m
    obstacles: np.ndarray = field(default_factory=lambda: np.zeros((0, 4)))  # other objects: x, y, radius, top


def hand_clearance(yaw: float, grasp: np.ndarray, obstacles: np.ndarray, c: ExpertConfig) -> float:
    """Smallest horizontal gap between the hand's footprint at the grasp (a rectangle along the finger
    axis) and the objects tall enough to reach the hand's body there; inf if none is."""
    tall = obstacles[obstacles[:, 3] > grasp[2] + c.hand_bottom]
    if not len(tall):
        return float("inf")
    axis = np.array([-np.sin(yaw), np.cos(yaw)])  # finger axis
    across = np.array([axis[1], -axis[0]])
    rel = tall[:, :2] - grasp[:2]
    along_d = np.maximum(np.abs(rel @ axis) - c.hand_half_length, 0.0)
    across_d = np.maximum(np.abs(rel @ across) - c.hand_half_width, 0.0)
    return float((np.hypot(along_d, across_d) - tall[:, 2]).min())


def choose_yaw(grasp: np.ndarray, object_half: np.ndarray, obstacles: np.ndarray, c: ExpertConfig) -> float:
    """The grasp yaw closest to 0 whose finger span takes the object and whose hand clears the
    neighbours by `clearance`; if none does, the one with the most clearance."""
    best, best_gap = 0.0, -np.inf
    for yaw in sorted(np.arange(-16, 17) * c.max_yaw / 16, key=abs):  # 0 first, then ever larger turns
        span = 2 * (object_half[0] * abs(np.sin(yaw)) + object_half[1] * abs(np.cos(yaw)))
        if span > c.opening and yaw != 0.0:
            continue
        gap = hand_clearance(yaw, grasp, obstacles, c)
        if gap >= c.clearance:
            return float(yaw)
        if gap > best_gap:
            best, best_gap = float(yaw), gap
    return best


@dataclass
class PickPlaceExpert:
    """One episode's expert (it keeps the episode's phase): call `act(scene)` each step."""

    config: ExpertConfig = ExpertConfig()
    phase: Phase = Phase.ABOVE
    _count: int = 0  # steps spent in a timed phase (CLOSE, RELEASE)
    _grasp: np.ndarray | None = field(default=None, repr=False)  # grasp point fixed when DESCEND starts
    _offset: float = 0.0  # object centre height minus end-effector height at the grasp
    _yaw: float | None = None  # grasp yaw, chosen on the approach

    def grasp_point(self, s: Scene) -> np.ndarray:
        c = self.config
        z = max(s.object_bottom + c.grasp_depth * (s.object_top - s.object_bottom), s.object_top - c.finger_reach)
        return np.array([s.object_center[0], s.object_center[1], max(z, c.floor_clearance)])

    def _held(self, s: Scene) -> bool:
        """The object moves with the hand: its centre stays where it was relative to the end effector."""
        expected = s.eef + np.array([0.0, 0.0, self._offset])
        return bool(np.linalg.norm(s.object_center - expected) < self.config.lost_distance)

    def act(self, s: Scene) -> np.ndarray:
        c = self.config
        if self._yaw is None:
            self._yaw = choose_yaw(self.grasp_point(s), s.object_half, s.obstacles, c)
        self._advance(s)
        gripper = 1.0 if self.phase in (Phase.CLOSE, Phase.LIFT, Phase.CARRY, Phase.LOWER) else -1.0
        action = np.zeros(ACTION_DIM)
        action[:3] = np.clip(c.gain * (self._target(s) - s.eef), -1.0, 1.0)
        action[5] = np.clip(c.yaw_gain * self._yaw_error(s), -1.0, 1.0)
        action[-1] = gripper
        return action

    def _yaw_error(self, s: Scene) -> float:
        return float((self._yaw - s.yaw + np.pi) % (2 * np.pi) - np.pi)

    def _advance(self, s: Scene) -> None:
        """Phase transitions, taken before acting so the action follows the new phase."""
        c = self.config
        reached = lambda: np.linalg.norm(self._target(s) - s.eef) < c.tolerance  # noqa: E731
        if self.phase is Phase.ABOVE and reached() and abs(self._yaw_error(s)) < c.yaw_tolerance:
            self.phase, self._grasp = Phase.DESCEND, self.grasp_point(s)
        elif self.phase is Phase.DESCEND and reached():
            self.phase, self._count = Phase.CLOSE, 0
        elif self.phase is Phase.CLOSE:
            self._count += 1
            if self._count >= c.close_steps:
                self.phase, self._offset = Phase.LIFT, float(s.object_center[2] - s.eef[2])
        elif self.phase in (Phase.LIFT, Phase.CARRY, Phase.LOWER) and not self._held(s):
            self.phase, self._grasp = Phase.ABOVE, None  # dropped or missed: open and approach again
        elif self.phase is Phase.LIFT and s.eef[2] > c.carry_z - 2 * c.tolerance:
            self.phase = Phase.CARRY
        elif self.phase is Phase.CARRY and np.linalg.norm((self._target(s) - s.eef)[:2]) < c.tolerance:
            self.phase = Phase.LOWER
        elif self.phase is Phase.LOWER and reached():
            self.phase, self._count = Phase.RELEASE, 0
        elif self.phase is Phase.RELEASE:
            self._count += 1
            if self._count >= c.open_steps:
                self.phase = Phase.RETREAT

    def _target(self, s: Scene) -> np.ndarray:
        c = self.config
        if self.phase is Phase.ABOVE:
            return np.array([s.object_center[0], s.object_center[1], s.object_top + c.hover])
        if self.phase in (Phase.DESCEND, Phase.CLOSE):
            return self._grasp
        if self.phase is Phase.LIFT:
            return np.array([s.eef[0], s.eef[1], c.carry_z])
        if self.phase is Phase.CARRY:
            return np.array([s.place[0], s.place[1], c.carry_z])
        if self.phase in (Phase.LOWER, Phase.RELEASE):
            # the object's bottom `place_above` over the region's centre; the hand holds it `-offset` lower
            half = s.object_center[2] - s.object_bottom
            return np.array([s.place[0], s.place[1], s.place[2] + c.place_above + half - self._offset])
        return np.array([s.eef[0], s.eef[1], c.carry_z])  # RETREAT


def check_expert_suite(suite: str) -> None:
    if suite not in EXPERT_SUITES:
        raise UsageError(f"there are no scripted experts for {suite} (only {', '.join(EXPERT_SUITES)}); build "
                         "datastores from LIBERO's own datasets (build-datastore --demos <task>_demo.hdf5)")


class SceneReader:
    """Reads a `Scene` from one LIBERO task's simulator. The object and region come from the BDDL goal."""

    def __init__(self, robosuite_env):
        self._env = robosuite_env
        goal = robosuite_env.parsed_problem["goal_state"]
        if len(goal) != 1 or goal[0][0].lower() != "in":
            raise UsageError(f"the scripted expert places one object in a region; this task's goal is {goal}")
        _, self.object_name, self.region_name = goal[0]
        sim = robosuite_env.sim
        self._geoms = {}  # object name -> its geoms
        for name, obj in robosuite_env.objects_dict.items():
            self._geoms[name] = np.flatnonzero(sim.model.geom_bodyid == sim.model.body_name2id(obj.root_body))
        self._site = sim.model.site_name2id(self.region_name)
        self._fingers = [sim.model.body_name2id(f"gripper0_{side}finger") for side in ("left", "right")]

    def _box(self, name: str) -> tuple[np.ndarray, np.ndarray]:
        """World-frame bounding box of an object's geoms (their local boxes rotated by the geom frames)."""
        sim, geoms = self._env.sim, self._geoms[name]
        rot = sim.data.geom_xmat[geoms].reshape(-1, 3, 3)
        box = sim.model.geom_aabb[geoms]
        centre = sim.data.geom_xpos[geoms] + np.einsum("nij,nj->ni", rot, box[:, :3])
        half = np.einsum("nij,nj->ni", np.abs(rot), box[:, 3:])
        return (centre - half).min(0), (centre + half).max(0)

    def __call__(self, eef: np.ndarray) -> Scene:
        sim = self._env.sim
        lo, hi = self._box(self.object_name)
        others = []
        for name in self._geoms:
            if name != self.object_name:
                olo, ohi = self._box(name)
                others.append([*(olo[:2] + ohi[:2]) / 2, np.linalg.norm(ohi[:2] - olo[:2]) / 2, ohi[2]])
        left, right = sim.data.body_xpos[self._fingers]
        d = right - left
        return Scene(eef=np.asarray(eef, dtype=np.float64), object_center=(lo + hi) / 2, object_bottom=float(lo[2]),
                     object_top=float(hi[2]), place=sim.data.site_xpos[self._site].copy(),
                     yaw=float(np.arctan2(-d[0], d[1])), object_half=(hi[:2] - lo[:2]) / 2,
                     obstacles=np.array(others).reshape(-1, 4))


def expert_actor(env):
    """The expert for one episode of a `LiberoEnv` just reset: `info` (with `ee_pos`) -> 7-D action."""
    reader, expert = SceneReader(env.simulator), PickPlaceExpert()
    return lambda info: expert.act(reader(info["ee_pos"]))
