"""Scripted experts for the LIBERO suites, composed per task from its BDDL goal.

`heisd.benchmarks.libero_plan` turns the goal (``On``, ``In``, ``Open``, ``Close``, ``TurnOn``)
into steps; each step runs one skill of `heisd.benchmarks.libero_skills` (or, for a place under a
roof and its hinged door, of `heisd.benchmarks.libero_enclosure`) on what `SimReader` reads from the
simulator each step (end effector, the objects' bounding boxes, sites, fixture joints).
A step whose predicate already holds when it starts (a stove already on) is skipped. See
BENCHMARKS.md sections 7 (LIBERO-Object) and 12 (the other suites) for what each expert needed.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from functools import partial

import numpy as np
from scipy.spatial import ConvexHull

from heisd.benchmarks.libero_enclosure import DoorScene, Insert, InsertScene, SwingDoor
from heisd.benchmarks.libero_plan import Step, plan
from heisd.benchmarks.libero_protocol import SUITES
from heisd.benchmarks.libero_skills import (
    Drawer,
    DrawerScene,
    ExpertConfig,
    KnobScene,
    Phase,
    PickPlace,
    Push,
    PushScene,
    Scene,
    TurnKnob,
    clear_spot,
    finger_axis,
    is_rim_grasp,
)
from heisd.errors import UsageError

EXPERT_SUITES = SUITES  # suites with scripted experts: all four
KNOB_MARGIN = 0.3  # turn a knob this far past LIBERO's "on" threshold, rad
SLOT_SPACING = 1.2  # side-by-side objects on one region: their centres this many half-sizes apart
ON_ABOVE = 0.01  # release height of an object's bottom above what it goes on, m
IN_ABOVE = 0.05  # ... above the centre of the region it goes in, m
PUSH_ABOVE = 0.005  # what reaches this far above the table stands in a pushed object's way, m
FIXTURE_GRID = 0.02  # spacing of the points that stand for a fixture part in the hand's way, m
MOUTH_GAP = 0.01  # a staged object and the hand holding it stop this far before an enclosure's mouth, m
HANDLE_DEPTH = 0.008  # the fingers take an object's back this far in from its farthest point, m
HANDLE_SLICE = 0.015  # ... and centre on its points within this of that farthest point, m
HINGE = 3  # mujoco.mjtJoint.mjJNT_HINGE
WIDE_MARGIN = 0.1  # a door swung wide stops this far short of its joint's limit, rad
IN_FRONT = 0.3  # the hand works this far in front of an enclosure's mouth, m
HAND = ExpertConfig()  # the hand's size, for the scenes (the skills' own settings come with each skill)


def check_expert_suite(suite: str) -> None:
    if suite not in EXPERT_SUITES:
        raise UsageError(f"there are no scripted experts for {suite} (only {', '.join(EXPERT_SUITES)}); build "
                         "datastores from LIBERO's own datasets (build-datastore --demos <task>_demo.hdf5)")


MESH_GEOM = 7  # mujoco.mjtGeom.mjGEOM_MESH
CUBE = np.array([[x, y, z] for x in (-1, 1) for y in (-1, 1) for z in (-1, 1)], dtype=float)


def geom_boxes(sim, geoms: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """World boxes (centre, half size) of geoms' local boxes, rotated by their frames."""
    rot = sim.data.geom_xmat[geoms].reshape(-1, 3, 3)
    centre = sim.data.geom_xpos[geoms] + np.einsum("nij,nj->ni", rot, sim.model.geom_aabb[geoms, :3])
    return centre, np.einsum("nij,nj->ni", np.abs(rot), sim.model.geom_aabb[geoms, 3:])


def geom_corners(sim, geoms: np.ndarray) -> np.ndarray:
    """The 8 corners of each geom's local box, in the world: (len(geoms) * 8, 3)."""
    rot = sim.data.geom_xmat[geoms].reshape(-1, 3, 3)
    local = sim.model.geom_aabb[geoms, None, :3] + sim.model.geom_aabb[geoms, None, 3:] * CUBE
    return (sim.data.geom_xpos[geoms, None] + np.einsum("nij,nkj->nki", rot, local)).reshape(-1, 3)


@dataclass(frozen=True)
class Enclosure:
    """The inside of a fixture around a region, open on one side (a microwave's cavity)."""

    inward: np.ndarray  # (3,) horizontal unit vector from the mouth in
    mouth: float  # where the walls around the mouth begin, along `inward`, m
    back: float  # the back wall's face, along `inward`, m
    middle: np.ndarray  # (3,) the region's centre moved midway between the side walls
    floor: float  # top of the floor, m


