"""Scripted LIBERO skills: phase machines that drive LIBERO's OSC_POSE controller with 7-D delta
actions from what the simulator says (a `Scene`: world frame, metres).

Every skill moves the end effector with xyz proportional to its position error (clipped to the
controller's [-1, 1]; 1 = 5 cm), turns it about world z toward a wanted yaw, and sets the gripper
(-1 open, +1 close). `PickPlace` grasps an object (fingers across its narrow side, or across the
wall of a bowl too wide for the fingers), carries it and releases it over a place; `Drawer` pulls
or pushes a handle along the drawer's axis; `Knob` sweeps the fingers past a knob's lever; `Push`
slides a flat object to a place with the closed fingers. `heisd.benchmarks.libero_plan` chooses
and orders them from a task's BDDL goal; `heisd.benchmarks.libero_experts` reads the scenes.
"""

from __future__ import annotations

import enum
import heapq
from dataclasses import dataclass, field

import numpy as np

from heisd.benchmarks.libero_protocol import ACTION_DIM


def _tick(skill, steps: int) -> bool:
    """One more step in a timed phase (the skill's `_count`); True once it has lasted `steps`."""
    skill._count += 1
    return skill._count >= steps


@dataclass(frozen=True)
class ExpertConfig:
    gain: float = 12.0  # xyz action per metre of position error (action 1 = the controller's 5 cm)
    hover: float = 0.06  # approach height of the end effector above the object's top, m
    carry_z: float = 0.30  # end-effector height above the floor while carrying, m (clears the basket rim)
    carry_clear: float = 0.04  # ... and at least this far above the release height, m
    grasp_depth: float = 0.5  # grasp point height as a fraction of the object's height above its bottom
    finger_reach: float = 0.03  # deepest grasp below the object's top: the palm sits ~4.5 cm above the tips, m
    top_depth: float = 0.005  # grasp depth below the top of an object too wide for the fingers (a moka pot), m
    rim_width: float = 0.085  # narrowest footprint grasped by its wall, m (the Panda opens 8 cm; cans are 7)
    rim_inset: float = 0.012  # a bowl's wall centre inside its outer edge, m
    floor_clearance: float = 0.012  # lowest end-effector height above the floor: the finger tips stay off it, m
    tolerance: float = 0.01  # position error that ends a move phase, m
    close_steps: int = 12  # steps with the gripper closing before lifting
    stall_steps: int = 10  # steps held just short of the grasp point before closing there
    open_steps: int = 10  # steps with the gripper opening before retreating
    lost_distance: float = 0.05  # object centre this far from where the grasp holds it = grasp lost, m
    lifted: float = 0.02  # object bottom this far above where it rested, the hand over it = in the hand, m
    over_margin: float = 0.02  # "over it": the end effector within the object's footprint grown by this, m
    yaw_gain: float = 1.5  # rotation action per radian of yaw error (action 1 = the controller's 0.5 rad)
    yaw_tolerance: float = 0.05  # yaw error that ends the approach, rad
    # a held object is turned to fit its place only if that cuts its overhang by more than this, m: a
    # turn that changes nothing still goes one way or the other by the grasp's yaw, and a target
    # trained on both makes the wrong one (LIBERO-Goal's wine bottle tipped off the rack)
    turn_gain: float = 0.002
    max_yaw: float = np.pi / 2  # largest grasp yaw considered, rad (the hand is symmetric: a half turn covers all)
    yaw_steps: int = 32  # grasp yaws tried on each side of 0
    opening: float = 0.07  # widest object section the open fingers take, m (Panda: 8 cm, less a margin)
    hand_half_length: float = 0.105  # the hand's extent from the grasp point along the finger axis, m
    hand_half_width: float = 0.035  # ... across it, m
    hand_bottom: float = 0.03  # height of the hand's body (not the fingers) above the end effector, m
    finger_offset: float = 0.05  # an open finger's centre from the grasp point along the finger axis, m
    finger_half: float = 0.01  # ... and its half size, m
    clearance: float = 0.01  # wanted gap between the hand and any neighbouring object, m
    long_box: float = 0.01  # half length minus half width above which a box may be grasped off its centre, m
    pad_margin: float = 0.015  # an off-centre grasp keeps the finger pads this far inside the box's ends, m
    grasp_shifts: int = 4  # off-centre grasp points tried on each side of the centre
    # steps a finished skill backs off before the next one starts (a pick-and-place backs off until the hand
    # is at its carrying height, at most three times this)
    retreat_steps: int = 15


def _move(c: ExpertConfig, target: np.ndarray, eef: np.ndarray, yaw_error: float, gripper: float,
          limit: float = 1.0) -> np.ndarray:
    action = np.zeros(ACTION_DIM)
    action[:3] = np.clip(c.gain * (target - eef), -limit, limit)
    action[5] = np.clip(c.yaw_gain * yaw_error, -1.0, 1.0)
    action[-1] = gripper
    return action


def _angle(a: float) -> float:
    return float((a + np.pi) % (2 * np.pi) - np.pi)


# --- pick and place -------------------------------------------------------------------------------

class Phase(enum.Enum):
    ABOVE = "above"  # move over the grasp point at the approach height, gripper open
    DESCEND = "descend"  # down to the grasp point
    CLOSE = "close"  # hold still while the fingers close
    LIFT = "lift"  # straight up to the carry height
    CARRY = "carry"  # over the place at the carry height
    LOWER = "lower"  # down to the release height
    RELEASE = "release"  # hold still while the fingers open
    RETREAT = "retreat"  # back up, gripper open


