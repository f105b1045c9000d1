"""LIBERO scripted experts (the pick-and-place skill): the phase machine, grasp point, yaw and approach on
synthetic poses, DART noise, object boxes from the meshes, fresh demo layouts disjoint from the evaluation's
init states, and one recorded episode read back."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import LIBERO_TASK

from heisd.benchmarks.libero_experts import check_expert_suite
from heisd.benchmarks.libero_skills import (
    ExpertConfig, Phase, PickPlace, Scene, approach_height, choose_grasp, choose_yaw, hand_clearance, place_turn,
    rotation,
)
from heisd.errors import UsageError
from heisd.runtime.recording import dart_action

CFG = ExpertConfig()
PLACE = np.array([0.0, 0.26, 0.067])  # the basket's contain region, as LIBERO-Object puts it


def _scene(eef, centre, height=0.08, yaw=0.0, half=(0.03, 0.03), obstacles=np.zeros((0, 4))) -> Scene:
    centre = np.asarray(centre, dtype=np.float64)
    return Scene(eef=np.asarray(eef, dtype=np.float64), object_center=centre, object_bottom=centre[2] - height / 2,
                 object_top=centre[2] + height / 2, place=PLACE, yaw=yaw, object_half=np.asarray(half),
                 obstacles=obstacles)


class ToyWorld:
    """Point kinematics: the hand moves 2 cm per unit action and turns 0.3 rad per unit; the object
    follows the hand once the gripper has been closed near it, and drops when it opens."""

    def __init__(self, obj=(0.05, -0.10, 0.04), height=0.08, half=(0.03, 0.03), obstacles=np.zeros((0, 4))):
        self.eef, self.yaw = np.array([-0.15, 0.0, 0.25]), 0.0
        self.obj = np.array(obj)  # default: centre of an 8 cm tall object standing on the floor
        self.height, self.half, self.obstacles = height, half, obstacles
        self.held, self.closed_steps = False, 0

    def scene(self) -> Scene:
        return _scene(self.eef, self.obj, self.height, self.yaw, self.half, self.obstacles)

    def step(self, a: np.ndarray) -> None:
        self.eef = self.eef + 0.02 * a[:3]
        self.yaw += 0.3 * a[5]
        self.closed_steps = self.closed_steps + 1 if a[-1] > 0 else 0
        if self.closed_steps >= 5 and np.linalg.norm(self.obj[:2] - self.eef[:2]) < 0.01:
            self.held = True
        if a[-1] < 0:
            self.held = False
        if self.held:
            self.obj = self.eef.copy()  # the grasp point is the object's centre here


def test_expert_picks_and_places_in_a_toy_world():
    world, expert = ToyWorld(), PickPlace()
    phases = []
    for _ in range(300):
        a = expert.act(world.scene())
        assert a.shape == (7,) and np.all(np.abs(a) <= 1) and a[-1] in (-1.0, 1.0)
        if not phases or phases[-1] != expert.phase:
            phases.append(expert.phase)
        world.step(a)
    assert phases == list(Phase)  # every phase once, in order: no regrasp was needed
    assert np.linalg.norm(world.obj[:2] - PLACE[:2]) < 0.015 and not world.held  # released over the basket
    assert world.eef[2] > CFG.carry_z - 0.03  # retreated up


def test_expert_phases_on_synthetic_poses():
    expert = PickPlace()
    obj = np.array([0.05, -0.10, 0.04])
    a = expert.act(_scene([-0.15, 0.0, 0.25], obj))
    assert expert.phase is Phase.ABOVE and a[-1] == -1.0 and a[5] == 0.0  # no neighbours: yaw stays 0
    assert a[0] > 0 and a[1] < 0  # toward the object
    above = np.array([0.05, -0.10, 0.08 + CFG.hover])  # the object's top + hover
    expert.act(_scene(above, obj))
    assert expert.phase is Phase.DESCEND
    a = expert.act(_scene(above, obj))
    assert a[2] == -1.0  # 6 cm above the grasp point: full speed down
    grasp = np.array([0.05, -0.10, 0.05])  # top - finger reach: the palm stays above the object
    expert.act(_scene(grasp, obj))
    assert expert.phase is Phase.CLOSE
    for _ in range(CFG.close_steps - 1):
        assert expert.act(_scene(grasp, obj))[-1] == 1.0 and expert.phase is Phase.CLOSE
    a = expert.act(_scene(grasp, obj))
    assert expert.phase is Phase.LIFT and a[2] > 0 and a[-1] == 1.0
    a = expert.act(_scene([0.05, -0.10, 0.15], [0.3, 0.3, 0.04]))  # the object stayed behind: lost
    assert expert.phase is Phase.ABOVE and a[-1] == -1.0


def test_labels_carry_an_object_another_hand_lifted():
    """DAgger: the target grasped and lifted the object while the labelling expert still waited for the hand
    at its approach point; from the lift on the labels carry it (gripper closed), never "open, go back over
    where it stood". An object risen with the hand elsewhere is not in the hand."""
    obj = np.array([0.05, -0.10, 0.04])
    expert = PickPlace()
    a = expert.act(_scene([0.05, -0.10, 0.05], obj))  # at the grasp point, never at the approach point
    assert expert.phase is Phase.ABOVE and a[-1] == -1.0
    a = expert.act(_scene([0.05, -0.10, 0.07], obj + [0.0, 0.0, 0.015]))  # less than `lifted` up: not yet
    assert expert.phase is Phase.ABOVE and a[-1] == -1.0
    a = expert.act(_scene([0.05, -0.10, 0.08], obj + [0.0, 0.0, 0.03]))
    assert expert.phase is Phase.LIFT and a[-1] == 1.0 and a[2] > 0
    a = expert.act(_scene([0.05, -0.10, 0.10], obj + [0.0, 0.0, 0.05]))
    assert expert.phase is Phase.LIFT and a[-1] == 1.0  # it moves with the hand: held
    elsewhere = PickPlace()
    elsewhere.act(_scene([-0.15, 0.0, 0.25], obj))
    a = elsewhere.act(_scene([-0.15, 0.0, 0.25], obj + [0.0, 0.0, 0.03]))
    assert elsewhere.phase is Phase.ABOVE and a[-1] == -1.0


