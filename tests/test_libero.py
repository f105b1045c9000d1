"""LIBERO: OpenVLA's protocol pieces, the config written before import, the reader on LIBERO's and
OpenVLA's dataset layouts, and one LIBERO-Object task stepped in the simulator."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import h5py
import numpy as np
import pytest

from heisd.benchmarks.libero_protocol import (
    DUMMY_ACTION,
    MAX_STEPS,
    NUM_STEPS_WAIT,
    center_crop,
    openvla_gripper,
    openvla_image,
    rotate_180,
)
from heisd.benchmarks.registry import BENCHMARKS, default_max_steps, reset_options
from heisd.data.dataset import DemoFile, DemoFormatError
from heisd.errors import InputError, UsageError

pytest.importorskip("libero", reason="the libero extra is not installed (pip install -e '.[libero]')")

OBJECT_TASK = "pick_up_the_alphabet_soup_and_place_it_in_the_basket"  # LIBERO-Object task 0


# --- protocol ---------------------------------------------------------------------------------

def test_suites_and_max_steps_are_openvlas():
    assert MAX_STEPS == {"libero_spatial": 220, "libero_object": 280, "libero_goal": 300, "libero_10": 520}
    assert [default_max_steps(b) for b in BENCHMARKS] == [300, 220, 280, 300, 520]  # eval's --max-steps default
    assert NUM_STEPS_WAIT == 10 and DUMMY_ACTION.tolist() == [0, 0, 0, 0, 0, 0, -1]
    assert BENCHMARKS == ("mw", "libero_spatial", "libero_object", "libero_goal", "libero_10")
    assert reset_options("libero_object", 1234, 7) == {"init_state": 7}
    assert reset_options("mw", 1234, 7) == {"layout_seed": 1234}
    # sampled layouts (closed-loop calibration): LIBERO's samplers, never the init states evaluation uses
    assert reset_options("libero_object", 1234, 7, sampled=True) == {"layout_seed": 1234}


def test_sampled_layouts_are_recorded_only_where_used():
    from heisd.errors import ConfigError
    from heisd.runtime.evaluation import EvalConfig

    run = EvalConfig((OBJECT_TASK,), 2, benchmark="libero_object", protocol="openvla", sampled_layouts=True)
    assert run.settings()["sampled_layouts"] is True
    # a run from before the option existed resumes: its run.json never had the key
    assert "sampled_layouts" not in EvalConfig((OBJECT_TASK,), 2, benchmark="libero_object").settings()
    with pytest.raises(ConfigError, match="sampled layouts are for LIBERO"):
        EvalConfig(("reach-v3",), 2, sampled_layouts=True)


def test_a_libero_run_records_no_mw_camera_and_older_runs_that_did_resume(tmp_path):
    from heisd.errors import OutputError
    from heisd.runtime.evaluation import EvalConfig, EvalRun

    libero = EvalConfig((OBJECT_TASK,), 1, benchmark="libero_object", protocol="openvla")
    assert "camera" not in libero.settings() and "camera" in EvalConfig(("reach-v3",), 1).settings()
    with EvalRun("ar", libero, tmp_path / "new"):
        pass
    assert "camera" not in json.loads((tmp_path / "new" / "run.json").read_text())

    old = tmp_path / "old"  # what heisd wrote before: mw's camera, never rendered on LIBERO
    old.mkdir()
    (old / "run.json").write_text(json.dumps({"method": "ar", **libero.settings(), "camera": "corner3"}))
    with EvalRun("ar", libero, old):
        pass
    mw = EvalConfig(("reach-v3",), 1)  # on mw the camera is the frames: another one is another run
    (old / "run.json").write_text(json.dumps({"method": "ar", **mw.settings(), "camera": "corner3"}))
    with pytest.raises(OutputError, match="camera: corner3 -> corner"):
        EvalRun("ar", mw, old)


def test_rotate_180_flips_rows_and_columns():
    img = np.arange(2 * 3 * 3, dtype=np.uint8).reshape(2, 3, 3)
    out = rotate_180(img)
    assert out[0, 0].tolist() == img[1, 2].tolist() and out[1, 2].tolist() == img[0, 0].tolist()
    assert np.array_equal(rotate_180(out), img)


def test_gripper_maps_openvla_output_to_libero_command():
    a = np.array([[0.1, -0.2, 0.3, 0.01, 0.02, 0.03, 0.9],   # open (OpenVLA 1) -> LIBERO -1
                  [0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.2]])      # close (OpenVLA 0) -> LIBERO +1
    out = openvla_gripper(a)
    assert out[:, -1].tolist() == [-1.0, 1.0]
    assert np.array_equal(out[:, :6], a[:, :6])
    assert a[0, -1] == 0.9  # the input is left alone


def test_center_crop_keeps_the_central_area_on_tfs_grid():
    h = w = 101
    ramp = np.tile(np.arange(w, dtype=np.float64)[None, :, None], (h, 1, 3))  # value = x
    img = np.round(ramp * 2).clip(0, 255).astype(np.uint8)
    out = center_crop(img)
    side = math.sqrt(0.9)
    left = (1 - side) / 2 * (w - 1)  # TF crop_and_resize: first column samples x = x1 * (W - 1)
    assert abs(int(out[50, 0, 0]) - 2 * left) <= 1
    assert abs(int(out[50, -1, 0]) - 2 * (w - 1 - left)) <= 1
    assert out.shape == img.shape and out.dtype == np.uint8


def test_openvla_image_is_224_and_the_crop_changes_it():
    rng = np.random.default_rng(0)
    frame = rng.integers(0, 256, (256, 256, 3), dtype=np.uint8)
    plain, cropped = openvla_image(frame), openvla_image(frame, crop=True)
    assert plain.shape == cropped.shape == (224, 224, 3) and plain.dtype == np.uint8
    assert not np.array_equal(plain, cropped)


# --- config.yaml before import ----------------------------------------------------------------

def test_config_written_before_libero_import(tmp_path):
    """A fresh process with no LIBERO config and stdin closed imports LIBERO through heisd: LIBERO's
    input() prompt would raise EOFError if the config were missing."""
    env = {k: v for k, v in os.environ.items() if k != "LIBERO_CONFIG_PATH"}
    env["HEISD_LIBERO_HOME"] = str(tmp_path / "home")
    code = ("from heisd.benchmarks.libero import libero_modules; _, path, _ = libero_modules(); "
            "import os; print(os.environ['LIBERO_CONFIG_PATH']); print(path('bddl_files'))")
    r = subprocess.run([sys.executable, "-c", code], env=env, stdin=subprocess.DEVNULL,
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    config_dir, bddl = r.stdout.split()[-2:]
    assert config_dir == str(tmp_path / "home")
    assert (tmp_path / "home" / "config.yaml").is_file()
    assert (Path(bddl) / "libero_object" / f"{OBJECT_TASK}.bddl").is_file()


def test_assets_linked_by_another_process_at_the_same_time_are_kept(tmp_path, monkeypatch):
    """Two processes started at once both find no link, and the second's symlink fails: that is
    the same link, kept; anything else in its place is refused."""
    from heisd.benchmarks import libero_setup

    source = libero_setup._package_dir(libero_setup.ASSETS_PACKAGE) / "assets"
    real = Path.symlink_to

    def raced(self, target, target_is_directory=False):  # the other process links first
        real(self, target, target_is_directory)
        real(self, target, target_is_directory)

    monkeypatch.setattr(Path, "symlink_to", raced)
    assert libero_setup.link_assets(tmp_path).resolve() == source.resolve()
    monkeypatch.setattr(Path, "symlink_to", lambda self, *a, **k: (self.mkdir(), real(self, *a, **k)))
    (tmp_path / "other").mkdir()
    with pytest.raises(libero_setup.LiberoUnavailable, match="exists and is not a link to"):
        libero_setup.link_assets(tmp_path / "other")


# --- reader -----------------------------------------------------------------------------------

def _libero_file(path: Path, *, attrs: bool, episodes: int = 2, steps: int = 6, size: int = 8) -> list[np.ndarray]:
    """A file in LIBERO's layout (scripts/create_dataset.py; OpenVLA's no-noop files: attrs=False).
    Returns each episode's frames as stored (upside down)."""
    rng = np.random.default_rng(1)
    stored = []
    with h5py.File(path, "w") as f:
        data = f.create_group("data")
        if attrs:
            data.attrs["problem_info"] = json.dumps({"problem_name": "libero_tabletop_manipulation",
                                                     "domain_name": "robosuite",
                                                     "language_instruction": "pick up the alphabet soup "
                                                                             "and place it in the basket"})
            data.attrs["bddl_file_name"] = f"libero/libero/bddl_files/libero_object/{OBJECT_TASK}.bddl"
            data.attrs["env_args"] = json.dumps({"type": 1, "env_name": "Libero_Tabletop_Manipulation"})
            data.attrs["macros_image_convention"] = "opengl"
            data.attrs["num_demos"] = episodes
        for i in range(episodes):
            g = data.create_group(f"demo_{i}")
            frames = rng.integers(0, 256, (steps, size, size, 3), dtype=np.uint8)
            stored.append(frames)
            ee = rng.normal(size=(steps, 6))
            g.create_dataset("obs/agentview_rgb", data=frames)
            g.create_dataset("obs/eye_in_hand_rgb", data=frames)
            g.create_dataset("obs/ee_states", data=ee)
            g.create_dataset("obs/ee_pos", data=ee[:, :3])
            g.create_dataset("obs/ee_ori", data=ee[:, 3:])
            g.create_dataset("obs/gripper_states", data=rng.normal(size=(steps, 2)))
            g.create_dataset("obs/joint_states", data=rng.normal(size=(steps, 7)))
            g.create_dataset("actions", data=rng.uniform(-1, 1, (steps, 7)))
            g.create_dataset("states", data=rng.normal(size=(steps, 110)))
            g.create_dataset("robot_states", data=rng.normal(size=(steps, 9)))
            g.create_dataset("rewards", data=np.eye(steps, dtype=np.uint8)[-1])
            g.create_dataset("dones", data=np.eye(steps, dtype=np.uint8)[-1])
            if attrs:
                g.attrs["num_samples"] = steps
    return stored