@dataclass(frozen=True)
class Scene:
    """What `PickPlace` reads each step (world frame, metres)."""

    eef: np.ndarray  # (3,) end-effector position (robot0_eef_pos)
    object_center: np.ndarray  # (3,) centre of the object's bounding box
    object_bottom: float  # lowest z of the object
    object_top: float  # highest z of the object
    place: np.ndarray  # (3,) where the object's bounding-box centre goes (xy) and its bottom's release height (z)
    yaw: float = 0.0  # finger axis angle about +z from the world y axis, rad
    object_half: np.ndarray = field(default_factory=lambda: np.zeros(2))  # object's xy half extents, m
    # other objects (x, y, footprint radius, top) and points on the fixtures' parts (radius 0)
    obstacles: np.ndarray = field(default_factory=lambda: np.zeros((0, 4)))
    floor: float = 0.0  # height of the surface the scene stands on (table or floor), m
    place_half: np.ndarray | None = None  # xy half extents (world axes) of the region it goes in or on, if one


def place_turn(object_half: np.ndarray, place_half: np.ndarray | None, min_gain: float = 0.0) -> bool:
    """Turn the held object a quarter about z before it goes down: turned, it sticks out of the region
    less by more than `min_gain` (a book held with its long side across the caddy's narrow compartment;
    not a round bottle, whose box is square within a millimetre)."""
    if place_half is None:
        return False
    overflow = lambda half: float(np.maximum(half - place_half, 0.0).sum())  # noqa: E731
    return overflow(object_half[::-1]) < overflow(object_half) - min_gain


def finger_axis(yaw: float) -> np.ndarray:
    """The xy unit vector along the finger axis at `yaw` (0: along world y)."""
    return np.array([-np.sin(yaw), np.cos(yaw)])


def _rect_gaps(centre: np.ndarray, yaw: float, half_along: float, half_across: float,
               obstacles: np.ndarray) -> np.ndarray:
    """Signed horizontal gap between a rectangle along the finger axis at `yaw` and each obstacle's disc
    (negative inside, by how deep: the least-bad grasp overlaps least)."""
    axis = finger_axis(yaw)
    across = np.array([axis[1], -axis[0]])
    rel = obstacles[:, :2] - centre[:2]
    along_d = np.abs(rel @ axis) - half_along
    across_d = np.abs(rel @ across) - half_across
    outside = np.hypot(np.maximum(along_d, 0.0), np.maximum(across_d, 0.0))
    inside = np.minimum(np.maximum(along_d, across_d), 0.0)
    return outside + inside - obstacles[:, 2]


def hand_clearance(yaw: float, grasp: np.ndarray, obstacles: np.ndarray, c: ExpertConfig) -> float:
    """Smallest horizontal gap between the hand at the grasp and its neighbours (negative: overlapping;
    inf if none is near): the hand's body (a rectangle along the finger axis) against what reaches up to
    it, and the two open finger tips against what stands higher than the grasp point (a can beside the
    can grasped: the hand's body clears it, a finger lands on it)."""
    gaps = [np.inf]
    tall = obstacles[obstacles[:, 3] > grasp[2] + c.hand_bottom]
    if len(tall):
        gaps.append(_rect_gaps(grasp, yaw, c.hand_half_length, c.hand_half_width, tall).min())
    beside = obstacles[obstacles[:, 3] > grasp[2]]
    if len(beside):
        axis = finger_axis(yaw)
        for side in (-1.0, 1.0):
            tip = grasp[:2] + side * c.finger_offset * axis
            gaps.append(_rect_gaps(tip, yaw, c.finger_half, c.finger_half, beside).min())
    return float(min(gaps))


def choose_yaw(grasp: np.ndarray, object_half: np.ndarray, obstacles: np.ndarray,
               c: ExpertConfig) -> tuple[float, float]:
    """(yaw, clearance): the grasp yaw closest to 0 whose finger span takes the object and whose hand
    clears the neighbours by `clearance`; if none does, the one with the most clearance."""
    best, best_gap = 0.0, -np.inf
    for yaw in sorted(np.arange(-c.yaw_steps, c.yaw_steps + 1) * c.max_yaw / c.yaw_steps, key=abs):  # 0 first
        span = 2 * (object_half[0] * abs(np.sin(yaw)) + object_half[1] * abs(np.cos(yaw)))
        if span > c.opening and yaw != 0.0:
            continue
        gap = hand_clearance(yaw, grasp, obstacles, c)
        if gap >= c.clearance:
            return float(yaw), gap
        if gap > best_gap:
            best, best_gap = float(yaw), gap
    return best, best_gap


def choose_grasp(centre: np.ndarray, object_half: np.ndarray, obstacles: np.ndarray,
                 c: ExpertConfig) -> tuple[np.ndarray, float]:
    """(grasp point, yaw): the centre at `choose_yaw`'s yaw; if that hand meets a neighbour and the object
    is a long box (cream cheese among bottles), points along its long side, nearest the centre first,
    keeping the finger pads `pad_margin` inside its ends; else the one with the most clearance."""
    long_axis = int(np.argmax(object_half))
    reach = object_half[long_axis] - c.pad_margin
    shifts = [0.0]
    if object_half[long_axis] - object_half[1 - long_axis] > c.long_box and reach > 0:
        shifts += sorted(np.linspace(-reach, reach, 2 * c.grasp_shifts + 1), key=abs)[1:]
    best = (centre, 0.0, -np.inf)
    for shift in shifts:
        grasp = centre.copy()
        grasp[long_axis] += shift
        yaw, gap = choose_yaw(grasp, object_half, obstacles, c)
        if gap >= c.clearance:
            return grasp, yaw
        if gap > best[2]:
            best = (grasp, yaw, gap)
    return best[0], best[1]


def approach_height(s: Scene, grasp: np.ndarray, c: ExpertConfig) -> float:
    """End-effector height over the grasp before the descent: `hover` above the object, and the hand's body
    above every neighbour within its reach there (coming in lower, it knocks a tall carton over)."""
    near = s.obstacles[np.hypot(*(s.obstacles[:, :2] - grasp[:2]).T) < c.hand_half_length + s.obstacles[:, 2]]
    tops = near[:, 3] - c.hand_bottom + c.clearance
    return float(np.max(tops, initial=s.object_top + c.hover))


