"""A place under a roof and its hinged door (LIBERO-10's microwave): the enclosure read from the fixture,
the handle the fingers take, the pose that points them in, which way the door turns, the plan's steps,
and the way over to a grasp kept above what stands on the path."""

from __future__ import annotations

import numpy as np
import pytest

from heisd.benchmarks.libero_enclosure import DoorScene, Insert, InsertPhase, InsertScene, SwingDoor, _insert_pose
from heisd.benchmarks.libero_plan import Step, plan
from heisd.benchmarks.libero_skills import ExpertConfig, Scene, rotation, rotation_error, transit_height

MICROWAVE_TASK = "KITCHEN_SCENE6_put_the_yellow_and_white_mug_in_the_microwave_and_close_it"
MUG, REGION, DOOR = "white_yellow_mug_1", "microwave_1_heating_region", "microwave_1"
DOWN = np.array([[0.0, 1.0, 0.0], [1.0, 0.0, 0.0], [0.0, 0.0, -1.0]])  # the grip frame pointing down at yaw 0


@pytest.fixture(scope="module")
def microwave():
    """The microwave scene on a fresh layout whose door stands open far enough to be out of the way."""
    pytest.importorskip("libero", reason="the libero extra is not installed (pip install -e '.[libero]')")
    from heisd.benchmarks.libero import LiberoConfig, LiberoEnv
    from heisd.runtime.recording import episode_seed

    env = LiberoEnv("libero_10", MICROWAVE_TASK, LiberoConfig(image_size=32, fast_render=True))
    env.reset(options={"layout_seed": episode_seed(0, MICROWAVE_TASK, 0)})
    yield env
    env.close()


def test_plan_puts_an_object_into_an_enclosure_from_the_side():
    assert plan([["in", MUG, REGION], ["close", DOOR]], enclosed=frozenset({REGION})) == [
        Step("stage", MUG, REGION, "in"), Step("insert", MUG, REGION, "in"), Step("close", DOOR)]
    assert plan([["in", MUG, REGION]]) == [Step("pick_place", MUG, REGION, "in")]


def test_insert_pose_points_the_fingers_in_and_down_closing_across():
    inward = np.array([0.0, 1.0, 0.0])
    for pitch in (0.0, np.pi / 4):
        pose = _insert_pose(DOWN, inward, pitch)
        np.testing.assert_allclose(pose.T @ pose, np.eye(3), atol=1e-12)
        assert np.isclose(np.linalg.det(pose), 1.0)
        np.testing.assert_allclose(pose[:, 2], [0.0, np.cos(pitch), -np.sin(pitch)], atol=1e-12)
        assert abs(pose[2, 0]) < 1e-12 and abs(pose[:, 0] @ inward) < 1e-12  # finger axis level, across
    # of the two frames (finger axis +x or -x), the one the wrist reaches turning least
    turned = rotation(np.array([0.0, 0.0, 1.0]), 2.5) @ DOWN
    chosen = _insert_pose(turned, inward, np.pi / 4)
    other = chosen @ np.diag([-1.0, -1.0, 1.0])
    assert np.linalg.norm(rotation_error(chosen, turned)) < np.linalg.norm(rotation_error(other, turned))


def _insert_scene(eef, depth=0.2, bottom=0.9, handle=(0.0, 0.0, 0.95), rot=DOWN):
    return InsertScene(eef=np.asarray(eef, dtype=np.float64), rot=rot, handle=np.asarray(handle),
                       object_bottom=bottom, inward=np.array([0.0, 1.0, 0.0]), floor=0.944, depth=depth)


def test_insert_lifts_over_the_floor_before_it_slides_in_and_releases_only_there():
    skill = Insert()
    pose = _insert_pose(DOWN, np.array([0.0, 1.0, 0.0]), skill.pitch)
    skill.act(_insert_scene([0.0, -0.1, 1.1]))
    skill.phase = InsertPhase.GRIP
    skill._count = ExpertConfig().close_steps
    a = skill.act(_insert_scene([0.0, 0.0, 0.95], rot=pose))
    assert skill.phase is InsertPhase.LIFT and a[2] > 0 and abs(a[1]) < 1e-9 and a[-1] == 1.0  # straight up, held
    a = skill.act(_insert_scene([0.0, 0.0, 1.0], bottom=0.944 + skill.clear, rot=pose))
    assert skill.phase is InsertPhase.SLIDE and a[1] > 0 and a[-1] == 1.0  # in, still held
    a = skill.act(_insert_scene([0.0, 0.2, 1.0], depth=0.0, bottom=0.944 + skill.clear, rot=pose))
    assert skill.phase is InsertPhase.RELEASE and a[-1] == -1.0