def test_labels_keep_an_object_another_hand_holds_turned_from_the_chosen_yaw():
    """DAgger: the target took a bowl by its wall, 5.5 cm off its centre, with the hand turned 1 rad from the
    yaw the labeller chose (0: no neighbours). Held is counted from the hand as it holds it: the bowl rising and
    turning with the hand stays held, and the labels keep the hand's yaw instead of "open, turn, grasp again"."""
    half, centre = (0.07, 0.07), np.array([0.05, -0.10, 0.03])
    expert = PickPlace()
    expert.act(_scene([-0.15, 0.0, 0.25], centre, height=0.06, half=half))
    offset = np.array([0.055, 0.0, -0.02])  # bowl centre - end effector, the hand over its -x wall
    for rise, turn in ((0.03, 0.0), (0.05, 0.0), (0.07, 0.3), (0.09, 0.6)):
        eef = centre - offset + [0.0, 0.0, rise]
        bowl = eef + rotation(np.array([0.0, 0.0, 1.0]), turn) @ offset
        a = expert.act(_scene(eef, bowl, height=0.06, yaw=1.0 + turn, half=half))
        assert expert.phase is Phase.LIFT and a[-1] == 1.0 and a[2] > 0
        assert a[5] == pytest.approx(-CFG.yaw_gain * turn)  # back to the yaw it was taken at, not to 0


