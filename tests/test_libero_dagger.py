"""DAgger and target rollouts on LIBERO-Object: failed episodes kept and marked in LIBERO's layout,
seeds read back for the clash check, targets that cannot act there refused, expert labels (slow)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from heisd.data.dataset import DemoFile
from heisd.errors import UsageError
from heisd.runtime.recording import DemoConfig

pytest.importorskip("libero", reason="the libero extra is not installed (pip install -e '.[libero]')")

CHECKPOINTS = Path(__file__).resolve().parents[1] / "checkpoints"
TASK = "pick_up_the_cream_cheese_and_place_it_in_the_basket"


def _episode(success: bool, steps: int = 5) -> dict:
    """One recorded episode as `record_episode` returns it on LIBERO (frames upside down, as rendered)."""
    rng = np.random.default_rng(int(success))  # its own generator: no state shared between tests
    return {"task": TASK, "success": success, "layout": rng.normal(size=12),
            "actions": rng.uniform(-1, 1, (steps, 7)).astype(np.float32),
            "images": rng.integers(0, 256, (steps, 8, 8, 3), dtype=np.uint8),
            "ee_pos": rng.normal(size=(steps, 3)), "gripper": rng.normal(size=(steps, 2)),
            "states": rng.normal(size=(steps, 12)),
            "problem_info": {"problem_name": "libero_tabletop_manipulation", "domain_name": "robosuite",
                             "language_instruction": "pick up the cream cheese and place it in the basket"},
            "bddl_file": f"libero/libero/bddl_files/libero_object/{TASK}.bddl"}


def _record(tmp_path: Path, cfg: DemoConfig, successes: list[bool], monkeypatch) -> Path:
    """The real LIBERO writer over episodes made up here (the simulator's part is tested elsewhere)."""
    from heisd.runtime import libero_demos

    monkeypatch.setattr(libero_demos, "episode_work", lambda state, job: _episode(successes[job[1]]))
    libero_demos.generate_libero_demos(cfg, tmp_path, progress=False)
    return tmp_path / f"{TASK}_demo.hdf5"


def test_dagger_rollouts_keep_failed_episodes_marked_in_libero_layout(tmp_path, monkeypatch):
    from heisd.runtime.dagger import demo_seeds
    from heisd.targets.vla.frames import read_episodes

    cfg = DemoConfig((TASK,), 2, seed=7, policy=str(CHECKPOINTS / "libero_object" / "vla"), expert_labels=True,
                     benchmark="libero_object")  # LIBERO takes the target's rollouts now
    path = _record(tmp_path, cfg, [False, True], monkeypatch)
    with DemoFile(path) as f:
        assert f.attrs["source"] == "dagger" and [ep.success for ep in f] == [False, True]
        dones = [f._data[f"demo_{i}"]["dones"][()] for i in range(2)]
    assert dones[0].sum() == 0 and dones[1].tolist() == [0, 0, 0, 0, 1]  # LIBERO's done only at a success
    records, dropped, _ = read_episodes([path], 8, "libero_object")
    assert len(records) == 2 and dropped == 0  # DAgger's failed episode is training data
    assert demo_seeds((str(path),)) == {7}  # the round-seed clash check sees LIBERO files' seeds


def test_an_expert_files_failed_episodes_stay_out(tmp_path, monkeypatch):
    path = _record(tmp_path, DemoConfig((TASK,), 2, benchmark="libero_object"), [True, False], monkeypatch)
    with DemoFile(path) as f:
        assert f.attrs["source"] == "expert" and [ep.success for ep in f] == [True]


def test_dagger_round_files_on_libero(tmp_path):
    from heisd.runtime.dagger import DaggerConfig, rollout_files

    tasks = (TASK, "pick_up_the_milk_and_place_it_in_the_basket")
    libero = DaggerConfig(init="x", demos=(), tasks=tasks, benchmark="libero_object")
    assert rollout_files(libero, tmp_path) == [tmp_path / "rollouts" / f"{t}_demo.hdf5" for t in tasks]
    mw = DaggerConfig(init="x", demos=(), tasks=("reach-v3",))
    assert rollout_files(mw, tmp_path) == [tmp_path / "rollouts.hdf5"]
    with pytest.raises(UsageError, match="no scripted experts for libero_90"):
        DaggerConfig(init="x", demos=(), tasks=tasks, benchmark="libero_90")


def test_a_target_that_cannot_act_in_libero_is_refused():
    from heisd.runtime.recording import _target_policy

    with pytest.raises(UsageError, match="4-D actions .* cannot be recorded in libero_object"):
        _target_policy(str(CHECKPOINTS / "vla"), "libero_object")  # the mw target


@pytest.mark.slow
def test_libero_dagger_labels_are_the_experts_on_the_targets_path():
    """The shipped target acts (it never does cream cheese: the episode runs to the protocol's limit);
    every recorded action is the expert's: its first one in the reset scene, open/close grips."""
    from heisd.benchmarks.libero import LiberoConfig, LiberoEnv
    from heisd.benchmarks.libero_experts import expert_actor
    from heisd.benchmarks.libero_protocol import MAX_STEPS
    from heisd.runtime.recording import episode_seed, record_episode

    cfg = DemoConfig((TASK,), 1, seed=5, image_size=32, policy=str(CHECKPOINTS / "libero_object" / "vla"),
                     expert_labels=True, benchmark="libero_object")
    ep = record_episode(TASK, 0, cfg)
    assert not ep["success"] and len(ep["actions"]) == MAX_STEPS["libero_object"]
    env = LiberoEnv("libero_object", TASK, LiberoConfig(image_size=32, fast_render=True))
    _, info = env.reset(options={"layout_seed": episode_seed(5, TASK, 0)})
    np.testing.assert_allclose(ep["actions"][0], expert_actor(env)(info), atol=1e-6)
    assert set(ep["actions"][:, -1].tolist()) <= {-1.0, 1.0}  # the expert's grips, not the target's
    env.close()