def transit_height(s: Scene, goal: np.ndarray, c: ExpertConfig) -> float:
    """Lowest end-effector height on the way over to `goal` (xy) that keeps the hanging fingers over what
    stands within the hand's reach of the path, until the hand is over the goal (then `approach_height`
    lets them down between the neighbours): coming down on the way, the fingers swept an open microwave
    door shut and knocked over a milk carton beside the cream cheese."""
    start, seg = s.eef[:2], goal[:2] - s.eef[:2]
    if np.linalg.norm(seg) < 2 * c.tolerance:
        return -np.inf
    xy, radius = s.obstacles[:, :2], s.obstacles[:, 2]
    t = np.clip((xy - start) @ seg / max(seg @ seg, 1e-12), 0.0, 1.0)
    on_path = np.hypot(*(xy - start - t[:, None] * seg).T) < c.hand_half_length + radius
    return float(np.max(s.obstacles[on_path, 3] + c.clearance + c.finger_half, initial=-np.inf))


def is_rim_grasp(object_half: np.ndarray, c: ExpertConfig) -> bool:
    """Too wide for the open fingers either way (a bowl): the fingers take its wall instead."""
    return bool(2 * object_half.min() > c.rim_width)


def rim_points(s: Scene, c: ExpertConfig) -> list[tuple[np.ndarray, float]]:
    """(grasp point, yaw) on a bowl's wall where the fingers straddle it, closing along the radius,
    `finger_reach` below the rim: its sides in y first (yaw 0), then the diagonals, the two at yaw +45°
    before the two at -45°, then x. The diagonals by the sign of their turn: in an order that
    alternated it, which one first cleared the hand flipped the grasp between +45° and -45° (and -90°)
    from one layout to the next, a choice no camera can see (BENCHMARKS 18.21)."""
    z = max(s.object_top - c.finger_reach, s.floor + c.floor_clearance)
    (x, y), (hx, hy) = s.object_center[:2], s.object_half - c.rim_inset
    out = []
    for phi in np.radians([90, -90, 135, -45, 45, -135, 0, 180]):
        yaw = _angle(phi - np.pi / 2)
        yaw = _angle(yaw + np.pi) if abs(yaw) > np.pi / 2 + 1e-9 else yaw  # the hand is symmetric
        out.append((np.array([x + hx * np.cos(phi), y + hy * np.sin(phi), z]), float(yaw)))
    return out


def choose_rim(s: Scene, c: ExpertConfig) -> tuple[np.ndarray, float]:
    """The first wall grasp whose hand clears everything by `clearance` (the hand is 21 cm long: an
    open drawer beside the bowl blocks the sides in y); if none does, the one with the most clearance."""
    options = rim_points(s, c)
    gaps = [hand_clearance(yaw, g, s.obstacles, c) for g, yaw in options]
    clear = [i for i, gap in enumerate(gaps) if gap >= c.clearance]
    return options[clear[0] if clear else int(np.argmax(gaps))]