def test_descent_held_short_of_the_grasp_closes_where_it_stands():
    """A bowl's far rim under the hand's body stops it 1.4 cm above a wall grasp: after `stall_steps` there the
    fingers close; farther off (2.5 cm), the hand keeps descending."""
    obj = np.array([0.05, -0.10, 0.04])
    for short, closes in ((0.014, True), (0.025, False)):
        expert = PickPlace()
        expert.act(_scene([0.05, -0.10, 0.08 + CFG.hover], obj))
        expert.act(_scene([0.05, -0.10, 0.08 + CFG.hover], obj))
        assert expert.phase is Phase.DESCEND
        held = [0.05, -0.10, expert.grasp_point(_scene([0, 0, 0.2], obj))[2] + short]
        for _ in range(CFG.stall_steps):
            expert.act(_scene(held, obj))
        assert (expert.phase is Phase.CLOSE) is closes


def test_a_held_object_turns_a_quarter_to_fit_its_region():
    """LIBERO-10's book (11.5 x 4.2 cm, long side along x) into the caddy's back compartment (5.5 x 12.4 cm):
    turned; a can into the basket, or onto an object (no region), is not."""
    book, compartment = np.array([0.0575, 0.021]), np.array([0.0278, 0.0622])
    assert place_turn(book, compartment) and not place_turn(book[::-1], compartment)
    assert not place_turn(np.array([0.033, 0.035]), np.array([0.08, 0.08])) and not place_turn(book, None)
    # LIBERO-Goal's wine bottle (round: its box 4.34 x 4.42 cm) onto the rack's narrow top region: a
    # turn would cut the overhang by 0.4 mm, and whichever way it went the demonstrations disagreed
    bottle, rack = np.array([0.0217, 0.0221]), np.array([0.1009, 0.0124])
    assert place_turn(bottle, rack) and not place_turn(bottle, rack, CFG.turn_gain)
    assert place_turn(book, compartment, CFG.turn_gain)
    world, expert, phases = ToyWorld(half=tuple(book)), PickPlace(), []
    turned = lambda w: Scene(**{**w.scene().__dict__, "place_half": compartment})  # noqa: E731
    for _ in range(300):
        a = expert.act(turned(world))
        if expert.phase is Phase.LOWER and Phase.LOWER not in phases:
            assert abs(abs(world.yaw) - np.pi / 2) < CFG.yaw_tolerance  # turned before going down
        phases.append(expert.phase)
        world.step(a)
    assert Phase.RETREAT in phases  # placed and let go


def test_grasp_point_floor_and_finger_reach():
    expert = PickPlace()
    flat = _scene([0, 0, 0.2], [0.0, 0.0, 0.009], height=0.018)  # butter: mid-height would scrape the floor
    assert expert.grasp_point(flat)[2] == pytest.approx(CFG.floor_clearance)
    tall = _scene([0, 0, 0.2], [0.0, 0.0, 0.073], height=0.146)  # salad dressing
    assert expert.grasp_point(tall)[2] == pytest.approx(0.146 - CFG.finger_reach)
    # a moka pot: 8.1 cm across, wider than the open fingers take, narrower than a wall grasp needs
    pot = _scene([0, 0, 0.3], [0.0, 0.0, 0.077], height=0.154, half=(0.0405, 0.076))
    assert expert.grasp_point(pot)[2] == pytest.approx(0.154 - CFG.top_depth)  # its lid's knob


def test_choose_yaw_turns_the_hand_away_from_a_neighbour():
    grasp = np.array([0.053, -0.103, 0.012])  # cream cheese, 8.3 x 4.3 cm, flat on the floor
    half = np.array([0.0415, 0.0215])
    assert choose_yaw(grasp, half, np.zeros((0, 4)), CFG)[0] == 0.0
    short = np.array([[0.10, -0.20, 0.04, 0.02]])  # a neighbour lower than the hand's body: ignored
    assert choose_yaw(grasp, half, short, CFG)[0] == 0.0
    tomato = np.array([[0.10, -0.20, 0.03, 0.081]])  # a can where the hand's end would be
    assert hand_clearance(0.0, grasp, tomato, CFG) < 0
    yaw, gap = choose_yaw(grasp, half, tomato, CFG)
    assert yaw < 0 and gap == hand_clearance(yaw, grasp, tomato, CFG) >= CFG.clearance  # turned away from the can
    step = CFG.max_yaw / CFG.yaw_steps
    assert hand_clearance(yaw + step, grasp, tomato, CFG) < CFG.clearance  # the smallest turn that clears
    span = 2 * (half[0] * abs(np.sin(yaw)) + half[1] * abs(np.cos(yaw)))
    assert span <= CFG.opening  # the turned fingers still take the box
    wide = np.array([[0.10, -0.20, 0.06, 0.081]])  # no turn the box allows clears it: the most clearance
    best, best_gap = choose_yaw(grasp, half, wide, CFG)
    assert hand_clearance(best, grasp, wide, CFG) > hand_clearance(0.0, grasp, wide, CFG)
    assert best_gap == hand_clearance(best, grasp, wide, CFG) < CFG.clearance