@pytest.mark.parametrize("attrs", [True, False], ids=["libero", "openvla-no-noops"])
def test_reader_reads_libero_layout(tmp_path, attrs):
    path = tmp_path / f"{OBJECT_TASK}_demo.hdf5"
    stored = _libero_file(path, attrs=attrs)
    with DemoFile(path) as f:
        assert f.benchmark == "libero_object" and len(f) == 2
        eps = list(f)
        f.check_benchmark("libero_object")
        f.check_benchmark(None)
    ep = eps[1]
    assert ep.task == OBJECT_TASK
    assert ep.instruction == "pick up the alphabet soup and place it in the basket"
    assert np.array_equal(ep.images, stored[1][:, ::-1, ::-1])  # upright, as the env and OpenVLA see it
    assert ep.actions.shape == (6, 7) and ep.state.shape == (6, 5) and ep.success


def test_reader_refuses_a_file_of_another_suite(tmp_path):
    path = tmp_path / f"{OBJECT_TASK}_demo.hdf5"
    _libero_file(path, attrs=False)
    with DemoFile(path) as f:
        with pytest.raises(DemoFormatError, match="libero_object.*not --benchmark 'libero_goal'"):
            f.check_benchmark("libero_goal")
        with pytest.raises(DemoFormatError, match="not --benchmark 'mw'"):
            f.check_benchmark("mw")


