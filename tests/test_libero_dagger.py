"""DAgger and target rollouts on LIBERO-Object: failed episodes kept and marked in LIBERO's layout,
seeds read back for the clash check, targets that cannot act there refused, expert labels (slow)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from heisd.data.dataset import DemoFile
from heisd.errors import OutputError, UsageError
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


def _record(tmp_path: Path, cfg: DemoConfig, successes: list[bool], monkeypatch, edit=lambda ep: ep) -> Path:
    """The real LIBERO writer over episodes made up here (the simulator's part is tested elsewhere)."""
    from heisd.runtime import episode_store, libero_demos

    monkeypatch.setattr(episode_store, "episode_work", lambda state, job: edit(_episode(successes[job[1]])))
    libero_demos.generate_libero_demos(cfg, tmp_path / "demos", progress=False)
    assert not (tmp_path / "demos.partial").exists()  # the finished episodes go once the files are written
    return tmp_path / "demos" / f"{TASK}_demo.hdf5"


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


def test_libero_recordings_record_the_protocols_step_limit(tmp_path):
    """A LIBERO recording or DAgger run says the limit its episodes ran (the protocol's); another is
    refused; runs saved before it was recorded (they say mw's 300) still resume."""
    from heisd.runtime.dagger import DaggerConfig, _jsonable, run_dagger
    from heisd.runtime.episode_store import PER_EPISODE, SETTINGS_FILE, EpisodeStore, partial_path
    from heisd.targets.vla.checkpoint import CheckpointError

    assert DemoConfig((TASK,), 1, benchmark="libero_object").max_steps == 280
    assert DemoConfig(("reach-v3",), 1).max_steps == 300 and DemoConfig(("reach-v3",), 1, max_steps=7).max_steps == 7
    assert DaggerConfig(init="x", demos=(), tasks=(TASK,), benchmark="libero_object").max_steps == 280
    with pytest.raises(UsageError, match="libero_object records episodes of its protocol's 280 steps"):
        DemoConfig((TASK,), 1, benchmark="libero_object", max_steps=300)
    with pytest.raises(UsageError, match="--max-steps 50 is for mw"):
        DaggerConfig(init="x", demos=(), tasks=(TASK,), benchmark="libero_object", max_steps=50)

    cfg = DemoConfig((TASK,), 1, benchmark="libero_object")
    old = partial_path(tmp_path / "demos")
    old.mkdir()
    (old / "kept.pkl.z").write_bytes(b"")
    saved = {k: v for k, v in json.loads(json.dumps(cfg.__dict__)).items() if k not in PER_EPISODE}
    (old / SETTINGS_FILE).write_text(json.dumps({**saved, "max_steps": 300}))
    EpisodeStore(tmp_path / "demos", cfg)  # the same recording: resumed, nothing thrown away
    assert (old / "kept.pkl.z").exists()
    (old / SETTINGS_FILE).write_text(json.dumps({**saved, "max_steps": 300, "noise": 0.5}))
    with pytest.raises(OutputError, match=r"other settings \(noise\)"):
        EpisodeStore(tmp_path / "demos", cfg)

    run = tmp_path / "dagger"
    run.mkdir()
    dagger = DaggerConfig(init=str(tmp_path / "missing"), demos=(), tasks=(TASK,), benchmark="libero_object")
    (run / "dagger.json").write_text(json.dumps({**_jsonable(dagger), "max_steps": 300}))
    with pytest.raises(CheckpointError, match="missing: no such checkpoint directory"):  # as far as --init: the settings matched
        run_dagger(dagger, run, progress=False)


def test_a_target_that_cannot_act_in_libero_is_refused():
    from heisd.runtime.recording import _target_policy

    with pytest.raises(UsageError, match="4-D actions .* cannot be recorded in libero_object"):
        _target_policy(str(CHECKPOINTS / "vla"), "libero_object", 32, False)  # the mw target


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


def test_an_openvla_target_is_recorded_only_at_the_protocols_frames(tiny_openvla):
    from heisd.runtime.recording import check_recordable

    check_recordable(tiny_openvla, "ovla", "libero_spatial", "--policy", (256, True))
    with pytest.raises(UsageError, match="256 px frames with shadows; record with --image-size 256 --shadows"):
        check_recordable(tiny_openvla, "ovla", "libero_spatial", "--policy", (128, True))
    with pytest.raises(UsageError, match="256 px frames with shadows"):
        check_recordable(tiny_openvla, "ovla", "libero_spatial", "--policy", (256, False))
    with pytest.raises(UsageError, match="'openvla' protocol cannot be recorded .* protocols recorded here: raw"):
        check_recordable(tiny_openvla, "ovla", "libero_spatial", "--init")  # no frames named: heisd's targets only
    with pytest.raises(UsageError, match="7-D actions .* cannot be recorded in mw"):
        check_recordable(tiny_openvla, "ovla", "mw", "--policy", (256, True))


def test_an_openvla_target_reads_the_protocols_frame_and_its_gripper_reaches_the_simulator_as_libero_s():
    from heisd.benchmarks.libero_protocol import openvla_image
    from heisd.runtime.recording import _protocol_io

    frame = np.random.default_rng(0).integers(0, 256, (256, 256, 3), dtype=np.uint8)
    seen, executed = _protocol_io("openvla")
    np.testing.assert_array_equal(seen(frame), openvla_image(frame, crop=True))  # eval's default center crop
    assert seen(frame).shape == (224, 224, 3)
    motion = [0.1, -0.2, 0.3, 0.0, 0.01, -0.01]
    open_, close = executed(np.array([*motion, 0.9])), executed(np.array([*motion, 0.1]))  # OpenVLA: 1 = open
    assert open_.dtype == np.float32 and open_.tolist()[-1] == -1.0 and close.tolist()[-1] == 1.0  # LIBERO: -1 open
    np.testing.assert_allclose(open_[:6], motion, atol=1e-7)
    seen, executed = _protocol_io("raw")
    assert seen(frame) is frame and executed(open_) is open_


@pytest.mark.slow
def test_an_openvla_target_acts_under_the_protocol_while_the_expert_labels(tiny_openvla_dir, monkeypatch):
    """`demos --policy DIR --expert-labels` on an OpenVLA checkpoint: the file keeps the 256 px frames and
    the expert's actions; the target read each frame as OpenVLA's eval shows it."""
    from heisd.benchmarks.libero import suite_tasks
    from heisd.benchmarks.libero_protocol import openvla_image
    from heisd.runtime.policy import VLAPolicy
    from heisd.runtime.recording import record_episode

    seen = []
    act = VLAPolicy.act

    def spy(self, image, state, *rest):
        seen.append(image)
        return act(self, image, state, *rest)

    monkeypatch.setattr(VLAPolicy, "act", spy)
    task = suite_tasks("libero_spatial")[0]
    cfg = DemoConfig((task,), 1, seed=3, image_size=256, shadows=True, policy=str(tiny_openvla_dir),
                     expert_labels=True, benchmark="libero_spatial")
    ep = record_episode(task, 0, cfg)
    assert ep["images"].shape[1:] == (256, 256, 3) and len(seen) == len(ep["images"])
    for i in (0, len(seen) - 1):
        np.testing.assert_array_equal(seen[i], openvla_image(ep["images"][i], crop=True))
    assert set(ep["actions"][:, -1].tolist()) <= {-1.0, 1.0}


def test_dagger_refuses_an_openvla_init_where_it_cannot_act(tiny_openvla_dir, tmp_path):
    from heisd.runtime.dagger import DaggerConfig, run_dagger

    cfg = DaggerConfig(init=str(tiny_openvla_dir), demos=(), tasks=("reach-v3",), steps=2, batch_size=4)
    with pytest.raises(UsageError, match="an OpenVLA checkpoint acts in LIBERO suites .* not in mw"):
        run_dagger(cfg, tmp_path / "run", progress=False)
    assert not (tmp_path / "run").exists()


@pytest.mark.slow
def test_a_dagger_round_on_an_openvla_checkpoint(tiny_openvla_dir, tmp_path):
    """`heisd dagger --init OPENVLA_DIR`: rollouts at the protocol's 256 px frames, expert-labelled, then the
    OpenVLA trainer fine-tunes the actor into a checkpoint in OpenVLA's layout that loads again."""
    from heisd.benchmarks.libero import suite_tasks
    from heisd.runtime.dagger import LOG_FILE, DaggerConfig, run_dagger
    from heisd.targets.load import OPENVLA, checkpoint_kind, load_target

    task = suite_tasks("libero_spatial")[0]
    cfg = DaggerConfig(init=str(tiny_openvla_dir), demos=(), tasks=(task,), rounds=1, episodes=2, seed=20, steps=2,
                       batch_size=4, threads=1, benchmark="libero_spatial")
    final = run_dagger(cfg, tmp_path / "run", progress=False)
    with DemoFile(tmp_path / "run" / "round_1" / "rollouts" / f"{task}_demo.hdf5") as f:
        assert f.attrs["source"] == "dagger" and len(f) == 2
        assert next(iter(f)).images.shape[1:] == (256, 256, 3)
    assert checkpoint_kind(final) == OPENVLA
    log = json.loads((tmp_path / "run" / LOG_FILE).read_text().splitlines()[0])
    assert log["train_metrics"] and log["rollout_seed"] == 20
    assert load_target(final, unnorm_key="libero_spatial").spec.protocol == "openvla"


def test_demos_refuse_an_openvla_policy_outside_libero(tiny_openvla_dir):
    from heisd.runtime.recording import _target_policy

    with pytest.raises(UsageError, match="--policy .*: an OpenVLA checkpoint acts in LIBERO suites .* not in mw"):
        _target_policy(str(tiny_openvla_dir), "mw", 256, True)  # before its statistics are picked


def test_the_wrist_camera_is_written_in_libero_layout_and_read_back(tmp_path, monkeypatch):
    def with_wrist(ep: dict) -> dict:
        return {**ep, "wrist_images": 255 - ep["images"]}

    cfg = DemoConfig((TASK,), 1, benchmark="libero_object", wrist=True)
    path = _record(tmp_path, cfg, [True], monkeypatch, with_wrist)
    with DemoFile(path, views=2) as f:
        assert f.attrs["env_args"]["env_kwargs"]["camera_names"] == ["agentview", "robot0_eye_in_hand"]
        ep = f.episode("demo_0")
    recorded = _episode(True)["images"]  # stored flipped as LIBERO stores frames, read back as recorded: both cameras
    assert np.array_equal(ep.wrist_images, 255 - recorded)
    assert np.array_equal(ep.frames(2), np.concatenate([recorded, 255 - recorded], axis=1))