def test_choose_yaw_keeps_the_open_fingers_off_a_neighbour_as_tall_as_the_object():
    """LIBERO-10's soup can beside the tomato sauce (2 mm apart, both 8.4 cm tall): the hand's body clears
    the sauce, but at yaw 0 a finger lands on it; the fingers turned along the gap clear it."""
    grasp = np.array([0.071, -0.118, 0.487])
    half = np.array([0.033, 0.035])
    sauce = np.array([[0.0985, -0.19, 0.049, 0.517]])
    assert sauce[0, 3] <= grasp[2] + CFG.hand_bottom  # too low for the hand's body
    assert hand_clearance(0.0, grasp, sauce, CFG) < 0
    yaw, gap = choose_yaw(grasp, half, sauce, CFG)
    assert abs(yaw) > 1.0 and gap >= CFG.clearance
    low = sauce.copy()
    low[0, 3] = grasp[2]  # no higher than the grasp point: under the fingers, ignored
    assert hand_clearance(0.0, grasp, low, CFG) == np.inf


def test_choose_grasp_slides_along_a_long_box_when_the_centre_is_blocked():
    half = np.array([0.0415, 0.0215])  # cream cheese, long side along x
    centre = np.array([0.0, 0.0, 0.012])
    cartons = np.array([[-0.03, 0.12, 0.015, 0.15], [-0.03, -0.12, 0.015, 0.15]])  # beyond both ends of the hand
    yaws = [y for y in np.arange(-CFG.yaw_steps, CFG.yaw_steps + 1) * CFG.max_yaw / CFG.yaw_steps
            if 2 * (half[0] * abs(np.sin(y)) + half[1] * abs(np.cos(y))) <= CFG.opening]
    assert max(hand_clearance(y, centre, cartons, CFG) for y in yaws) < CFG.clearance  # no turn clears at the centre
    grasp, yaw = choose_grasp(centre, half, cartons, CFG)
    assert hand_clearance(yaw, grasp, cartons, CFG) >= CFG.clearance
    assert grasp[0] > 0 and abs(grasp[0]) <= half[0] - CFG.pad_margin + 1e-9  # away from them, pads on the box
    assert grasp[1] == 0.0 and grasp[2] == centre[2]
    assert np.array_equal(choose_grasp(centre, half, np.zeros((0, 4)), CFG)[0], centre)  # unblocked: the centre
    can = np.array([0.033, 0.033])  # round: an off-centre grasp would close on a chord, so never
    assert np.array_equal(choose_grasp(centre, can, cartons, CFG)[0], centre)


def test_approach_comes_in_above_tall_neighbours():
    grasp = np.array([0.0, 0.0, 0.012])
    alone = _scene([0, 0, 0.3], [0.0, 0.0, 0.009], height=0.018)
    assert approach_height(alone, grasp, CFG) == pytest.approx(0.018 + CFG.hover)
    carton = _scene([0, 0, 0.3], [0.0, 0.0, 0.009], height=0.018, obstacles=np.array([[0.08, 0.0, 0.03, 0.145]]))
    assert approach_height(carton, grasp, CFG) == pytest.approx(0.145 - CFG.hand_bottom + CFG.clearance)
    far = _scene([0, 0, 0.3], [0.0, 0.0, 0.009], height=0.018, obstacles=np.array([[0.30, 0.0, 0.03, 0.145]]))
    assert approach_height(far, grasp, CFG) == pytest.approx(0.018 + CFG.hover)