def test_build_datastore_refuses_another_suite_before_encoding(tmp_path):
    from helpers import tiny_vla

    from heisd.retrieval.build import build_datastore

    path = tmp_path / f"{OBJECT_TASK}_demo.hdf5"
    _libero_file(path, attrs=True)
    with pytest.raises(DemoFormatError, match=str(path)):
        build_datastore(tiny_vla(), [path], tmp_path / "ds", benchmark="libero_spatial")
    assert not (tmp_path / "ds").exists()


def test_reader_names_a_libero_file_of_unknown_task(tmp_path):
    path = tmp_path / "some_demo.hdf5"
    _libero_file(path, attrs=False)
    with pytest.raises(InputError, match="some_demo.hdf5.*task is unknown"):
        DemoFile(path)


# --- the simulator (the session's LIBERO-Object task, conftest.libero_env) --------------------------

@pytest.fixture
def env(libero_env):
    return libero_env


def test_gymnasium_check_env(env):
    from gymnasium.utils.env_checker import check_env

    check_env(env, skip_render_check=True)


def test_env_reset_from_init_states(env):
    from dataclasses import replace

    from heisd.benchmarks.libero import LiberoEnv

    assert env.n_init_states == 50 and env.instruction == "pick up the cream cheese and place it in the basket"
    obs0, info0 = env.reset(options={"init_state": 0})
    assert env._env.env.timestep == NUM_STEPS_WAIT  # the wait steps ran inside reset
    assert obs0["image"].shape == (64, 64, 3) and obs0["image"].dtype == np.uint8
    assert obs0["state"].shape == (5,) and obs0["state"].dtype == np.float32
    assert np.array_equal(info0["ee_pos"], obs0["state"][:3]) and env.layout.tolist() == [0]
    obs1, _ = env.reset(options={"init_state": 1})
    other = LiberoEnv("libero_object", env.task, replace(env.config, image_size=32))
    other.reset(options={"init_state": 0})  # another simulator with its own GL context, made current last
    again, _ = env.reset(options={"init_state": 0})
    assert not np.array_equal(obs0["image"], obs1["image"])  # other object placement
    assert np.array_equal(obs0["image"], again["image"])  # an init state fixes the scene
    with pytest.raises(UsageError, match="init state 50 out of range"):
        env.reset(options={"init_state": 50})


def test_an_episode_does_not_depend_on_what_ran_before(env):
    """Resumed and distributed runs (`--ray`) run an episode in another process, after other
    episodes: it must start from the same simulator state, solver warm start included."""
    env.reset(options={"init_state": 1})
    first = env.sim_state(), np.array(env._env.env.sim.data.qacc_warmstart)
    env.reset(options={"init_state": 0})
    for _ in range(5):
        env.step(np.array([0.5, -0.3, 0.2, 0, 0, 0.1, 1.0]), render=False)
    np.random.random(7)  # what else ran in the process moved numpy's global generator
    env.reset(options={"init_state": 1})
    assert np.array_equal(env.sim_state(), first[0])
    assert np.array_equal(env._env.env.sim.data.qacc_warmstart, first[1])


