"""One task's scripted expert per LIBERO suite, rolled out to success on a fresh layout (slow: each
builds its own simulator), and the fresh layouts of objects that start on a fixture."""

from __future__ import annotations

import numpy as np
import pytest

pytestmark = pytest.mark.slow

CASES = [  # (suite, task, episode): one place goal, one knob goal, a two-object sequence, and the layouts
    # where the push ran the plate into the bowl and the cream cheese, and where the turned hand shoved
    # the bowl in front of the middle drawer (both failed before; docs/notes-goal.md)
    ("libero_spatial", "pick_up_the_black_bowl_between_the_plate_and_the_ramekin_and_place_it_on_the_plate", 0),
    ("libero_goal", "turn_on_the_stove", 0),
    ("libero_10", "LIVING_ROOM_SCENE2_put_both_the_alphabet_soup_and_the_tomato_sauce_in_the_basket", 0),
    ("libero_goal", "push_the_plate_to_the_front_of_the_stove", 2),
    ("libero_goal", "open_the_middle_drawer_of_the_cabinet", 4),
    # the mug into the microwave from the side, then its door pushed shut; in episode 2 the door stands
    # where the hand works and is swung wide first
    ("libero_10", "KITCHEN_SCENE6_put_the_yellow_and_white_mug_in_the_microwave_and_close_it", 0),
    ("libero_10", "KITCHEN_SCENE6_put_the_yellow_and_white_mug_in_the_microwave_and_close_it", 2),
]


@pytest.mark.parametrize(("suite", "task", "episode"), CASES)
def test_expert_reaches_the_goal(suite, task, episode):
    pytest.importorskip("libero", reason="the libero extra is not installed (pip install -e '.[libero]')")
    from heisd.runtime.recording import DemoConfig, record_episode

    cfg = DemoConfig((task,), episode + 1, image_size=32, benchmark=suite, render=False)
    ep = record_episode(task, episode, cfg)
    assert ep["success"], f"{suite}/{task} episode {episode}: the expert failed in {len(ep['actions'])} steps"


def test_fresh_layout_puts_the_bowl_on_the_stove():
    """LIBERO's samplers add a fixture's position to its sites' world positions: LiberoEnv puts the
    fixtures back at the origin first, so the bowl starts on the stove, not off the table."""
    pytest.importorskip("libero", reason="the libero extra is not installed (pip install -e '.[libero]')")
    from heisd.benchmarks.libero import LiberoConfig, LiberoEnv

    env = LiberoEnv("libero_spatial", "pick_up_the_black_bowl_on_the_stove_and_place_it_on_the_plate",
                    LiberoConfig(image_size=32, fast_render=True))
    try:
        r = env.simulator
        for seed in (1, 2):
            env.reset(options={"layout_seed": seed})
            bowl = r.sim.data.body_xpos[r.obj_body_id["akita_black_bowl_1"]]
            cook = r.sim.data.get_site_xpos("flat_stove_1_cook_region")
            assert np.linalg.norm(bowl[:2] - cook[:2]) < 0.05 and bowl[2] > cook[2]
    finally:
        env.close()
