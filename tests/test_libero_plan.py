"""LIBERO experts without a simulator: BDDL goals -> skill plans, and the wall grasp, knob, push and
drawer skills on synthetic scenes."""

from __future__ import annotations

import numpy as np
import pytest

from heisd.benchmarks.libero_plan import Step, plan
from heisd.benchmarks.libero_skills import (
    Drawer,
    DrawerPhase,
    DrawerScene,
    ExpertConfig,
    KnobPhase,
    KnobScene,
    Phase,
    PickPlace,
    Push,
    PushPhase,
    PushScene,
    Scene,
    TurnKnob,
    box_gaps,
    choose_rim,
    clear_spot,
    is_rim_grasp,
    push_path,
    rotation,
    rotation_error,
)
from heisd.errors import UsageError

CFG = ExpertConfig()


def test_place_goals_become_pick_and_place():
    # LIBERO-Spatial: every task is this goal
    assert plan([["on", "akita_black_bowl_1", "plate_1"]]) == [
        Step("pick_place", "akita_black_bowl_1", "plate_1", "on")]
    # LIBERO-10: two objects in the basket, in the goal's order
    assert [s.target for s in plan([["In", "alphabet_soup_1", "basket_1_contain_region"],
                                    ["In", "tomato_sauce_1", "basket_1_contain_region"]])] == [
        "alphabet_soup_1", "tomato_sauce_1"]


def test_a_closed_place_is_opened_first_and_closing_comes_last():
    region = "wooden_cabinet_1_top_region"
    assert plan([["in", "akita_black_bowl_1", region]], closed=frozenset({region})) == [
        Step("open", region), Step("pick_place", "akita_black_bowl_1", region, "in")]
    # LIBERO-10: "put the bowl in the bottom drawer and close it" lists Close first; the drawer starts open
    drawer = "white_cabinet_1_bottom_region"
    assert plan([["close", drawer], ["in", "akita_black_bowl_1", drawer]]) == [
        Step("pick_place", "akita_black_bowl_1", drawer, "in"), Step("close", drawer)]
    assert plan([["open", drawer]], closed=frozenset({drawer})) == [Step("open", drawer)]


def test_turn_on_push_and_unknown_predicates():
    steps = plan([["turnon", "flat_stove_1"], ["on", "moka_pot_1", "flat_stove_1_cook_region"]])
    assert [s.skill for s in steps] == ["turn_on", "pick_place"]
    assert plan([["on", "plate_1", "main_table_stove_front_region"]], pushable=frozenset({"plate_1"})) == [
        Step("push", "plate_1", "main_table_stove_front_region", "on")]
    with pytest.raises(UsageError, match="no scripted skill"):
        plan([["stack", "a", "b"]])


BOWL_HALF = np.array([0.078, 0.078])  # LIBERO's black bowl, 15.7 cm across


def _bowl(obstacles=()) -> Scene:
    """The bowl standing at the origin, the hand above it, `obstacles` as `Scene` takes them."""
    return Scene(eef=np.array([0.0, 0.0, 1.2]), object_center=np.array([0.0, 0.0, 0.927]), object_bottom=0.9,
                 object_top=0.954, place=np.zeros(3), object_half=BOWL_HALF, floor=0.9,
                 obstacles=np.array(obstacles, dtype=np.float64).reshape(-1, 4))


def test_a_bowl_is_grasped_by_its_wall_on_the_clear_side():
    assert is_rim_grasp(BOWL_HALF, CFG) and not is_rim_grasp(np.array([0.036, 0.036]), CFG)  # a can: centre grasp
    g = PickPlace().grasp_point(_bowl())
    assert g[1] == pytest.approx(BOWL_HALF[1] - CFG.rim_inset) and g[2] == pytest.approx(0.954 - CFG.finger_reach)
    tall = [[0.0, 0.16, 0.04, 1.1]]  # a tall neighbour beyond the +y wall: take the -y wall
    g = PickPlace().grasp_point(_bowl(tall))
    assert g[1] == pytest.approx(-(BOWL_HALF[1] - CFG.rim_inset))


