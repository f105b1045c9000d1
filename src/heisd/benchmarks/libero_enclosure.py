"""Scripted skills for a place under a roof (a microwave's inside) and the hinged door in front of it.

A hand that holds an object from above needs the object's height plus about 8 cm of hand over it;
a microwave's cavity is 14 cm high and its mug 10.5 cm. So the object goes in from the side:
`PickPlace` first sets it down at the enclosure's mouth (the plan's ``stage`` step), then `Insert`
takes the part of it farthest from the mouth (a mug's handle) with the hand pointing in and
down, lifts it over the enclosure's floor and slides it in: only the finger tips pass the mouth.
`SwingDoor` turns a hinged door by pushing one face of it with the side of the hand, which follows
the door's arc: shut, or wider open first where the open door stands in the hand's way. Both read what `heisd.benchmarks.libero_experts` reads from the simulator.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

import numpy as np

from heisd.benchmarks.libero_skills import (
    ExpertConfig, _angle, _move, _tick, oriented, rotation, rotation_error, turn_action,
)

UP = np.array([0.0, 0.0, 1.0])


def _fingers(inward: np.ndarray, pitch: float) -> np.ndarray:
    """The direction the fingers point: along `inward`, tilted `pitch` down."""
    return np.cos(pitch) * inward - np.sin(pitch) * UP


def _insert_pose(rot: np.ndarray, inward: np.ndarray, pitch: float) -> np.ndarray:
    """The grip frame pointing the fingers in (`_fingers`), closing across `inward` horizontally: of the
    two such frames, the one nearer `rot` (the wrist turns least)."""
    options = []
    fingers = _fingers(inward, pitch)
    for sign in (1.0, -1.0):
        across = sign * np.cross(UP, inward)  # grip x: the finger axis
        options.append(np.column_stack([across, np.cross(fingers, across), fingers]))
    return min(options, key=lambda r: float(np.linalg.norm(rotation_error(r, rot))))


@dataclass(frozen=True)
class InsertScene:
    """What `Insert` reads (world frame, metres)."""

    eef: np.ndarray  # (3,)
    rot: np.ndarray  # (3, 3) the hand's orientation (grip site frame: x the finger axis, z along the fingers)
    handle: np.ndarray  # (3,) where the fingers take the object: its part farthest from the mouth (a mug's handle)
    object_bottom: float  # lowest z of the object
    inward: np.ndarray  # (3,) horizontal unit vector from the mouth into the enclosure
    floor: float  # top of the enclosure's floor, m
    depth: float  # how far the object still has to go along `inward`, m


class InsertPhase(enum.Enum):
    TURN = "turn"  # behind the handle and above it, the hand turning to point in
    ALIGN = "align"  # back along the fingers from the handle
    REACH = "reach"  # along the fingers until the handle is between them
    GRIP = "grip"
    LIFT = "lift"  # the object's bottom over the enclosure's floor
    SLIDE = "slide"  # in along `inward`
    RELEASE = "release"
    BACK = "back"  # straight back out of the mouth
    UP = "up"  # up, the hand turned down again


@dataclass
class Insert:
    """Put an object held by its back into an enclosure from the side (see the module's docstring)."""

    config: ExpertConfig = ExpertConfig()
    # the fingers point in and this far down: level, the wrist met the table 9 cm above the handle;
    # tilted, the tips still pass the mouth first and the hand's body stays out from under its roof
    pitch: float = np.pi / 4
    standoff: float = 0.06  # the hand's distance back along the fingers from the handle before reaching for it, m
    above: float = 0.08  # ... and its height above that while turning, m
    clear: float = 0.015  # the object's bottom this far over the enclosure's floor while sliding, m
    lead: float = 0.04  # how far ahead of the hand it aims while sliding, m
    rot_gain: float = 1.5  # rotation action per radian of orientation error
    rot_tolerance: float = 0.08  # orientation error that ends a turning phase, rad
    reach_steps: int = 40  # longest reach onto the handle (a finger may touch the object first)
    phase: InsertPhase = InsertPhase.TURN
    done: bool = False
    _count: int = 0
    _home: np.ndarray | None = field(default=None, repr=False)  # the hand pointing down, as it started
    _work: np.ndarray | None = field(default=None, repr=False)  # the hand pointing in
    _out: np.ndarray | None = field(default=None, repr=False)  # where the hand backs out to, set at the release

    def act(self, s: InsertScene) -> np.ndarray:
        if self._home is None:
            self._home, self._work = s.rot.copy(), _insert_pose(s.rot, s.inward, self.pitch)
        self._advance(s)
        holding = self.phase in (InsertPhase.GRIP, InsertPhase.LIFT, InsertPhase.SLIDE)
        action = _move(self.config, self._target(s), s.eef, 0.0, 1.0 if holding else -1.0)
        target_rot = self._home if self.phase is InsertPhase.UP else self._work
        action[3:6] = turn_action(target_rot, s.rot, self.rot_gain)
        return action

    def _rot_ok(self, s: InsertScene, target: np.ndarray) -> bool:
        return oriented(target, s.rot, self.rot_tolerance)

    def _lift(self, s: InsertScene) -> float:
        """How far the object's bottom is still below where it slides."""
        return s.floor + self.clear - s.object_bottom

    def _advance(self, s: InsertScene) -> None:
        c = self.config
        reached = lambda: np.linalg.norm(self._target(s) - s.eef) < c.tolerance  # noqa: E731
        if self.phase is InsertPhase.TURN and reached() and self._rot_ok(s, self._work):
            self.phase = InsertPhase.ALIGN
        elif self.phase is InsertPhase.ALIGN and reached():
            self.phase, self._count = InsertPhase.REACH, 0
        elif self.phase is InsertPhase.REACH and (_tick(self, self.reach_steps) or reached()):
            self.phase, self._count = InsertPhase.GRIP, 0
        elif self.phase is InsertPhase.GRIP and _tick(self, c.close_steps):
            self.phase = InsertPhase.LIFT
        elif self.phase is InsertPhase.LIFT and self._lift(s) < c.tolerance / 2:
            self.phase = InsertPhase.SLIDE
        elif self.phase is InsertPhase.SLIDE and s.depth < c.tolerance:
            self.phase, self._count = InsertPhase.RELEASE, 0
        elif self.phase is InsertPhase.RELEASE and _tick(self, c.open_steps):
            self.phase, self._out = InsertPhase.BACK, s.eef - s.inward * self.standoff
        elif self.phase is InsertPhase.BACK and reached():
            self.phase, self._count = InsertPhase.UP, 0
        elif self.phase is InsertPhase.UP:
            self.done = _tick(self, c.retreat_steps) and self._rot_ok(s, self._home)

    def _target(self, s: InsertScene) -> np.ndarray:
        behind = s.handle - _fingers(s.inward, self.pitch) * self.standoff
        if self.phase is InsertPhase.TURN:
            return behind + UP * self.above
        if self.phase is InsertPhase.ALIGN:
            return behind
        if self.phase in (InsertPhase.REACH, InsertPhase.GRIP):
            return s.handle.copy()
        if self.phase is InsertPhase.LIFT:
            return s.eef + UP * self._lift(s)
        if self.phase is InsertPhase.SLIDE:  # level at the sliding height, in by up to `lead` at a time
            return s.eef + UP * self._lift(s) + s.inward * min(s.depth, self.lead)
        if self.phase is InsertPhase.RELEASE:
            return s.eef.copy()
        if self.phase is InsertPhase.BACK:
            return self._out.copy()
        return self._out + UP * self.above  # UP


@dataclass(frozen=True)
class DoorScene:
    """What `SwingDoor` reads: the door's hinge and where its panel is now (world frame, metres)."""

    eef: np.ndarray  # (3,)
    yaw: float  # finger axis angle about +z from the world y axis, rad
    hinge: np.ndarray  # (3,) a point on the hinge's (vertical) axis, at the door's middle height
    radial: np.ndarray  # (3,) horizontal unit vector from the hinge along the panel
    closing: np.ndarray  # (3,) horizontal unit vector the panel moves along as it turns the wanted way (at `radial`)
    width: float  # the panel's extent from the hinge, m
    face: float  # the pushed face's offset from the hinge along `closing` (negative: behind it), m
    top: float  # highest z of the door, m
    there: bool  # the door is where the step wants it (the simulator says it is closed, or it is open wide)


class DoorPhase(enum.Enum):
    ABOVE = "above"  # over the point behind the pushed face, fingers open
    GRIP = "grip"  # close the fingers there
    DOWN = "down"  # down beside the panel
    PUSH = "push"  # along the door's arc until it is there
    BACK = "back"  # away from the door and up


@dataclass
class SwingDoor:
    """Swing a hinged door: the closed hand goes down behind the face to push and pushes it with its
    side, its finger axis along the panel, following the arc a little ahead of the panel. The hand
    stays open until it is over that face and closes there: closed on nothing right after letting a
    mug go by its thin handle, it reads as one still holding it (the drawer's look-alike, BENCHMARKS 18.27)."""

    config: ExpertConfig = ExpertConfig()
    radius: float = 0.5  # where along the panel the hand pushes, as a fraction of its width
    gap: float = 0.03  # the hand's side this far off the face before the push, m
    press: float = 0.02  # ... and this far into where the face is, pushing, m
    lead: float = 0.25  # how far ahead along the arc the hand aims while pushing, rad
    phase: DoorPhase = DoorPhase.ABOVE
    done: bool = False
    _count: int = 0
    _back: np.ndarray | None = field(default=None, repr=False)  # where the hand goes when the door is there

    def act(self, s: DoorScene) -> np.ndarray:
        self._advance(s)
        yaw_error = 0.0 if self.phase is DoorPhase.BACK else self._yaw_error(s)
        return _move(self.config, self._target(s), s.eef, yaw_error, -1.0 if self.phase is DoorPhase.ABOVE else 1.0)

    def _yaw_error(self, s: DoorScene) -> float:
        """To the finger axis along the panel (the hand is symmetric: a half turn is the same hand)."""
        want = np.arctan2(-s.radial[0], s.radial[1])
        return _angle(2 * (want - s.yaw)) / 2

    def _at(self, s: DoorScene, turn: float, offset: float) -> np.ndarray:
        """The hand's point `turn` rad further along the arc, `offset` behind the face (the hand's half
        width between its centre and the face)."""
        sign = np.sign(np.cross(s.radial, s.closing)[2])  # the door closes about +z or -z
        radial = rotation(UP, sign * turn) @ s.radial
        closing = rotation(UP, sign * turn) @ s.closing
        return s.hinge + radial * self.radius * s.width + closing * (s.face - self.config.hand_half_width - offset)

    def _advance(self, s: DoorScene) -> None:
        c = self.config
        reached = lambda: np.linalg.norm(self._target(s) - s.eef) < c.tolerance  # noqa: E731
        if self.phase is DoorPhase.ABOVE and s.there:  # nothing to push
            self.done = True
        elif self.phase is DoorPhase.ABOVE and reached() and abs(self._yaw_error(s)) < c.yaw_tolerance:
            self.phase, self._count = DoorPhase.GRIP, 0
        elif self.phase is DoorPhase.GRIP and _tick(self, c.close_steps):
            self.phase = DoorPhase.DOWN
        elif self.phase is DoorPhase.DOWN and reached():
            self.phase = DoorPhase.PUSH
        elif self.phase is DoorPhase.PUSH and s.there:
            self.phase, self._count = DoorPhase.BACK, 0
            self._back = s.eef - s.closing * self.gap + UP * (s.top + c.hover - s.eef[2])
        elif self.phase is DoorPhase.BACK:
            self.done = _tick(self, c.retreat_steps)

    def _target(self, s: DoorScene) -> np.ndarray:
        if self.phase in (DoorPhase.ABOVE, DoorPhase.GRIP):
            start = self._at(s, 0.0, self.gap)
            return np.array([start[0], start[1], s.top + self.config.hover])
        if self.phase is DoorPhase.DOWN:
            return self._at(s, 0.0, self.gap)
        if self.phase is DoorPhase.PUSH:
            return self._at(s, self.lead, -self.press)
        return self._back.copy()