@dataclass
class PickPlace:
    """One pick-and-place (it keeps its phase): call `act(scene)` each step until `done`."""

    config: ExpertConfig = ExpertConfig()
    phase: Phase = Phase.ABOVE
    done: bool = False
    _count: int = 0  # steps spent in a timed phase (CLOSE, RELEASE, RETREAT) or stalled in DESCEND
    _grasp: np.ndarray | None = field(default=None, repr=False)  # grasp point, fixed on the approach
    _offset: np.ndarray = field(default_factory=lambda: np.zeros(3), repr=False)  # object centre - eef, held
    _yaw: float | None = None  # grasp yaw, chosen on the approach
    _turn: float = 0.0  # how far the hand turns the held object before lowering it, rad
    _rest: float = np.inf  # lowest object bottom seen since the grasp was chosen, m

    def grasp_point(self, s: Scene) -> np.ndarray:
        return self._grasp_and_yaw(s)[0]

    def _grasp_and_yaw(self, s: Scene) -> tuple[np.ndarray, float]:
        c = self.config
        if is_rim_grasp(s.object_half, c):
            return choose_rim(s, c)
        z = max(s.object_bottom + c.grasp_depth * (s.object_top - s.object_bottom), s.object_top - c.finger_reach)
        if 2 * s.object_half.min() > c.opening:  # the body does not fit the open fingers: take its top (a lid's knob)
            z = s.object_top - c.top_depth
        grasp = np.array([s.object_center[0], s.object_center[1], max(z, s.floor + c.floor_clearance)])
        return choose_grasp(grasp, s.object_half, s.obstacles, c)

    def _stalled(self, s: Scene) -> bool:
        """`stall_steps` steps within twice the tolerance of the grasp: something holds the hand there (a bowl's
        far rim under the hand's body, 1.4 cm short of a wall grasp): the fingers close where they are."""
        c = self.config
        return bool(np.linalg.norm(self._grasp - s.eef) < 2 * c.tolerance) and _tick(self, c.stall_steps)

    def _held(self, s: Scene) -> bool:
        """The object moves with the hand: its centre stays where it was relative to the end effector."""
        return bool(np.linalg.norm(s.object_center - (s.eef + self._held_offset(s))) < self.config.lost_distance)

    def _in_hand(self, s: Scene) -> bool:
        """The object has risen off where it rested with the hand over it: something else grasped it (a
        target acting while the expert only labels, DAgger) before this phase machine got there."""
        c = self.config
        over = np.all(np.abs(s.eef[:2] - s.object_center[:2]) <= s.object_half + c.over_margin)
        return bool(over and s.object_bottom > self._rest + c.lifted)

    def act(self, s: Scene) -> np.ndarray:
        c = self.config
        if self._grasp is None:
            self._choose(s)
        if self.phase in (Phase.ABOVE, Phase.DESCEND, Phase.CLOSE):
            self._rest = min(self._rest, s.object_bottom)  # a dropped object falls: its rest follows it down
        self._advance(s)
        gripper = 1.0 if self.phase in (Phase.CLOSE, Phase.LIFT, Phase.CARRY, Phase.LOWER) else -1.0
        return _move(c, self._target(s), s.eef, self._yaw_error(s), gripper)

    def _choose(self, s: Scene) -> None:
        """The grasp point and yaw, and the turn the held object takes to fit its place: a quarter back
        through yaw 0 where the grasp is turned already (the wrist turns least)."""
        self._grasp, yaw = self._grasp_and_yaw(s)
        self._rest = s.object_bottom
        self._hold_at(s, yaw)

    def _hold_at(self, s: Scene, yaw: float) -> None:
        """The yaw the object is (to be) held at, from which `_held_offset` turns the offset taken at the grasp
        and the carry turns the object; and that turn, a quarter back through yaw 0 from it."""
        self._yaw = yaw
        turn = place_turn(s.object_half, s.place_half, self.config.turn_gain)
        self._turn = -np.sign(yaw or 1.0) * np.pi / 2 if turn else 0.0

    def _yaw_error(self, s: Scene) -> float:
        turned = self.phase in (Phase.CARRY, Phase.LOWER, Phase.RELEASE, Phase.RETREAT)
        return _angle(self._yaw + (self._turn if turned else 0.0) - s.yaw)

    def _held_offset(self, s: Scene) -> np.ndarray:
        """Object centre - end effector now: the offset taken at the grasp, turned as the hand turned since."""
        return rotation(np.array([0.0, 0.0, 1.0]), _angle(s.yaw - self._yaw)) @ self._offset

    def _carry_z(self, s: Scene) -> float:
        """End-effector height while carrying: `carry_z` over the floor, `carry_clear` over the release, and
        the held object's bottom `carry_clear` over the walls around the place (a caddy compartment's; a
        roof higher than the object will stand, the microwave's, is not a wall)."""
        c = self.config
        height = s.object_top - s.object_bottom
        reach = np.linalg.norm(s.object_half) + s.obstacles[:, 2] + c.clearance
        near = np.hypot(*(s.obstacles[:, :2] - s.place[:2]).T) < reach
        walls = s.obstacles[near & (s.obstacles[:, 3] < s.place[2] + height), 3]
        hang = s.object_center[2] - s.object_bottom - self._offset[2]  # end effector above the held object's bottom
        return max(s.floor + c.carry_z, self._release(s)[2] + c.carry_clear,
                   np.max(walls, initial=-np.inf) + c.carry_clear + hang)

    def _release(self, s: Scene) -> np.ndarray:
        # the object's bottom at the place's height, centre over it; the hand holds it `-offset` away
        half = s.object_center[2] - s.object_bottom
        return s.place + np.array([0.0, 0.0, half]) - self._held_offset(s)

    def _advance(self, s: Scene) -> None:
        """Phase transitions, taken before acting so the action follows the new phase."""
        c = self.config
        reached = lambda: np.linalg.norm(self._target(s) - s.eef) < c.tolerance  # noqa: E731
        if self.phase in (Phase.ABOVE, Phase.DESCEND, Phase.CLOSE) and self._in_hand(s):
            # labels follow the hand that holds it (carry it, never "open, go back over where it stood"), at the
            # yaw it holds it: turned from the yaw chosen here, the offset would turn away from the object
            # (a bowl's wall grasp, 6 cm off its centre: "lost" at 50 degrees) and the labels say "regrasp"
            self.phase, self._offset = Phase.LIFT, s.object_center - s.eef
            self._hold_at(s, s.yaw)
        elif self.phase is Phase.ABOVE and reached() and abs(self._yaw_error(s)) < c.yaw_tolerance:
            self.phase, self._count = Phase.DESCEND, 0
        elif self.phase is Phase.DESCEND and (reached() or self._stalled(s)):
            self.phase, self._count = Phase.CLOSE, 0
        elif self.phase is Phase.CLOSE:
            if _tick(self, c.close_steps):
                self.phase, self._offset = Phase.LIFT, s.object_center - s.eef
        elif self.phase in (Phase.LIFT, Phase.CARRY, Phase.LOWER) and not self._held(s):
            self.phase = Phase.ABOVE  # dropped or missed: grasp it again, chosen anew
            self._choose(s)
        elif self.phase is Phase.LIFT and self._up(s):
            self.phase = Phase.CARRY
        elif self.phase is Phase.CARRY and np.linalg.norm((self._target(s) - s.eef)[:2]) < c.tolerance \
                and abs(self._yaw_error(s)) < c.yaw_tolerance:
            self.phase = Phase.LOWER
        elif self.phase is Phase.LOWER and reached():
            self.phase, self._count = Phase.RELEASE, 0
        elif self.phase is Phase.RELEASE:
            if _tick(self, c.open_steps):
                self.phase, self._count = Phase.RETREAT, 0
        elif self.phase is Phase.RETREAT:
            # done when up, not after `retreat_steps`: a target cannot see the time, and one that went
            # on up to where no timed retreat had got sat there, its labels "up" fading to nothing (18.27)
            self.done = self._up(s) or _tick(self, 3 * c.retreat_steps)

    def _up(self, s: Scene) -> bool:
        """The hand is at its carrying height (within twice the tolerance: the approach slows near it)."""
        return bool(s.eef[2] > self._carry_z(s) - 2 * self.config.tolerance)

    def _target(self, s: Scene) -> np.ndarray:
        c = self.config
        if self.phase is Phase.ABOVE:
            z = max(approach_height(s, self._grasp, c), transit_height(s, self._grasp, c))
            return np.array([self._grasp[0], self._grasp[1], z])
        if self.phase in (Phase.DESCEND, Phase.CLOSE):
            return self._grasp
        if self.phase is Phase.LIFT:
            return np.array([s.eef[0], s.eef[1], self._carry_z(s)])
        release = self._release(s)
        if self.phase is Phase.CARRY:
            return np.array([release[0], release[1], self._carry_z(s)])
        if self.phase in (Phase.LOWER, Phase.RELEASE):
            return release
        return np.array([s.eef[0], s.eef[1], self._carry_z(s)])  # RETREAT