def _door_scene(radial, closing, eef=(0.0, 0.0, 1.2), yaw=0.0, there=False):
    return DoorScene(eef=np.asarray(eef, dtype=np.float64), yaw=yaw, hinge=np.array([0.0, 0.0, 1.0]),
                     radial=np.asarray(radial, dtype=np.float64), closing=np.asarray(closing, dtype=np.float64),
                     width=0.26, face=-0.025, top=1.1, there=there)


def test_swing_door_pushes_from_behind_the_face_along_the_arc():
    """A door along -y closing toward +x (about +z): the hand goes down behind its face (at -x), turned
    with its finger axis along the panel, then aims ahead along the arc; once the door is there it
    backs off."""
    skill, c = SwingDoor(), ExpertConfig()
    scene = _door_scene([0.0, -1.0, 0.0], [1.0, 0.0, 0.0])
    start = skill._at(scene, 0.0, skill.gap)
    np.testing.assert_allclose(start, [-0.025 - c.hand_half_width - skill.gap, -skill.radius * 0.26, 1.0])
    assert abs(skill._yaw_error(_door_scene([0.0, -1.0, 0.0], [1.0, 0.0, 0.0], yaw=0.0))) < 1e-12
    assert np.isclose(abs(skill._yaw_error(_door_scene([1.0, 0.0, 0.0], [0.0, 1.0, 0.0], yaw=0.0))), np.pi / 2)
    skill.phase = skill.phase.PUSH
    ahead = skill._target(scene)
    assert ahead[0] > start[0] and ahead[1] < 0  # turned toward +x about the hinge, still on the -y side
    skill.act(_door_scene([0.0, -1.0, 0.0], [1.0, 0.0, 0.0], eef=start, there=True))
    assert skill.phase is skill.phase.BACK
    fresh = SwingDoor()  # a door there already: nothing to push
    fresh.act(_door_scene([0.0, -1.0, 0.0], [1.0, 0.0, 0.0], there=True))
    assert fresh.done


def test_swing_door_keeps_the_hand_open_until_over_the_face():
    """The hand goes over the point behind the face open, closes there for `close_steps` without moving
    on, then goes down closed: an empty hand closed on the way reads as one holding the mug."""
    skill, c = SwingDoor(), ExpertConfig()
    radial, closing = [0.0, -1.0, 0.0], [1.0, 0.0, 0.0]
    assert skill.act(_door_scene(radial, closing))[-1] == -1.0  # on the way: open
    over = skill._target(_door_scene(radial, closing))
    a = skill.act(_door_scene(radial, closing, eef=over))
    assert skill.phase is skill.phase.GRIP and a[-1] == 1.0 and np.allclose(a[:3], 0.0)  # closes in place
    for _ in range(c.close_steps - 1):
        skill.act(_door_scene(radial, closing, eef=over))
    assert skill.phase is skill.phase.GRIP
    a = skill.act(_door_scene(radial, closing, eef=over))
    assert skill.phase is skill.phase.DOWN and a[2] < 0 and a[-1] == 1.0  # down, closed


def test_transit_keeps_the_fingers_over_what_stands_on_the_way_until_over_the_goal():
    """On the way the fingers stay over everything within the hand's reach of the path (a door on the way,
    a carton beside the goal); over the goal `approach_height` alone lets them down."""
    c = ExpertConfig()
    goal = np.array([0.3, 0.0, 1.0])
    door = np.array([[0.15, 0.05, 0.02, 1.1]])  # on the path
    carton = np.array([[0.32, 0.05, 0.03, 1.2]])  # beside the goal
    aside = np.array([[0.15, 0.4, 0.02, 1.3]])  # off the path

    def height(eef, obstacles):
        scene = Scene(eef=np.asarray(eef), object_center=goal, object_bottom=0.9, object_top=1.0, place=goal,
                      obstacles=obstacles)
        return transit_height(scene, goal, c)

    assert height([0.0, 0.0, 1.2], door) == pytest.approx(1.1 + c.clearance + c.finger_half)
    assert height([0.0, 0.0, 1.2], np.concatenate([carton, aside])) == pytest.approx(1.2 + c.clearance + c.finger_half)
    assert height([0.0, 0.0, 1.2], aside) == -np.inf
    assert height([0.305, 0.0, 1.2], np.concatenate([door, carton])) == -np.inf  # over the goal


def test_enclosure_of_the_microwave(microwave):
    """The cavity opens toward -y (the robot's right): inward +y, its floor and mouth where the fixture's
    walls are; a contain region with no roof (the basket) is no enclosure."""
    from heisd.benchmarks.libero_experts import SimReader, geom_boxes

    reader = SimReader(microwave.simulator)
    e = reader.enclosure(REGION)
    np.testing.assert_allclose(e.inward, [0.0, 1.0, 0.0])
    site = reader.site(REGION)
    assert e.mouth < site[1] < e.back and e.back - e.mouth > 0.12  # a cavity deeper than the mug's cup
    assert site[2] - 0.1 < e.floor < site[2]
    centre, half = geom_boxes(microwave.simulator.sim, reader._fixture_geoms)
    lo, hi = centre - half, centre + half
    level = (lo[:, 1] < site[1]) & (site[1] < hi[:, 1]) & (lo[:, 2] < site[2]) & (site[2] < hi[:, 2])
    left, right = np.flatnonzero(level & (hi[:, 0] < site[0])), np.flatnonzero(level & (lo[:, 0] > site[0]))
    left, right = left[np.argmax(hi[left, 0])], right[np.argmin(lo[right, 0])]  # the side walls
    assert e.mouth == pytest.approx(min(lo[left, 1], lo[right, 1]))  # where the side walls begin
    assert e.middle[0] == pytest.approx((hi[left, 0] + lo[right, 0]) / 2)
    assert reader.enclosure("microwave_1_top_side") is None  # on top: no roof