class SimReader:
    """Reads one LIBERO task's simulator: objects' world boxes, sites, the hand's yaw, goal predicates."""

    def __init__(self, robosuite_env):
        self.env = robosuite_env
        sim = robosuite_env.sim
        self.geoms = {}  # object name -> its geoms
        for name, obj in robosuite_env.objects_dict.items():
            self.geoms[name] = np.flatnonzero(sim.model.geom_bodyid == sim.model.body_name2id(obj.root_body))
        self._hull = {name: self._body_hull(name) for name in self.geoms}
        self._fingers = [sim.model.body_name2id(f"gripper0_{side}finger") for side in ("left", "right")]
        self._enclosures: dict[str, Enclosure | None] = {}
        self.floor = min(self.box(name)[0][2] for name in self.geoms)  # every scene has objects on its table
        fixtures = {sim.model.body_name2id(f.root_body) for f in robosuite_env.fixtures_dict.values()}
        root = sim.model.body_rootid
        # colliding parts: a geom collides where its contype or its conaffinity is set (the microwave's
        # door has only the latter)
        self._fixture_geoms = np.flatnonzero(np.isin(root[sim.model.geom_bodyid], list(fixtures))
                                             & ((sim.model.geom_contype > 0) | (sim.model.geom_conaffinity > 0)))

    def _body_hull(self, name: str) -> np.ndarray:
        """An object's convex-hull points in its root body's frame: a mesh's own vertices, a primitive's
        box corners. All its geoms sit on that body, so the hull moves rigidly with it, and the world box
        of the hull is the world box of every point (a point set's box is its hull's box)."""
        sim, model = self.env.sim, self.env.sim.model
        points = []
        for g in self.geoms[name]:
            if model.geom_type[g] == MESH_GEOM:
                mesh = model.geom_dataid[g]
                start = model.mesh_vertadr[mesh]
                local = np.array(model.mesh_vert[start:start + model.mesh_vertnum[mesh]])
            else:
                local = model.geom_aabb[g, :3] + model.geom_aabb[g, 3:] * CUBE
            points.append(sim.data.geom_xpos[g] + local @ sim.data.geom_xmat[g].reshape(3, 3).T)
        body = model.geom_bodyid[self.geoms[name][0]]
        points = (np.concatenate(points) - sim.data.body_xpos[body]) @ sim.data.body_xmat[body].reshape(3, 3)
        return points[ConvexHull(points).vertices]

    def box(self, name: str) -> tuple[np.ndarray, np.ndarray]:
        """World-frame bounding box of an object's geoms: a mesh's own vertices, a primitive's local box
        rotated by its frame (a rotated mesh's local box overstates it: the black bowl's by 40%)."""
        data = self.env.sim.data
        body = self.env.sim.model.geom_bodyid[self.geoms[name][0]]
        points = data.body_xpos[body] + self._hull[name] @ data.body_xmat[body].reshape(3, 3).T
        return points.min(0), points.max(0)

    def body(self, name: str) -> np.ndarray:
        return self.env.sim.data.body_xpos[self.env.obj_body_id[name]].copy()

    def site(self, name: str) -> np.ndarray:
        return self.env.sim.data.get_site_xpos(name).copy()

    def yaw(self) -> float:
        """The finger axis angle about +z from the world y axis."""
        left, right = self.env.sim.data.body_xpos[self._fingers]
        d = right - left
        return float(np.arctan2(-d[0], d[1]))

    def obstacles(self, *skip: str) -> np.ndarray:
        """Every object but `skip` (x, y, footprint radius, top), and points every `FIXTURE_GRID` over the
        footprint of every colliding fixture part above the table (radius 0: a drawer's thin wall is no
        disc, and a cabinet's top is met along its edge, not at its corners)."""
        rows = [np.zeros((0, 4))]
        for name in self.geoms:
            if name not in skip:
                lo, hi = self.box(name)
                rows.append([[*(lo[:2] + hi[:2]) / 2, np.linalg.norm(hi[:2] - lo[:2]) / 2, hi[2]]])
        centre, half = geom_boxes(self.env.sim, self._fixture_geoms)
        top = centre[:, 2] + half[:, 2]
        for c, h, t in zip(centre, half, top, strict=True):
            if t > self.floor + PUSH_ABOVE:
                x, y = np.meshgrid(*(np.linspace(-a, a, int(np.ceil(2 * a / FIXTURE_GRID)) + 1) for a in h[:2]))
                points = np.zeros((x.size, 4))
                points[:, 0], points[:, 1], points[:, 3] = c[0] + x.ravel(), c[1] + y.ravel(), t
                rows.append(points)
        return np.concatenate(rows)

    def footprints(self, *skip: str, above: float) -> np.ndarray:
        """The xy boxes (lo_x, lo_y, hi_x, hi_y) of every object but `skip` and every colliding part of
        the fixtures that reach higher than `above` (the table's own top does not)."""
        rows = [[*lo[:2], *hi[:2]] for lo, hi in (self.box(n) for n in self.geoms if n not in skip) if hi[2] > above]
        g = self._fixture_geoms
        centre, half = geom_boxes(self.env.sim, g)
        tall = centre[:, 2] + half[:, 2] > above
        rows.extend(np.column_stack([centre[tall, :2] - half[tall, :2], centre[tall, :2] + half[tall, :2]]).tolist())
        return np.array(rows).reshape(-1, 4)

    def holds(self, predicate: str, *args: str) -> bool:
        """LIBERO's own check of one goal predicate now."""
        from libero.libero.envs.predicates import eval_predicate_fn

        states = self.env.object_states_dict
        return bool(eval_predicate_fn(predicate, *[states[a] for a in args]))

    def joint(self, name: str) -> tuple[int, int]:
        """An articulated object's (first) joint: (joint id, qpos address)."""
        model = self.env.sim.model
        j = model.joint_name2id(self.env.get_object(name).joints[0])
        return j, int(model.jnt_qposadr[j])

    def part_box(self, joint: int) -> tuple[np.ndarray, np.ndarray]:
        """World box of the colliding geom reaching highest on a joint's body (a knob's grip)."""
        sim, model = self.env.sim, self.env.sim.model
        geoms = np.flatnonzero((model.geom_bodyid == model.jnt_bodyid[joint]) & (model.geom_contype > 0))
        centre, half = geom_boxes(sim, geoms)
        top = int(np.argmax(centre[:, 2] + half[:, 2]))
        return centre[top] - half[top], centre[top] + half[top]

    def is_drawer(self, name: str) -> bool:
        """A region inside a drawer: a site moved by a slide joint."""
        joints = getattr(self.env.object_sites_dict.get(name), "joints", None)
        model = self.env.sim.model
        return bool(joints) and model.jnt_type[model.joint_name2id(joints[0])] == 2  # mjJNT_SLIDE

    def is_site(self, name: str) -> bool:
        return name in self.env.object_sites_dict

    def enclosure(self, place: str) -> Enclosure | None:
        """The walls of the fixture around a region as they were first read (a door swung shut later
        would close its mouth): from its centre, the nearest colliding part of the fixture along each
        axis. An enclosure has a floor, a roof, and walls on all horizontal sides but one, its mouth; a
        drawer's region (which slides out from under its cabinet) is none."""
        if place not in self._enclosures:
            self._enclosures[place] = self._read_enclosure(place)
        return self._enclosures[place]

    def _read_enclosure(self, place: str) -> Enclosure | None:
        if not self.is_site(place) or self.is_drawer(place):
            return None
        parent = getattr(self.env.object_states_dict[place], "parent_name", None)
        if parent not in self.env.fixtures_dict:
            return None
        sim = self.env.sim
        root = sim.model.body_name2id(self.env.get_object(parent).root_body)
        geoms = self._fixture_geoms[sim.model.body_rootid[sim.model.geom_bodyid[self._fixture_geoms]] == root]
        centre, half = geom_boxes(sim, geoms)
        lo, hi, c = centre - half, centre + half, self.site(place)
        hits = {}  # (axis, direction) -> (the nearest face's coordinate, that geom's index)
        for axis in range(3):
            across = [a for a in range(3) if a != axis]
            on_ray = np.all((lo[:, across] <= c[across]) & (c[across] <= hi[:, across]), axis=1)
            for direction, ahead, face in ((1, lo[:, axis] > c[axis], lo), (-1, hi[:, axis] < c[axis], hi)):
                found = np.flatnonzero(on_ray & ahead)
                if len(found):
                    k = found[np.argmin(np.abs(face[found, axis] - c[axis]))]
                    hits[axis, direction] = (face[k, axis], k)
        mouths = [(a, d) for a in (0, 1) for d in (1, -1) if (a, d) not in hits]
        if (2, 1) not in hits or (2, -1) not in hits or len(mouths) != 1:
            return None
        axis, out = mouths[0]
        inward = np.zeros(3)
        inward[axis] = -out
        walls = [k for key, (_, k) in hits.items() if key != (axis, -out)]
        # along `inward`, a box spans [min, max] of its two faces' coordinates times the sign
        mouth = min(min(lo[k, axis] * -out, hi[k, axis] * -out) for k in walls)
        back = hits[axis, -out][0] * -out
        side = 1 - axis
        middle = c.copy()
        middle[side] = (hits[side, 1][0] + hits[side, -1][0]) / 2
        return Enclosure(inward=inward, mouth=float(mouth), back=float(back), middle=middle,
                         floor=float(hits[2, -1][0]))

    def back_point(self, name: str, inward: np.ndarray) -> np.ndarray:
        """Where the fingers take an object from behind (a mug's handle): `HANDLE_DEPTH` in from its
        point farthest back along `inward`, at the middle of its points within `HANDLE_SLICE` of that."""
        data = self.env.sim.data
        body = self.env.sim.model.geom_bodyid[self.geoms[name][0]]
        points = data.body_xpos[body] + self._hull[name] @ data.body_xmat[body].reshape(3, 3).T
        u = points @ inward
        near = points[u < u.min() + HANDLE_SLICE]
        point = (near.min(0) + near.max(0)) / 2
        return point + inward * (u.min() + HANDLE_DEPTH - point @ inward)

    def hinge(self, name: str) -> int | None:
        """A fixture's hinge joint (a door's), if its first joint is one."""
        if name not in self.env.fixtures_dict or not self.env.get_object(name).joints:
            return None
        j, _ = self.joint(name)
        return j if self.env.sim.model.jnt_type[j] == HINGE else None

    def pushable(self, name: str, c: ExpertConfig) -> bool:
        """Too wide for the fingers and too flat for a rim grasp (a plate): slid, not carried."""
        lo, hi = self.box(name)
        return is_rim_grasp((hi[:2] - lo[:2]) / 2, c) and hi[2] - lo[2] < c.finger_reach

    def closed(self, name: str) -> bool:
        """A place behind a drawer or door that is not open now (LIBERO's "closed" needs a drawer pushed
        past its rest position, so a drawer at rest is neither)."""
        states = self.env.object_states_dict
        return self.is_site(name) and bool(getattr(self.env.object_sites_dict[name], "joints", None)) \
            and not states[name].is_open()