def test_expert_turns_to_the_chosen_yaw_before_descending():
    tomato = np.array([[0.10, -0.20, 0.045, 0.081]])
    world = ToyWorld(obj=(0.053, -0.103, 0.009), height=0.018, half=(0.0415, 0.0215), obstacles=tomato)
    expert = PickPlace()
    while expert.phase is not Phase.DESCEND:
        world.step(expert.act(world.scene()))
    assert expert._yaw != 0.0 and abs(world.yaw - expert._yaw) < CFG.yaw_tolerance


def test_dart_noise_only_on_executed_xyz():
    label = np.array([0.5, -1.0, 1.0, 0.0, 0.0, 0.2, 1.0], dtype=np.float32)
    executed = dart_action(label, 0.3, np.random.default_rng(0))
    assert np.all(executed[:3] != label[:3]) and np.array_equal(executed[3:], label[3:])
    assert label.tolist() == pytest.approx([0.5, -1.0, 1.0, 0.0, 0.0, 0.2, 1.0])  # the label is untouched
    assert np.array_equal(dart_action(label, 0.0, np.random.default_rng(0)), label)


def test_every_libero_suite_has_experts():
    for suite in ("libero_spatial", "libero_object", "libero_goal", "libero_10"):
        check_expert_suite(suite)
    with pytest.raises(UsageError, match="no scripted experts for libero_90"):
        check_expert_suite("libero_90")


# --- the simulator ---------------------------------------------------------------------------------

TASK = LIBERO_TASK  # the session's simulator (conftest.libero_env)


def _object_xy(env, state: np.ndarray) -> np.ndarray:
    """The xy of every object (free joints) in a simulator state."""
    sim = env.simulator.sim
    env.simulator.sim.set_state_from_flattened(state)
    sim.forward()
    return np.array([sim.data.body_xpos[sim.model.body_name2id(o.root_body)][:2]
                     for o in env.simulator.objects_dict.values()])


def test_object_boxes_are_their_meshes_not_the_meshes_local_boxes(libero_env):
    """The soup can's mesh sits rotated in its geom frame, so its local box, rotated into the world, is
    8.4 x 8.9 cm; the can is 6.6 cm across. The box is taken from the vertices."""
    from heisd.benchmarks.libero_experts import SimReader, geom_boxes

    reader = SimReader(libero_env.simulator)
    lo, hi = reader.box("alphabet_soup_1")
    assert np.all(hi[:2] - lo[:2] < 0.072) and 0.08 < hi[2] - lo[2] < 0.09
    sim = libero_env.simulator.sim
    for name, g in reader.geoms.items():  # every box inside the loose one (the local boxes, rotated)
        centre, half = geom_boxes(sim, g)
        lo, hi = reader.box(name)
        assert np.all((centre - half).min(0) <= lo + 1e-9) and np.all(hi <= (centre + half).max(0) + 1e-9)


def test_object_box_follows_a_turned_object_exactly(libero_env):
    """The box comes from hull points kept in the body frame; turned and moved, it stays the box of every
    mesh vertex placed by the geoms' own world frames."""
    from heisd.benchmarks.libero_experts import CUBE, MESH_GEOM, SimReader

    sim = libero_env.simulator.sim
    reader = SimReader(libero_env.simulator)
    name, saved = "alphabet_soup_1", sim.get_state().flatten()
    qpos = sim.model.jnt_qposadr[sim.model.body_jntadr[sim.model.geom_bodyid[reader.geoms[name][0]]]]
    sim.data.qpos[qpos:qpos + 7] = [0.1, 0.2, 0.95, np.cos(0.6), np.sin(0.6) * 0.6, 0.0, np.sin(0.6) * 0.8]
    sim.forward()
    model, points = sim.model, []
    for g in reader.geoms[name]:
        mesh = model.geom_dataid[g]
        vert = model.mesh_vert[model.mesh_vertadr[mesh]:model.mesh_vertadr[mesh] + model.mesh_vertnum[mesh]] \
            if model.geom_type[g] == MESH_GEOM else model.geom_aabb[g, :3] + model.geom_aabb[g, 3:] * CUBE
        points.append(sim.data.geom_xpos[g] + vert @ sim.data.geom_xmat[g].reshape(3, 3).T)
    points = np.concatenate(points)
    lo, hi = reader.box(name)
    sim.set_state_from_flattened(saved)  # the simulator is the session's
    sim.forward()
    np.testing.assert_allclose(lo, points.min(0), atol=1e-9)
    np.testing.assert_allclose(hi, points.max(0), atol=1e-9)
    assert len(reader._hull[name]) < len(points)  # the hull, not every vertex