# --- turning a knob -------------------------------------------------------------------------------

@dataclass(frozen=True)
class KnobScene:
    """What `TurnKnob` reads: the knob's top part and how far it still has to turn (about +z)."""

    eef: np.ndarray  # (3,)
    yaw: float  # finger axis angle, as in `Scene`
    knob: np.ndarray  # (3,) centre of the knob's grip (its highest part), world
    knob_top: float  # its top, m
    knob_half: np.ndarray  # (2,) its xy half extents, m
    pivot: np.ndarray  # (2,) xy of the knob's hinge axis (vertical)
    turned: float  # the hinge's angle now, rad
    goal: float  # the angle to reach (a margin past LIBERO's "on" threshold), rad


class KnobPhase(enum.Enum):
    ABOVE = "above"
    DESCEND = "descend"
    CLOSE = "close"
    TURN = "turn"  # rotate the hand about z with the knob, the grasp point circling the hinge
    RELEASE = "release"
    RETREAT = "retreat"


@dataclass
class TurnKnob:
    config: ExpertConfig = ExpertConfig()
    turn_speed: float = 0.4  # rotation action while turning (0.2 rad a step)
    phase: KnobPhase = KnobPhase.ABOVE
    done: bool = False
    _count: int = 0
    _yaw: float | None = None
    _grasp: np.ndarray | None = field(default=None, repr=False)
    _start: float = 0.0  # hinge angle when the fingers closed

    def act(self, s: KnobScene) -> np.ndarray:
        c = self.config
        if self._grasp is None:
            z = max(s.knob_top - c.finger_reach / 2, s.knob[2])
            self._grasp = np.array([s.knob[0], s.knob[1], z])
            self._yaw = 0.0 if 2 * s.knob_half[1] <= c.opening else np.pi / 2  # fingers across its narrow side
        self._advance(s)
        target, gripper, yaw_error = self._target(s), -1.0, _angle(self._yaw - s.yaw)
        if self.phase in (KnobPhase.CLOSE, KnobPhase.TURN):
            gripper = 1.0
        action = _move(c, target, s.eef, yaw_error, gripper)
        if self.phase is KnobPhase.TURN:
            action[5] = self.turn_speed
        return action

    def _advance(self, s: KnobScene) -> None:
        c = self.config
        reached = lambda: np.linalg.norm(self._target(s) - s.eef) < c.tolerance  # noqa: E731
        if self.phase is KnobPhase.ABOVE and reached() and abs(_angle(self._yaw - s.yaw)) < c.yaw_tolerance:
            self.phase = KnobPhase.DESCEND
        elif self.phase is KnobPhase.DESCEND and reached():
            self.phase, self._count = KnobPhase.CLOSE, 0
        elif self.phase is KnobPhase.CLOSE:
            if _tick(self, c.close_steps):
                self.phase, self._start = KnobPhase.TURN, s.turned
        elif self.phase is KnobPhase.TURN and s.turned >= s.goal:
            self.phase, self._count = KnobPhase.RELEASE, 0
        elif self.phase is KnobPhase.RELEASE:
            if _tick(self, c.open_steps):
                self.phase, self._count = KnobPhase.RETREAT, 0
        elif self.phase is KnobPhase.RETREAT:
            self.done = _tick(self, c.retreat_steps)

    def _target(self, s: KnobScene) -> np.ndarray:
        c = self.config
        if self.phase is KnobPhase.ABOVE:
            return np.array([self._grasp[0], self._grasp[1], s.knob_top + c.hover])
        if self.phase is KnobPhase.TURN:  # the grasp point turned with the knob about its hinge
            a = s.turned - self._start
            rel = self._grasp[:2] - s.pivot
            rot = np.array([[np.cos(a), -np.sin(a)], [np.sin(a), np.cos(a)]]) @ rel
            return np.array([*(s.pivot + rot), self._grasp[2]])
        if self.phase is KnobPhase.RETREAT:
            return np.array([s.eef[0], s.eef[1], s.knob_top + c.hover])
        if self.phase is KnobPhase.RELEASE:
            return s.eef.copy()
        return self._grasp


# --- pushing a flat object ------------------------------------------------------------------------

def box_gaps(points: np.ndarray, footprint: np.ndarray, boxes: np.ndarray) -> np.ndarray:
    """The smallest signed gap between a footprint of xy half extents `footprint`, centred at each of
    `points` (n, 2), and `boxes` (rows lo_x, lo_y, hi_x, hi_y): negative where they overlap, by how
    deep; inf if there are no boxes."""
    if not len(boxes):
        return np.full(len(points), np.inf)
    lo, hi = (points - footprint)[:, None], (points + footprint)[:, None]
    d = np.maximum(boxes[None, :, :2] - hi, lo - boxes[None, :, 2:])  # per axis: > 0 apart, < 0 overlapping
    outside = np.hypot(np.maximum(d[..., 0], 0.0), np.maximum(d[..., 1], 0.0))
    return np.where((d > 0).any(-1), outside, d.max(-1)).min(1)


def clear_spot(centre: np.ndarray, half: np.ndarray, footprint: np.ndarray, boxes: np.ndarray,
               clearance: float = 0.01, margin: float = 0.01, n: int = 9) -> np.ndarray:
    """Where inside a region (xy `centre` +- `half`, kept `margin` inside its edges) an object of xy half
    extents `footprint` goes: the point nearest the centre whose footprint clears `boxes` by
    `clearance`, else the one that overlaps them least (a region beside a neighbour: the plate in front
    of the stove, the cream cheese next to it)."""
    span = np.maximum(half - margin, 0.0)
    grid = np.stack(np.meshgrid(*(np.linspace(-a, a, n) for a in span)), -1).reshape(-1, 2)
    grid = grid[np.argsort(np.linalg.norm(grid, axis=1), kind="stable")]  # the centre first
    gaps = box_gaps(centre + grid, footprint, boxes)
    clear = np.flatnonzero(gaps >= clearance)
    return centre + grid[clear[0] if len(clear) else int(np.argmax(gaps))]