def place_point(r: SimReader, obj: str, place: str, relation: str, slot: int = 0, slots: int = 1) -> np.ndarray:
    """Where `obj`'s bounding-box centre goes (xy) and its bottom's release height (z): its body (the
    point LIBERO's predicates test) over the place's centre, or, when several objects share it, over its
    slot along the region's axis the object is narrower along (two 15 cm moka pots side by side across
    their handles)."""
    lo, hi = r.box(obj)
    shift = (lo[:2] + hi[:2]) / 2 - r.body(obj)[:2]
    if r.is_site(place):
        centre = r.site(place)
        size = np.asarray(r.env.object_sites_dict[place].size, dtype=np.float64)
        axes = r.env.sim.data.get_site_xmat(place)[:, :2]
        k = int(np.argmin(np.abs(axes[:2].T) @ (hi[:2] - lo[:2])))  # the object's extent along each axis
        centre = centre + axes[:, k] * (slot - (slots - 1) / 2) * SLOT_SPACING * size[k]
        z = centre[2] + IN_ABOVE if relation == "in" else centre[2] + size[2] + ON_ABOVE
    else:
        centre = r.body(place)
        z = r.box(place)[1][2] + ON_ABOVE
    return np.array([centre[0] + shift[0], centre[1] + shift[1], z])