def test_demo_layouts_are_disjoint_from_eval_init_states(libero_env):
    """Demos reset from a seed (LIBERO's placement samplers); evaluation from init states 0..N-1."""
    from heisd.benchmarks.registry import reset_options
    from heisd.runtime.recording import episode_seed

    env = libero_env
    eval_xy = [_object_xy(env, env._init_states[reset_options("libero_object", 0, i)["init_state"]])
               for i in range(env.n_init_states)]
    layouts = []
    for episode in range(3):
        env.reset(options={"layout_seed": episode_seed(0, TASK, episode)})
        layouts.append(env.layout.copy())
        xy = _object_xy(env, env.layout)
        gaps = [np.abs(xy - e).max() for e in eval_xy]
        assert min(gaps) > 1e-3  # some object at least 1 mm away from where any init state puts it
    assert not np.array_equal(layouts[0], layouts[1])  # another seed, another layout
    env.reset(options={"layout_seed": episode_seed(0, TASK, 0)})
    assert np.array_equal(env.layout, layouts[0])  # a seed fixes the layout
    obs_a, _ = env.reset(options={"layout": layouts[1]})
    obs_b, _ = env.reset(options={"layout_seed": episode_seed(0, TASK, 1)})
    assert np.array_equal(obs_a["image"], obs_b["image"])  # a recorded layout restores the scene
    with pytest.raises(UsageError, match="layout is a simulator state"):
        env.reset(options={"layout": layouts[0][:5]})


def test_recorded_episode_round_trips_through_the_reader(libero_env, tmp_path):
    """One noisy expert episode written in LIBERO's layout and read back by heisd's reader: task,
    instruction, upright frames of the recorded layout, clean labels."""
    from heisd.benchmarks.libero import LiberoConfig, LiberoEnv
    from heisd.benchmarks.libero_experts import expert_actor
    from heisd.data.dataset import DemoFile
    from heisd.runtime.demos import generate_demos
    from heisd.runtime.recording import DemoConfig

    size = libero_env.config.image_size // 2  # its own simulator: the recorder closes it when done
    cfg = DemoConfig((TASK,), 1, seed=3, noise=0.5, image_size=size, benchmark="libero_object")
    r = generate_demos(cfg, tmp_path / "demos", progress=False)
    path = tmp_path / "demos" / f"{TASK}_demo.hdf5"
    assert r["kept"] == 1 and r["files"] == [str(path)]
    with DemoFile(path) as f:
        assert f.benchmark == "libero_object" and len(f) == 1
        ep = next(iter(f))
        layout = f._data["demo_0"].attrs["layout"]
        states = f._data["demo_0"]["states"][()]
    assert ep.task == TASK and ep.instruction == libero_env.instruction
    assert ep.images.shape == (len(ep), size, size, 3) and ep.state.shape == (len(ep), 5) and len(ep) < 280
    assert states.shape == (len(ep), len(layout))
    env = LiberoEnv("libero_object", TASK, LiberoConfig(image_size=size, fast_render=True))
    xy = _object_xy(env, layout)
    assert min(np.abs(xy - _object_xy(env, init)).max() for init in env._init_states) > 1e-3  # a fresh layout
    obs, info = env.reset(options={"layout": layout})
    assert np.array_equal(ep.images[0], obs["image"])  # stored upside down, read upright
    assert np.allclose(ep.ee_pos[0], info["ee_pos"])
    # labels are the expert's, without the executed noise: the first one is what the expert does in
    # the recorded start scene, and with noise 0.5 a noisy label would leave [-1, 1] on saturated moves
    assert np.allclose(ep.actions[0], expert_actor(env)(info), atol=1e-6)
    assert np.all(np.abs(ep.actions) <= 1.0) and set(ep.actions[:, -1].tolist()) == {-1.0, 1.0}