def test_a_bowl_boxed_in_y_is_taken_at_a_diagonal_turned_plus_45_while_one_is_clear():
    # LIBERO-10's bowl beside the open drawer: the y walls are blocked and the diagonal taken used to flip
    # between +45 and -45 degrees with which one first cleared the hand by 1 cm (BENCHMARKS 18.21)
    walls_y = [[0.0, 0.16, 0.04, 1.1], [0.0, -0.16, 0.04, 1.1]]
    corner = {"-x+y": [-0.13, 0.13, 0.03, 1.1], "+x-y": [0.13, -0.13, 0.03, 1.1]}
    d = (BOWL_HALF[0] - CFG.rim_inset) / np.sqrt(2)
    for blocked, (x, y), yaw in [([], (-d, d), 45), (["-x+y"], (d, -d), 45), (["-x+y", "+x-y"], (d, d), -45)]:
        grasp, got = choose_rim(_bowl(walls_y + [corner[k] for k in blocked]), CFG)
        assert grasp[:2] == pytest.approx([x, y]) and np.degrees(got) == pytest.approx(yaw)


def test_the_retreat_after_a_place_ends_when_the_hand_is_up_not_after_a_time():
    skill = PickPlace(phase=Phase.RETREAT)
    low = Scene(**{**_bowl().__dict__, "eef": np.array([0.0, 0.0, 1.0])})
    for _ in range(2 * CFG.retreat_steps):
        a = skill.act(low)
        assert not skill.done and a[2] > 0  # up, however long that takes: a target cannot see the time
    skill.act(Scene(**{**low.__dict__, "eef": np.array([0.0, 0.0, 1.2 - CFG.tolerance])}))  # carrying height: 1.2
    assert skill.done


def test_a_pushed_object_goes_where_the_region_clears_its_neighbours():
    centre, half, plate = np.array([-0.05, 0.21]), np.array([0.04, 0.04]), np.array([0.075, 0.075])
    assert np.allclose(clear_spot(centre, half, plate, np.zeros((0, 4))), centre)  # nothing near: the centre
    cheese = np.array([[-0.1, 0.105, 0.0, 0.155]])  # LIBERO-Goal's cream cheese, in front of the stove's region
    assert box_gaps(centre[None], plate, cheese)[0] < 0  # at the centre the plate would ride onto it
    spot = clear_spot(centre, half, plate, cheese)
    assert spot[1] == pytest.approx(centre[1] + half[1] - 0.01)  # as far from it as the region allows
    assert box_gaps(spot[None], plate, cheese)[0] == pytest.approx(0.01)


def test_knob_is_grasped_turned_to_its_goal_and_let_go():
    skill, eef, yaw, turned = TurnKnob(), np.array([0.0, 0.0, 1.1]), 0.0, 0.0
    knob = np.array([0.0, 0.0, 0.93])
    for _ in range(200):
        s = KnobScene(eef=eef, yaw=yaw, knob=knob, knob_top=0.965, knob_half=np.array([0.012, 0.024]),
                      pivot=np.array([0.02, 0.0]), turned=turned, goal=0.8)
        a = skill.act(s)
        eef = eef + 0.02 * a[:3]
        if skill.phase is KnobPhase.TURN:
            assert a[-1] == 1.0 and a[5] > 0  # closed, turning about +z
            turned += 0.5 * a[5]  # the knob turns with the hand
        if skill.done:
            break
    assert skill.done and turned >= 0.8