def region_half(r: SimReader, place: str) -> np.ndarray | None:
    """A region site's xy half extents along the world axes; None for an object."""
    if not r.is_site(place):
        return None
    size = np.asarray(r.env.object_sites_dict[place].size, dtype=np.float64)
    return (np.abs(r.env.sim.data.get_site_xmat(place)) @ size)[:2]


def pick_place_scene(r: SimReader, step: Step, eef: np.ndarray, staged: bool = False) -> Scene:
    """`staged`: the object goes to the table in front of its enclosure's mouth (`stage_point`), not its place."""
    lo, hi = r.box(step.target)
    if staged:
        place, place_half = stage_point(r, step.target, r.enclosure(step.place), eef), None
    else:
        place = place_point(r, step.target, step.place, step.relation, step.slot, step.slots)
        place_half = region_half(r, step.place)
    return Scene(eef=eef, object_center=(lo + hi) / 2, object_bottom=float(lo[2]), object_top=float(hi[2]),
                 place=place, yaw=r.yaw(),
                 object_half=(hi[:2] - lo[:2]) / 2, obstacles=r.obstacles(step.target, step.place),
                 floor=r.floor, place_half=place_half)


def knob_scene(r: SimReader, step: Step, eef: np.ndarray) -> KnobScene:
    j, q = r.joint(step.target)
    lo, hi = r.part_box(j)
    sim, on = r.env.sim, r.env.get_object(step.target).object_properties["articulation"]["default_turnon_ranges"]
    return KnobScene(eef=eef, yaw=r.yaw(), knob=(lo + hi) / 2, knob_top=float(hi[2]), knob_half=(hi[:2] - lo[:2]) / 2,
                     pivot=sim.data.xanchor[j][:2].copy(), turned=float(sim.data.qpos[q]),
                     goal=float(min(on)) + KNOB_MARGIN)