@pytest.mark.slow
def test_dart_noise_moves_the_hand_off_the_clean_path(libero_env):
    from heisd.runtime.recording import DemoConfig, record_episode

    clean = record_episode(TASK, 0, DemoConfig((TASK,), 1, noise=0.0, image_size=32, benchmark="libero_object"))
    noisy = record_episode(TASK, 0, DemoConfig((TASK,), 1, noise=0.3, image_size=32, benchmark="libero_object"))
    assert np.array_equal(clean["layout"], noisy["layout"])  # the same start
    assert np.allclose(clean["actions"][0], noisy["actions"][0])  # the same first label
    n = min(len(clean["ee_pos"]), len(noisy["ee_pos"]))
    assert np.abs(clean["ee_pos"][1:n] - noisy["ee_pos"][1:n]).max() > 0.01  # executed actions differed
    assert clean["success"] and noisy["success"]


def test_objects_sharing_a_region_sit_side_by_side_across_their_long_side(libero_env):
    """Two slots on one region are spaced along the region's axis the object is narrower along (both moka
    pots on the stove: 15 cm long each, side by side along their 8 cm width)."""
    from heisd.benchmarks.libero_experts import SLOT_SPACING, SimReader, place_point

    reader = SimReader(libero_env.simulator)
    region = next(n for n in libero_env.simulator.object_sites_dict if n.endswith("contain_region"))
    axes = libero_env.simulator.sim.data.get_site_xmat(region)[:2, :2]
    size = np.asarray(libero_env.simulator.object_sites_dict[region].size, dtype=np.float64)
    names = list(reader.geoms)
    extents = {n: np.abs(axes.T) @ (reader.box(n)[1] - reader.box(n)[0])[:2] for n in names}  # along each axis
    long = max(names, key=lambda n: abs(extents[n][0] - extents[n][1]))  # the most elongated object
    narrow = int(np.argmin(extents[long]))
    a, b = (place_point(reader, long, region, "in", slot, 2) for slot in (0, 1))
    np.testing.assert_allclose(b[:2] - a[:2], axes[:, narrow] * SLOT_SPACING * size[narrow], atol=1e-9)


def test_a_pick_and_place_whose_object_lies_at_its_goal_is_done(libero_env):
    """DAgger: the target let the cream cheese go over the basket. The labelling expert, waiting to grasp it,
    goes on to the next step (here none: hold still, open) instead of "pick it up again"; out of the basket,
    the expert reaches for it."""
    from heisd.benchmarks.libero_experts import SimReader, TaskExpert

    env = libero_env
    _, info = env.reset(options={"init_state": 0})
    sim, reader, eef = env.simulator.sim, SimReader(env.simulator), info["ee_pos"]
    assert np.any(TaskExpert(env.simulator).act(eef)[:3] != 0)  # out of the basket: it reaches for it
    saved = sim.get_state().flatten()
    try:
        lo, hi = reader.box("basket_1")
        body = sim.model.body_name2id(env.simulator.objects_dict["cream_cheese_1"].root_body)
        q = sim.model.jnt_qposadr[sim.model.body_jntadr[body]]
        sim.data.qpos[q:q + 3] = [(lo[0] + hi[0]) / 2, (lo[1] + hi[1]) / 2, lo[2] + 0.05]
        sim.forward()
        assert reader.holds("in", "cream_cheese_1", "basket_1_contain_region")
        np.testing.assert_array_equal(TaskExpert(env.simulator).act(eef), [0, 0, 0, 0, 0, 0, -1])
    finally:
        sim.set_state_from_flattened(saved)
        sim.forward()