def test_env_step_render_rotation_and_truncation(env):
    from dataclasses import replace

    from heisd.benchmarks.libero import LiberoEnv

    env.reset(options={"init_state": 2})
    up = np.array([0, 0, 1, 0, 0, 0, -1.0])
    obs, _, success, truncated, info = env.step(up, render=False)
    assert obs["image"] is None and not success and not truncated
    z = info["ee_pos"][2]
    obs, _, _, _, info = env.step(up)
    assert info["ee_pos"][2] > z  # OSC_POSE delta: +z moves the hand up
    raw = env._env.env.sim.render(camera_name="agentview", width=64, height=64)
    assert np.array_equal(obs["image"], raw[::-1, ::-1])
    with pytest.raises(InputError, match="not 7 finite numbers"):
        env.step(np.array([0, 0, np.nan, 0, 0, 0, -1.0]))

    short = LiberoEnv("libero_object", env.task, replace(env.config, max_steps=3))  # same simulator
    assert env.max_steps == MAX_STEPS["libero_object"]
    short.reset(options={"init_state": 0})
    flags = [short.step(DUMMY_ACTION, render=False)[3] for _ in range(3)]
    assert flags == [False, False, True]


def test_wrist_camera_renders_beside_agentview(env):
    from dataclasses import replace

    from heisd.benchmarks.libero import LiberoConfig, LiberoEnv
    from heisd.data.views import observed_frame

    both = LiberoEnv("libero_object", env.task, replace(env.config, wrist=True))  # the same simulator
    assert both.observation_space["wrist_image"].shape == (64, 64, 3)
    obs, _ = both.reset(options={"init_state": 0})
    raw = both._env.env.sim.render(camera_name="robot0_eye_in_hand", width=64, height=64)
    assert np.array_equal(obs["wrist_image"], raw[::-1, ::-1])  # upright, as agentview
    assert not np.array_equal(obs["wrist_image"], obs["image"])
    alone, _ = env.reset(options={"init_state": 0})
    assert "wrist_image" not in alone and np.array_equal(alone["image"], obs["image"])  # agentview unchanged
    assert np.array_equal(observed_frame(obs, 2), np.concatenate([obs["image"], obs["wrist_image"]]))
    with pytest.raises(InputError, match="no wrist frame"):
        observed_frame(alone, 2)
    assert both.step(DUMMY_ACTION, render=False)[0]["wrist_image"] is None  # a mid-chunk step renders nothing
    with pytest.raises(UsageError, match="agentview only"):
        LiberoConfig(protocol="openvla", wrist=True)


@pytest.mark.parametrize("case", ["stacked", "missing", "other size"])
def test_reader_reads_the_wrist_camera_for_a_two_camera_target(tmp_path, case):
    path = tmp_path / f"{OBJECT_TASK}_demo.hdf5"
    stored = _libero_file(path, attrs=True)  # LIBERO's own files hold eye_in_hand_rgb (here: agentview's frames)
    if case != "stacked":
        with h5py.File(path, "a") as f:
            del f["data/demo_1/obs/eye_in_hand_rgb"]
            if case == "other size":
                f["data/demo_1/obs/eye_in_hand_rgb"] = np.zeros((6, 5, 5, 3), np.uint8)
    if case == "stacked":
        with DemoFile(path) as f:
            assert f.episode("demo_1").wrist_images is None  # read only for a target that reads it
        with DemoFile(path, views=2) as f:
            ep = f.episode("demo_1")
        upright = stored[1][:, ::-1, ::-1]
        assert np.array_equal(ep.frames(2), np.concatenate([upright, upright], axis=1))
        assert np.array_equal(ep.frames(2, [4])[0], np.concatenate([upright[4], upright[4]]))
        assert np.array_equal(ep.frames(1), upright)
        return
    with DemoFile(path) as f:  # a one-camera target does not need it
        assert len(f) == 2
    problem = "has no wrist frames.*demos --wrist" if case == "missing" else "eye_in_hand_rgb has shape"
    with pytest.raises(DemoFormatError, match=f"{path.name}.*demo_1.*{problem}"):
        DemoFile(path, views=2)


def test_wrist_recording_is_libero_only():
    from heisd.runtime.recording import DemoConfig

    for kwargs in ({"benchmark": "mw"}, {"benchmark": "libero_object", "shadows": True}):
        with pytest.raises(UsageError, match="--wrist"):
            DemoConfig(("t",), 1, wrist=True, **kwargs)