def push_scene(r: SimReader, step: Step, eef: np.ndarray) -> PushScene:
    """The place inside a region is its point nearest the centre where the pushed object clears its
    neighbours (`Push` plans its path around them once, at the start)."""
    lo, hi = r.box(step.target)
    half = (hi[:2] - lo[:2]) / 2
    place = place_point(r, step.target, step.place, step.relation)[:2]
    boxes = r.footprints(step.target, above=r.floor + PUSH_ABOVE)
    region = region_half(r, step.place)
    if region is not None:
        place = clear_spot(place, region, half, boxes)
    return PushScene(eef=eef, yaw=r.yaw(), object_center=(lo + hi) / 2, object_half=half,
                     object_top=float(hi[2]), place=place, floor=r.floor, boxes=boxes)


def stage_point(r: SimReader, obj: str, enclosure: Enclosure, eef: np.ndarray) -> np.ndarray:
    """Where `obj` is set down before it goes in (`place_point`'s convention: bounding-box centre xy,
    bottom z): on the table in front of the mouth, across from the enclosure's middle, with the object
    and the hand holding it `MOUTH_GAP` short of the mouth (a hand held along the mouth's axis reaches
    10 cm past the object)."""
    lo, hi = r.box(obj)
    centre, u = (lo + hi) / 2, enclosure.inward
    ahead = max(np.abs(hi - lo) @ np.abs(u) / 2, (eef - centre) @ u + hand_reach(r.yaw(), u, HAND))
    point = enclosure.middle + u * (enclosure.mouth - MOUTH_GAP - ahead - enclosure.middle @ u)
    point[2] = r.floor + ON_ABOVE
    return point


def hand_reach(yaw: float, direction: np.ndarray, c: ExpertConfig) -> float:
    """How far the hand, pointing down at `yaw`, reaches past the end effector along a horizontal direction."""
    axis = finger_axis(yaw)
    along = abs(axis @ direction[:2])
    return c.hand_half_length * along + c.hand_half_width * np.sqrt(max(1.0 - along ** 2, 0.0))


def insert_scene(r: SimReader, step: Step, eef: np.ndarray) -> InsertScene:
    """The object's body goes to the enclosure's middle (LIBERO's "in" tests the body), and as far in as
    keeps its back `MOUTH_GAP` inside the mouth (where a door shuts) and its front off the back wall."""
    e = r.enclosure(step.place)
    lo, hi = r.box(step.target)
    body = r.body(step.target)
    u = e.inward
    front, back = max(lo @ u, hi @ u) - body @ u, min(lo @ u, hi @ u) - body @ u
    goal = max(min(e.middle @ u, e.back - MOUTH_GAP - front), e.mouth + MOUTH_GAP - back)
    return InsertScene(eef=eef, rot=r.env.sim.data.get_site_xmat("gripper0_grip_site").copy(),
                       handle=r.back_point(step.target, u), object_bottom=float(lo[2]), inward=u,
                       floor=e.floor, depth=float(goal - body @ u))