def push_path(start: np.ndarray, goal: np.ndarray, footprint: np.ndarray, boxes: np.ndarray,
              clearance: float = 0.01, res: float = 0.01, pad: float = 0.12, weight: float = 50.0) -> list[np.ndarray]:
    """Waypoints (xy, ending at `goal`) for a pushed object's centre that keep its footprint `clearance`
    off `boxes` where it can: the cheapest path on a `res` grid, a step costing its length times
    1 + `weight` x how far inside `clearance` the footprint comes (an object touching a neighbour at
    the start pays for going deeper, not for leaving), then shortened to the corners it needs."""
    lo = np.minimum(start, goal) - pad
    shape = np.ceil((np.maximum(start, goal) + pad - lo) / res).astype(int) + 1
    index = np.stack(np.meshgrid(np.arange(shape[0]), np.arange(shape[1]), indexing="ij"), -1).reshape(-1, 2)
    cells = lo + res * index
    cost = 1.0 + weight * np.maximum(clearance - box_gaps(cells, footprint, boxes), 0.0) / clearance

    def cell(p: np.ndarray) -> int:  # the grid cell nearest a point
        ij = np.clip(np.round((p - lo) / res).astype(int), 0, shape - 1)
        return int(np.ravel_multi_index(tuple(ij), tuple(shape)))

    first, last = cell(start), cell(goal)
    best, came, todo = {first: 0.0}, {}, [(0.0, first)]
    while todo:
        d, i = heapq.heappop(todo)
        if i == last:
            break
        if d > best[i]:
            continue
        ix, iy = divmod(i, shape[1])
        for dx, dy in ((1, 0), (-1, 0), (0, 1), (0, -1), (1, 1), (1, -1), (-1, 1), (-1, -1)):
            jx, jy = ix + dx, iy + dy
            if 0 <= jx < shape[0] and 0 <= jy < shape[1]:
                j = jx * shape[1] + jy
                nd = d + res * np.hypot(dx, dy) * (cost[i] + cost[j]) / 2
                if nd < best.get(j, np.inf):
                    best[j], came[j] = nd, i
                    heapq.heappush(todo, (nd, j))
    path = [last]
    while path[-1] != first:
        path.append(came[path[-1]])
    path = np.array([start, *cells[path[::-1][1:-1]], goal])

    def price(points: np.ndarray) -> float:  # of the polyline through `points`, sampled every res / 2
        fine = np.concatenate([a + np.linspace(0.0, 1.0, max(2, int(np.linalg.norm(b - a) / res * 2)))[:, None]
                               * (b - a) for a, b in zip(points[:-1], points[1:], strict=True)])
        weights = 1.0 + weight * np.maximum(clearance - box_gaps(fine, footprint, boxes), 0.0) / clearance
        steps = np.linalg.norm(np.diff(fine, axis=0), axis=1)
        return float(steps @ (weights[:-1] + weights[1:]) / 2)

    # shortcut: from each kept point straight to the farthest later one that the straight line reaches
    # no dearer than the grid path does
    out, i = [], 0
    while i < len(path) - 1:
        j = next(j for j in range(len(path) - 1, i, -1)
                 if j == i + 1 or price(path[[i, j]]) <= price(path[i:j + 1]) + 1e-9)
        out.append(path[j])
        i = j
    return out


@dataclass(frozen=True)
class PushScene:
    """What `Push` reads: the object's box and where its box centre must go (xy)."""

    eef: np.ndarray  # (3,)
    yaw: float
    object_center: np.ndarray  # (3,)
    object_half: np.ndarray  # (2,) xy half extents
    object_top: float
    place: np.ndarray  # (2,) where the object's box centre goes
    floor: float
    boxes: np.ndarray = field(default_factory=lambda: np.zeros((0, 4)))  # xy boxes in its way (lo_x, lo_y, hi_x, hi_y)


class PushPhase(enum.Enum):
    BEHIND = "behind"  # above the point behind the object, opposite the place
    DOWN = "down"  # down beside the object, fingers closed
    PUSH = "push"  # slide it toward the place
    RETREAT = "retreat"