def test_push_starts_inside_the_far_rim_and_slides_toward_the_place():
    skill = Push()
    centre, place = np.array([0.05, 0.0, 0.91]), np.array([0.05, 0.2])
    s = PushScene(eef=np.array([0.0, 0.0, 1.1]), yaw=0.0, object_center=centre, object_half=np.array([0.08, 0.08]),
                  object_top=0.92, place=place, floor=0.9)
    a = skill.act(s)
    assert skill.phase is PushPhase.BEHIND and a[-1] == 1.0  # fingers closed, a pusher
    behind = skill._target(s)
    assert behind[1] == pytest.approx(-(0.08 - skill.inset)) and behind[2] > 0.92  # inside the rim, from above
    down = PushScene(**{**s.__dict__, "eef": np.array([0.05, behind[1], 0.9 + skill.press]), "yaw": np.pi / 2})
    skill.phase = PushPhase.DOWN
    a = skill.act(down)
    assert skill.phase is PushPhase.PUSH and a[1] > 0  # toward the place
    skill.act(PushScene(**{**down.__dict__, "object_center": np.array([0.05, 0.199, 0.91])}))
    assert skill.phase is PushPhase.RETREAT


def test_push_path_goes_around_the_neighbours():
    """LIBERO-Goal's plate to the front of the stove: the bowl touches it at the start and the cream
    cheese stands between it and the place; the straight push runs into both, the path into neither."""
    bowl, cheese = [-0.168, -0.078, -0.012, 0.078], [-0.1, 0.105, 0.0, 0.155]
    boxes, plate = np.array([bowl, cheese]), np.array([0.075, 0.075])
    start, goal = np.array([0.05, -0.02]), np.array([-0.05, 0.24])
    line = start + np.linspace(0, 1, 50)[:, None] * (goal - start)
    assert box_gaps(line, plate, boxes).min() < -0.05
    path = push_path(start, goal, plate, boxes)
    assert np.allclose(path[-1], goal) and len(path) > 1
    corners = [start, *path]
    legs = zip(corners[:-1], corners[1:], strict=True)
    swept = np.concatenate([a + np.linspace(0, 1, 50)[:, None] * (b - a) for a, b in legs])
    assert box_gaps(swept, plate, boxes).min() >= box_gaps(start[None], plate, boxes)[0] - 1e-9  # never deeper
    assert box_gaps(swept[len(swept) // 4:], plate, boxes).min() > 0  # and off them once away from the start
    assert [np.asarray(p).tolist() for p in push_path(start, goal, plate, np.zeros((0, 4)))] == [goal.tolist()]


def test_push_goes_back_over_the_object_when_the_hand_slips_off():
    skill = Push(phase=PushPhase.PUSH)
    s = PushScene(eef=np.array([0.05, -0.04, 0.908]), yaw=np.pi / 2, object_center=np.array([0.05, 0.0, 0.91]),
                  object_half=np.array([0.08, 0.08]), object_top=0.92, place=np.array([0.05, 0.2]), floor=0.9)
    skill.act(s)
    assert skill.phase is PushPhase.PUSH  # the fingers on the plate: on
    s = PushScene(**{**s.__dict__, "eef": np.array([0.05, 0.1, 0.908])})  # the plate stayed, the hand went on
    a = skill.act(s)
    assert skill.phase is PushPhase.BEHIND and a[2] > 0  # up, to go down behind it again


def test_rotation_error_is_the_world_rotation_vector():
    start = np.array([[0.0, 1.0, 0.0], [1.0, 0.0, 0.0], [0.0, 0.0, -1.0]])  # the Panda's start: fingers down
    axis = np.array([0.6, 0.0, 0.8])
    assert np.allclose(rotation_error(rotation(axis, 0.7) @ start, start), 0.7 * axis)
    assert np.allclose(rotation_error(start, start), 0.0)


def test_drawer_points_the_fingers_into_the_cabinet_then_pulls():
    start = np.array([[0.0, 1.0, 0.0], [1.0, 0.0, 0.0], [0.0, 0.0, -1.0]])  # grip site: x finger axis, z along fingers
    pull, handle = np.array([0.0, 1.0, 0.0]), np.array([0.04, -0.13, 1.015])  # LIBERO-Goal's middle drawer
    skill = Drawer()
    s = DrawerScene(eef=np.array([-0.2, 0.0, 1.17]), rot=start, handle=handle, pull=pull, travel=0.15)
    a = skill.act(s)
    assert np.allclose(skill._work[:, 2], -pull, atol=1e-9)  # the fingers point into the cabinet
    assert np.allclose(np.abs(skill._work[:, 0]), [0, 0, 1], atol=1e-9)  # they close vertically, on the bar
    front = handle + pull * skill.standoff
    # over the point in front of the handle first: the turned hand reaches 10.5 cm below the grip site
    assert np.allclose(skill._target(s), front + [0, 0, CFG.hand_half_length]) and np.abs(a[3:6]).max() > 0
    over = DrawerScene(**{**s.__dict__, "eef": front + [0.005, 0, CFG.hand_half_length]})
    assert np.allclose(skill._target(over), front)  # then straight down to it
    at = DrawerScene(eef=handle, rot=skill._work, handle=handle, pull=pull, travel=0.15)
    skill.phase = DrawerPhase.REACH
    skill.act(at)
    assert skill.phase is DrawerPhase.GRIP
    for _ in range(CFG.close_steps):
        skill.act(at)
    a = skill.act(at)
    assert skill.phase is DrawerPhase.MOVE and a[1] > 0 and a[-1] == 1.0  # pulling, fingers closed
    skill.act(DrawerScene(**{**at.__dict__, "travel": -0.001}))
    assert skill.phase is DrawerPhase.RELEASE


def test_drawer_closing_keeps_the_hand_open_until_it_is_in_front_of_the_handle():
    start = np.array([[0.0, 1.0, 0.0], [1.0, 0.0, 0.0], [0.0, 0.0, -1.0]])
    pull, handle = np.array([0.0, -1.0, 0.0]), np.array([0.0, 0.02, 0.93])  # LIBERO-10's bottom drawer, open
    skill = Drawer(opening=False)
    s = DrawerScene(eef=np.array([0.05, 0.1, 1.16]), rot=start, handle=handle, pull=pull, travel=0.15)
    # open on the way: an empty closed hand would read as one holding the bowl by its rim (BENCHMARKS 18.27)
    assert skill.act(s)[-1] == -1.0 and skill.phase is DrawerPhase.FACE
    front = handle + pull * skill.close_standoff
    there = DrawerScene(eef=front, rot=skill._work, handle=handle, pull=pull, travel=0.15)
    assert skill.act(there)[-1] == 1.0 and skill.phase is DrawerPhase.GRIP  # closes in front of it, in place
    for _ in range(CFG.close_steps - 1):
        a = skill.act(there)
        assert np.abs(a[:3]).max() < 1e-9 and a[-1] == 1.0
    a = skill.act(there)
    assert skill.phase is DrawerPhase.REACH and a[1] > 0 and a[-1] == 1.0  # then onto the handle, closed
    at = DrawerScene(**{**there.__dict__, "eef": handle + pull * 0.02})
    a = skill.act(at)
    assert skill.phase is DrawerPhase.MOVE and a[1] > 0 and a[-1] == 1.0  # and pushes it in
    risen = DrawerScene(**{**at.__dict__, "eef": at.eef + [0.0, 0.0, 0.02]})
    assert skill.act(risen)[2] < 0  # level with the handle, where the finger tips push it
    skill.act(DrawerScene(**{**at.__dict__, "travel": -0.001}))
    assert skill.phase is DrawerPhase.RELEASE


def test_objects_on_one_region_go_side_by_side():
    cook = "flat_stove_1_cook_region"
    steps = plan([["on", "moka_pot_1", cook], ["on", "moka_pot_2", cook], ["turnon", "flat_stove_1"]])
    assert [(s.skill, s.slot, s.slots) for s in steps] == [("pick_place", 0, 2), ("pick_place", 1, 2), ("turn_on", 0, 1)]
    basket = "basket_1_contain_region"  # `in` a container: dropped in, no slots
    assert {s.slots for s in plan([["in", "a", basket], ["in", "b", basket]])} == {1}