def door_corners(r: SimReader, j: int) -> np.ndarray:
    """The corners of every colliding part on a hinge's body (the panel and its handle)."""
    model = r.env.sim.model
    geoms = np.flatnonzero((model.geom_bodyid == model.jnt_bodyid[j])
                           & ((model.geom_contype > 0) | (model.geom_conaffinity > 0)))
    return geom_corners(r.env.sim, geoms)


def wide_open(r: SimReader, door: str) -> tuple[float, float]:
    """The hinge angle of a door swung wide, `WIDE_MARGIN` short of its joint's limit on the open side,
    and that side (+1: the angle grows as the door opens)."""
    ranges = r.env.get_object(door).object_properties["articulation"]
    side = float(np.sign(np.mean(ranges["default_open_ranges"]) - np.mean(ranges["default_close_ranges"])))
    low, high = r.env.sim.model.jnt_range[r.hinge(door)]
    return (high - WIDE_MARGIN if side > 0 else low + WIDE_MARGIN), side


def door_in_the_way(r: SimReader, place: str, c: ExpertConfig) -> str | None:
    """The enclosure's hinged door, if part of it stands where the hand works in front of the mouth:
    within `hand_half_length` of the line the object goes in along (the hand lies across it)."""
    e = r.enclosure(place)
    door = getattr(r.env.object_states_dict[place], "parent_name", None) if e is not None else None
    if door is None or r.hinge(door) is None:
        return None
    corners = door_corners(r, r.hinge(door))
    side = np.array([-e.inward[1], e.inward[0], 0.0])
    along = corners @ e.inward
    beside = np.abs((corners - e.middle) @ side) < c.hand_half_length + c.clearance
    return door if bool(np.any(beside & (along < e.mouth) & (along > e.mouth - IN_FRONT))) else None


def door_scene(r: SimReader, step: Step, eef: np.ndarray) -> DoorScene:
    """The door on the fixture's hinge: its panel (every colliding part on the hinge's body, the handle
    too), which way it turns (shut: toward the middle of LIBERO's closed range; wide: toward
    `wide_open`) and whether it is there."""
    sim, model = r.env.sim, r.env.sim.model
    j = r.hinge(step.target)
    corners = door_corners(r, j)
    anchor, axis = sim.data.xanchor[j].copy(), sim.data.xaxis[j].copy()
    radial = corners.mean(0) - anchor
    radial[2] = 0.0
    radial /= np.linalg.norm(radial)
    q = float(sim.data.qpos[model.jnt_qposadr[j]])
    if step.skill == "close_door":
        goal = np.mean(r.env.get_object(step.target).object_properties["articulation"]["default_close_ranges"])
        there = r.holds("close", step.target)
    else:
        goal, side = wide_open(r, step.target)
        there = (q - goal) * side >= 0  # as far open as that or farther
    closing = np.sign(goal - q) * np.cross(axis, radial)
    rel = corners - anchor
    hinge = anchor.copy()
    hinge[2] = (corners[:, 2].min() + corners[:, 2].max()) / 2
    return DoorScene(eef=eef, yaw=r.yaw(), hinge=hinge, radial=radial, closing=closing,
                     width=float((rel @ radial).max()), face=float((rel @ closing).min()),
                     top=float(corners[:, 2].max()), there=bool(there))


def drawer_scene(r: SimReader, step: Step, eef: np.ndarray) -> DrawerScene:
    """The drawer behind a region site: its slide joint, the handle (the colliding geom of the drawer
    reaching farthest out along the pull) and the travel left to LIBERO's open or closed range."""
    sim, model = r.env.sim, r.env.sim.model
    site = r.env.object_sites_dict[step.target]
    j = model.joint_name2id(site.joints[0])
    ranges = r.env.get_object(site.parent_name).object_properties["articulation"]
    opened, shut = ranges["default_open_ranges"], ranges["default_close_ranges"]
    sign = np.sign(np.mean(opened) - np.mean(shut))  # qpos moves this way as the drawer opens
    pull = sign * sim.data.xaxis[j].copy()
    pull[2] = 0.0
    pull /= np.linalg.norm(pull)
    geoms = np.flatnonzero((model.geom_bodyid == model.jnt_bodyid[j]) & (model.geom_contype > 0))
    handle = sim.data.geom_xpos[geoms[np.argmax(sim.data.geom_xpos[geoms] @ pull)]].copy()
    q = float(sim.data.qpos[model.jnt_qposadr[j]])
    # to the middle of LIBERO's open or closed range
    travel = sign * (np.mean(opened) - q) if step.skill == "open" else -sign * (np.mean(shut) - q)
    return DrawerScene(eef=eef, rot=sim.data.get_site_xmat("gripper0_grip_site").copy(), handle=handle, pull=pull,
                       travel=float(travel))