@dataclass
class Push:
    """Slide a flat object along a path around its neighbours (`push_path`) with the closed fingers
    pressed on it; if the hand slips off it, go back over it and down again."""

    config: ExpertConfig = ExpertConfig()
    speed: float = 0.5  # largest xyz action while pushing
    inset: float = 0.04  # the fingers go down this far inside the object's far edge (a plate's rim), m
    within: float = 0.01  # object centre this close to the place ends the push, m
    waypoint_within: float = 0.02  # ... this close to a corner of its path turns it toward the next, m
    lead: float = 0.08  # how far ahead of the contact the hand aims while pushing, m
    press: float = 0.008  # end-effector height above the floor while pushing, m (the fingers on the plate's floor)
    phase: PushPhase = PushPhase.BEHIND
    done: bool = False
    _count: int = 0
    _dir: np.ndarray | None = field(default=None, repr=False)
    _path: list = field(default_factory=list, repr=False)  # corners left to the place, the place last
    _reach: float = 0.0  # eef distance behind the object's centre along the push
    # the hand's long side (the finger axis, 21 cm) along world x, toward the robot: free space in LIBERO's
    # scenes, where cabinets, racks and stoves stand at the table's sides (across the push it hit a
    # cabinet's drawer handle)
    _yaw: float = np.pi / 2

    def act(self, s: PushScene) -> np.ndarray:
        c = self.config
        if self._dir is None:  # the path is kept: the neighbours it avoids move as the object is pushed
            self._path = push_path(s.object_center[:2], s.place, s.object_half, s.boxes, c.clearance)
            self._aim(s)
        self._advance(s)
        limit = self.speed if self.phase is PushPhase.PUSH else 1.0
        return _move(c, self._target(s), s.eef, _angle(self._yaw - s.yaw), 1.0, limit)

    def _aim(self, s: PushScene) -> None:
        """Push toward the next corner of the path, the fingers down behind the object's centre."""
        d = self._path[0] - s.object_center[:2]
        self._dir = d / max(np.linalg.norm(d), 1e-9)
        # the object's extent along the push (exact for a round plate, its box's ellipse otherwise)
        self._reach = float(np.linalg.norm(self._dir * s.object_half)) - self.inset

    def _advance(self, s: PushScene) -> None:
        c = self.config
        reached = lambda: np.linalg.norm(self._target(s) - s.eef) < c.tolerance  # noqa: E731
        if self.phase is PushPhase.PUSH:
            while len(self._path) > 1 and np.linalg.norm(self._path[0] - s.object_center[:2]) < self.waypoint_within:
                self._path.pop(0)
        if self.phase is PushPhase.BEHIND and reached() and abs(_angle(self._yaw - s.yaw)) < c.yaw_tolerance:
            self.phase = PushPhase.DOWN
        elif self.phase is PushPhase.DOWN and s.eef[2] < s.floor + self.press + self.config.gain ** -1 * 0.25:
            self.phase = PushPhase.PUSH
        elif self.phase is PushPhase.PUSH and np.linalg.norm(self._path[-1] - s.object_center[:2]) < self.within:
            self.phase, self._count = PushPhase.RETREAT, 0
        elif self.phase is PushPhase.PUSH and np.linalg.norm(s.eef[:2] - s.object_center[:2]) > s.object_half.max():
            self.phase = PushPhase.BEHIND  # the fingers left the object: over it again, aimed anew
            self._aim(s)
        elif self.phase is PushPhase.RETREAT:
            self.done = _tick(self, c.retreat_steps)

    def _target(self, s: PushScene) -> np.ndarray:
        c = self.config
        low = s.floor + self.press  # inside the rim, pressing on the plate's floor
        behind = s.object_center[:2] - self._dir * self._reach
        if self.phase is PushPhase.BEHIND:
            return np.array([*behind, s.object_top + c.hover])
        if self.phase is PushPhase.DOWN:
            return np.array([*behind, low])
        if self.phase is PushPhase.PUSH:  # on at full push speed from the hand, toward the corner from the object now
            d = self._path[0] - s.object_center[:2]
            return np.array([*(s.eef[:2] + self.lead * d / max(np.linalg.norm(d), 1e-9)), low])
        return np.array([s.eef[0], s.eef[1], s.object_top + c.hover])


# --- drawers --------------------------------------------------------------------------------------

def rotation(axis: np.ndarray, angle: float) -> np.ndarray:
    """Rotation matrix about a unit axis (Rodrigues)."""
    k = np.array([[0, -axis[2], axis[1]], [axis[2], 0, -axis[0]], [-axis[1], axis[0], 0]])
    return np.eye(3) + np.sin(angle) * k + (1 - np.cos(angle)) * k @ k


def rotation_error(target: np.ndarray, current: np.ndarray) -> np.ndarray:
    """The world-frame rotation vector taking `current` to `target` (what OSC_POSE's rotation deltas are)."""
    r = target @ current.T
    angle = np.arccos(np.clip((np.trace(r) - 1) / 2, -1.0, 1.0))
    if angle < 1e-6:
        return np.zeros(3)
    axis = np.array([r[2, 1] - r[1, 2], r[0, 2] - r[2, 0], r[1, 0] - r[0, 1]]) / (2 * np.sin(angle))
    return axis * angle


def turn_action(target: np.ndarray, current: np.ndarray, gain: float) -> np.ndarray:
    """OSC_POSE's rotation deltas toward `target`: `gain` per radian of error, clipped to [-1, 1]."""
    return np.clip(gain * rotation_error(target, current), -1.0, 1.0)


def oriented(target: np.ndarray, current: np.ndarray, tolerance: float) -> bool:
    """The hand's orientation `current` is within `tolerance` rad of `target`."""
    return bool(np.linalg.norm(rotation_error(target, current)) < tolerance)


@dataclass(frozen=True)
class DrawerScene:
    """What `Drawer` reads: the hand's pose, the drawer's handle and how far the drawer still has to go."""

    eef: np.ndarray  # (3,)
    rot: np.ndarray  # (3, 3) the hand's orientation (grip site frame: x the finger axis, z along the fingers)
    handle: np.ndarray  # (3,) centre of the handle bar
    pull: np.ndarray  # (3,) horizontal unit vector the drawer opens along
    travel: float  # how far the drawer still has to move for this skill (open or close), m


class DrawerPhase(enum.Enum):
    FACE = "face"  # in front of the handle (from above), fingers pointing at it (open) or leaning toward it (close)
    REACH = "reach"  # onto the handle: the bar between the open fingers (open), the closed finger tips at it (close)
    GRIP = "grip"  # close the fingers: on the bar (open), in front of it before reaching it (close)
    MOVE = "move"  # pull (open) or push (close) until the drawer is there
    RELEASE = "release"
    BACK = "back"  # away from the drawer, the hand turned down again