def test_handle_is_the_mugs_part_farthest_from_the_mouth(microwave):
    from heisd.benchmarks.libero_experts import HANDLE_DEPTH, SimReader

    reader = SimReader(microwave.simulator)
    inward = np.array([0.0, 1.0, 0.0])
    lo, hi = reader.box(MUG)
    point = reader.back_point(MUG, inward)
    assert point[1] == pytest.approx(lo[1] + HANDLE_DEPTH)
    # the handle sticks out behind the cup's middle, halfway up the mug
    sim, model = microwave.simulator.sim, microwave.simulator.sim.model
    handle = [g for g in reader.geoms[MUG] if model.geom_contype[g] and sim.data.geom_xpos[g][1] < lo[1] + 0.02]
    assert handle and abs(point[0] - sim.data.geom_xpos[handle[0]][0]) < 0.01
    assert lo[2] + 0.3 * (hi[2] - lo[2]) < point[2] < lo[2] + 0.7 * (hi[2] - lo[2])


def test_door_turns_the_way_its_scene_says(microwave):
    """Moving the hinge a little toward shut moves the panel along `closing` for the close; a door open
    wider than the swing wide wants is there already, one open less is swung the other way; the plan
    of the scene closes the door with `SwingDoor`."""
    from heisd.benchmarks.libero_experts import SimReader, TaskExpert, door_corners, door_scene, wide_open

    sim = microwave.simulator.sim
    reader = SimReader(microwave.simulator)
    j = reader.hinge(DOOR)
    q = sim.model.jnt_qposadr[j]
    saved = sim.get_state().flatten()
    try:
        close = door_scene(reader, Step("close_door", DOOR), np.zeros(3))
        assert not close.there and close.face < 0
        assert (sim.data.qpos[q] < wide_open(reader, DOOR)[0]) == door_scene(reader, Step("widen_door", DOOR),
                                                                            np.zeros(3)).there
        before = door_corners(reader, j).mean(0)
        sim.data.qpos[q] += 0.05  # LIBERO's microwave closes toward 0 from below
        sim.forward()
        assert (door_corners(reader, j).mean(0) - before) @ close.closing > 0.005
        sim.data.qpos[q] = -1.5  # open less than wide
        sim.forward()
        close = door_scene(reader, Step("close_door", DOOR), np.zeros(3))
        wide = door_scene(reader, Step("widen_door", DOOR), np.zeros(3))
        assert not wide.there
        np.testing.assert_allclose(close.closing, -wide.closing, atol=1e-12)
    finally:
        sim.set_state_from_flattened(saved)
        sim.forward()
    steps = [s.skill for s in TaskExpert(microwave.simulator).steps]
    assert steps in (["stage", "insert", "close_door"], ["widen_door", "stage", "insert", "close_door"])


def test_stage_point_leaves_the_object_and_the_hand_short_of_the_mouth(microwave):
    """Held 4 cm off its centre toward the mouth by a hand along the mouth's axis (yaw 0: the finger axis
    along y), the mug is set down so that the hand's far end, not the mug, stops `MOUTH_GAP` short."""
    from heisd.benchmarks.libero_experts import HAND, MOUTH_GAP, ON_ABOVE, SimReader, stage_point

    reader = SimReader(microwave.simulator)
    e = reader.enclosure(REGION)
    lo, hi = reader.box(MUG)
    centre = (lo + hi) / 2
    assert abs(reader.yaw()) < 1e-3  # the hand starts pointing down at yaw 0
    held_at = centre + np.array([0.0, 0.04, 0.1])
    point = stage_point(reader, MUG, e, held_at)
    assert point[1] == pytest.approx(e.mouth - MOUTH_GAP - 0.04 - HAND.hand_half_length, abs=2e-3)
    assert point[0] == pytest.approx(e.middle[0]) and point[2] == pytest.approx(reader.floor + ON_ABOVE)
    far_back = stage_point(reader, MUG, e, centre - np.array([0.0, 0.2, 0.0]))  # the hand far behind
    assert far_back[1] == pytest.approx(e.mouth - MOUTH_GAP - (hi[1] - lo[1]) / 2)  # the mug's own front