SKILLS = {  # plan step -> (skill, the scene it reads)
    "pick_place": (PickPlace, pick_place_scene),
    "turn_on": (TurnKnob, knob_scene),
    "push": (Push, push_scene),
    "open": (Drawer, drawer_scene),
    "close": (lambda c: Drawer(c, opening=False), drawer_scene),
    "stage": (PickPlace, partial(pick_place_scene, staged=True)),
    "insert": (Insert, insert_scene),
    "close_door": (SwingDoor, door_scene),
    "widen_door": (SwingDoor, door_scene),
}


def _done_already(r: SimReader, step: Step) -> bool:
    """The step's goal holds now (LIBERO's own check): a drawer open or shut, a stove on, an object at its place."""
    if step.skill == "pick_place":
        return r.holds(step.relation, step.target, step.place)
    predicate = {"open": "open", "close": "close", "turn_on": "turnon"}.get(step.skill)
    return predicate is not None and r.holds(predicate, step.target)


class TaskExpert:
    """One episode's expert for one task: its plan's steps, one skill at a time."""

    def __init__(self, robosuite_env, config: ExpertConfig | None = None):
        self.reader, self.config = SimReader(robosuite_env), config or ExpertConfig()
        r = self.reader
        goal = robosuite_env.parsed_problem["goal_state"]
        names = {a for predicate in goal for a in predicate[1:]}
        self.steps = plan(goal, closed=frozenset(n for n in names if r.closed(n)),
                          pushable=frozenset(n for n in names if n in r.geoms and r.pushable(n, self.config)),
                          enclosed=frozenset(n for n in names if r.enclosure(n) is not None))
        self.steps = [step for s in self.steps for step in self._door_steps(s)]
        self._i, self._skill = -1, None
        self._next()

    def _door_steps(self, step: Step) -> list[Step]:
        """A hinged door is shut by `SwingDoor` (a drawer by `Drawer`); an open door that stands where the
        hand works in front of its enclosure's mouth is swung wide before the object is staged there."""
        r = self.reader
        if step.skill == "close" and r.hinge(step.target) is not None:
            return [replace(step, skill="close_door")]
        door = door_in_the_way(r, step.place, self.config) if step.skill == "stage" else None
        return [Step("widen_door", door), step] if door is not None else [step]

    def _next(self) -> None:
        self._i += 1
        while self._i < len(self.steps) and _done_already(self.reader, self.steps[self._i]):
            self._i += 1
        self._skill = self._make(self.steps[self._i]) if self._i < len(self.steps) else None

    def _make(self, step: Step):
        # a step no skill does yet (opening a hinged door: it needs a pull on its handle) ends the expert
        # there: it holds still and the episode fails, counted as failed like any other
        if step.skill in ("open", "close") and not self.reader.is_drawer(step.target):
            return None
        return SKILLS[step.skill][0](self.config)

    def _scene(self, step: Step, eef: np.ndarray):
        return SKILLS[step.skill][1](self.reader, step, eef)

    def _placed_already(self) -> bool:
        """A pick-and-place whose object is at its goal (LIBERO's own check) while its skill waits to grasp it
        (at the start, or after the object left the hand) is done: a target that let go over the place
        (DAgger) is labelled on to the next step, not back to pick the object up from where it belongs."""
        step = self.steps[self._i]
        return step.skill == "pick_place" and self._skill.phase is Phase.ABOVE and _done_already(self.reader, step)

    def act(self, eef: np.ndarray) -> np.ndarray:
        eef = np.asarray(eef, dtype=np.float64)
        while self._skill is not None and (self._skill.done or self._placed_already()):
            self._next()
        if self._skill is None:  # every step done: hold still, open
            a = np.zeros(7)
            a[-1] = -1.0
            return a
        return self._skill.act(self._scene(self.steps[self._i], eef))


def expert_actor(env):
    """The expert for one episode of a `LiberoEnv` just reset: `info` (with `ee_pos`) -> 7-D action."""
    expert = TaskExpert(env.simulator)
    return lambda info: expert.act(info["ee_pos"])