@dataclass
class Drawer:
    """Open a drawer by its handle (the hand turned 90 degrees to point into the cabinet, the bar
    between its fingers: pointing down, the 21 cm hand would hit the cabinet above), or close one
    by pushing its handle with the closed fingers, the hand's long side level across the push and
    its fingers leaning into the cabinet (`close_pitch`). Closing, the hand stays open until it is in
    front of the handle: an empty closed hand reads as one holding a bowl by its thin rim (the fingers'
    opening is about 0 both ways), and a target that had just let the bowl go took the way to the push
    for a carry (BENCHMARKS 18.27). It closes there and reaches the handle closed, as before."""

    config: ExpertConfig = ExpertConfig()
    opening: bool = True
    standoff: float = 0.10  # distance in front of the handle before reaching for it (opening), m
    lead: float = 0.04  # how far ahead of the hand it aims while pulling or pushing, m
    rot_gain: float = 1.5  # rotation action per radian of orientation error
    rot_tolerance: float = 0.08  # orientation error that ends a turning phase, rad
    reach_steps: int = 40  # longest reach onto the handle (the fingers may touch the drawer first)
    # how close to the point in front of the handle is close enough to reach for it: with the hand
    # turned, OSC_POSE can settle a centimetre off a target (it held 1.03 cm above it for 200 steps)
    face_tolerance: float = 0.02
    # closing, the fingers lean this far from down toward the cabinet: pointing down, the forearm met the
    # cabinet's top with 5 cm still to push; pointing level, the wrist met a wine rack beside the drawer
    close_pitch: float = np.pi / 6
    close_standoff: float = 0.05  # ... and its standoff, m (shorter: the leaning wrist trails the hand)
    phase: DrawerPhase = DrawerPhase.FACE
    done: bool = False
    _count: int = 0
    _home: np.ndarray | None = field(default=None, repr=False)  # the hand pointing down, as it started
    _work: np.ndarray | None = field(default=None, repr=False)  # the orientation that works the handle

    def act(self, s: DrawerScene) -> np.ndarray:
        c = self.config
        if self._home is None:
            self._home = s.rot.copy()
            finger = s.rot[:, 0]  # turn about z until the finger axis lies along the pull
            yaw = np.arctan2(finger[0] * s.pull[1] - finger[1] * s.pull[0], finger @ s.pull)
            yaw = _angle(yaw + np.pi) if abs(yaw) > np.pi / 2 else yaw
            aligned = rotation(np.array([0.0, 0.0, 1.0]), yaw) @ s.rot
            level = np.cross([0.0, 0.0, 1.0], s.pull)  # the pitch axis: horizontal, across the pull
            level /= np.linalg.norm(level)
            if self.opening:  # pitch the fingers from down to into the cabinet: the closing axis turns vertical
                self._work = rotation(level, np.pi / 2) @ aligned
            else:  # the hand's long side across the push (its finger axis on `level`, the hand thin vertically),
                # fingers pitched from down toward the cabinet
                across = rotation(np.array([0.0, 0.0, 1.0]), np.pi / 2) @ aligned
                self._work = rotation(level, self.close_pitch) @ across
        self._advance(s)
        target_rot = self._home if self.phase is DrawerPhase.BACK else self._work
        closed = self.phase in (DrawerPhase.GRIP, DrawerPhase.MOVE)
        gripper = 1.0 if closed or (self.phase is DrawerPhase.REACH and not self.opening) else -1.0
        action = _move(c, self._target(s), s.eef, 0.0, gripper)
        action[3:6] = turn_action(target_rot, s.rot, self.rot_gain)
        return action

    def _rot_ok(self, s: DrawerScene, target: np.ndarray) -> bool:
        return oriented(target, s.rot, self.rot_tolerance)

    def _advance(self, s: DrawerScene) -> None:
        c = self.config
        reached = lambda: np.linalg.norm(self._target(s) - s.eef) < c.tolerance  # noqa: E731
        near = np.linalg.norm(self._target(s) - s.eef) < self.face_tolerance
        # opening: FACE, REACH, GRIP (on the bar), MOVE; closing: FACE, GRIP (in front of it), REACH, MOVE
        if self.phase is DrawerPhase.FACE and near and self._rot_ok(s, self._work):
            self.phase, self._count = (DrawerPhase.REACH if self.opening else DrawerPhase.GRIP), 0
        elif self.phase is DrawerPhase.REACH:
            if _tick(self, self.reach_steps) or reached():
                self.phase, self._count = (DrawerPhase.GRIP if self.opening else DrawerPhase.MOVE), 0
        elif self.phase is DrawerPhase.GRIP:
            if _tick(self, c.close_steps):
                self.phase, self._count = (DrawerPhase.MOVE if self.opening else DrawerPhase.REACH), 0
        elif self.phase is DrawerPhase.MOVE and s.travel <= 0:
            self.phase, self._count = DrawerPhase.RELEASE, 0
        elif self.phase is DrawerPhase.RELEASE:
            if _tick(self, c.open_steps):
                self.phase, self._count = DrawerPhase.BACK, 0
        elif self.phase is DrawerPhase.BACK:
            self.done = _tick(self, c.retreat_steps) and self._rot_ok(s, self._home)

    def _target(self, s: DrawerScene) -> np.ndarray:
        front = s.handle + s.pull * (self.standoff if self.opening else self.close_standoff)
        if self.phase is DrawerPhase.FACE:
            # over that point first, then straight down: turned, the hand reaches `hand_half_length` below
            # the grip site, and swept low on the way it shoved a bowl in front of the drawer
            if np.linalg.norm((front - s.eef)[:2]) > self.face_tolerance:
                return front + np.array([0.0, 0.0, self.config.hand_half_length])
            return front
        if self.phase is DrawerPhase.GRIP and not self.opening:
            return front
        if self.phase in (DrawerPhase.REACH, DrawerPhase.GRIP):
            # opening: the bar between the finger pads; closing: the finger tips against the bar's front
            return s.handle.copy() if self.opening else s.handle + s.pull * 0.02
        if self.phase is DrawerPhase.MOVE:
            if self.opening:
                return s.eef + s.pull * self.lead
            # pushing, level with the handle: left free in height, the finger tips rode up it (BENCHMARKS 18.27)
            return np.array([*(s.eef - s.pull * self.lead)[:2], s.handle[2]])
        if self.phase is DrawerPhase.RELEASE:
            return s.eef.copy()
        return np.array([front[0], front[1], s.handle[2] + 0.1])  # BACK: out and up
