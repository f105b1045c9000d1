"""Inputs are checked where they enter: demonstration data, checkpoint configs, a policy's actions
before the simulator, MuJoCo's log, evaluation settings."""

from __future__ import annotations

import json
from pathlib import Path

import h5py
import numpy as np
import pytest
from helpers import tiny_vla, write_demo_file

from heisd.data.dataset import DemoFile, DemoFormatError
from heisd.errors import ConfigError, InputError
from heisd.retrieval import Datastore, build_datastore
from heisd.runtime.evaluation import EvalConfig, evaluate, run_episode
from heisd.runtime.methods import MethodConfig, build_decoders
from heisd.runtime.policy import VLAPolicy
from heisd.targets.vla import VLA, NormStats, VLAConfig
from heisd.targets.vla.checkpoint import CheckpointError
from heisd.targets.vla.frames import read_episodes


def demos_with(path: Path, edit) -> Path:
    """Two reach episodes; `edit(h5 data group)` breaks one of them."""
    write_demo_file(path, ["reach-v3"], episodes=2, steps=20)
    with h5py.File(path, "a") as f:
        edit(f["data"])
    return path


def set_value(key: str, step: int, value: float):
    def edit(data) -> None:
        array = data["demo_1"][key][()]
        array[step, 0] = value
        data["demo_1"][key][...] = array
    return edit


@pytest.mark.parametrize("key, value", [("actions", np.nan), ("obs/ee_pos", np.inf), ("obs/gripper_states", -np.inf),
                                        ("obs/goal_pos", np.nan)])
def test_non_finite_demo_values_are_refused_or_skipped(tmp_path, key, value) -> None:
    path = demos_with(tmp_path / "bad.hdf5", set_value(key, 3, value))
    with pytest.raises(DemoFormatError, match=rf"bad.hdf5: data/demo_1 has non-finite {key} \(first at step 3"):
        DemoFile(path)
    with DemoFile(path, skip_invalid=True) as f:
        assert f.episode_names() == ["demo_0"] and list(f.skipped) == ["demo_1"]
    records, failed, invalid = read_episodes([path], 16, skip_invalid=True)
    assert len(records) == 1 and (failed, invalid) == (0, 1)


def test_zero_length_and_float_images_are_named(tmp_path) -> None:
    def empty(data) -> None:
        g = data.create_group("demo_2")
        g.attrs.update(task="reach-v3", instruction="reach", success=True)
        for key, shape, dtype in (("actions", (0, 4), np.float32), ("obs/agentview_rgb", (0, 16, 16, 3), np.uint8),
                                  ("obs/ee_pos", (0, 3), np.float32), ("obs/gripper_states", (0, 1), np.float32)):
            g.create_dataset(key, shape=shape, dtype=dtype)

    with pytest.raises(DemoFormatError, match="data/demo_2 has 0 steps"):
        DemoFile(demos_with(tmp_path / "empty.hdf5", empty))

    def floats(data) -> None:
        images = data["demo_0"]["obs/agentview_rgb"][()].astype(np.float32) / 255.0
        del data["demo_0"]["obs/agentview_rgb"]
        data["demo_0"]["obs/agentview_rgb"] = images

    with pytest.raises(DemoFormatError, match="data/demo_0/obs/agentview_rgb is float32; heisd reads uint8 RGB"):
        DemoFile(demos_with(tmp_path / "float.hdf5", floats), skip_invalid=True)  # a layout error: never skipped

    def gray(data) -> None:
        del data["demo_0"]["obs/agentview_rgb"]
        data["demo_0"]["obs/agentview_rgb"] = np.zeros((20, 16, 16, 1), np.uint8)

    with pytest.raises(DemoFormatError, match=r"has shape \(20, 16, 16, 1\), not \(T, H, W, 3\)"):
        DemoFile(demos_with(tmp_path / "gray.hdf5", gray))


def test_build_datastore_skips_invalid_episodes_only_when_asked(tmp_path) -> None:
    path = demos_with(tmp_path / "bad.hdf5", set_value("actions", 0, np.nan))
    vla = tiny_vla()
    with pytest.raises(DemoFormatError, match="data/demo_1 has non-finite actions"):
        build_datastore(vla, [path], tmp_path / "store")
    assert not (tmp_path / "store").exists()
    summary = build_datastore(vla, [path], tmp_path / "store", skip_invalid=True)
    assert summary["dropped_invalid"] == 1 and summary["episodes"] == 1
    assert len(Datastore.load(tmp_path / "store")) == 20  # the good episode's frames only


def edit_json(path: Path, **values) -> None:
    data = json.loads(path.read_text())
    data.update(values)
    path.write_text(json.dumps(data))


def test_checkpoint_config_types_and_layout_are_checked(tmp_path) -> None:
    with pytest.raises(ConfigError, match="VLAConfig: field 'n_bins' must be int, got '256'"):
        VLAConfig.from_dict({"text_vocab_size": 100, "n_bins": "256"})
    with pytest.raises(ConfigError, match=r"field 'vision_channels' must be tuple\[int, ...\], got \[8, 16.5\]"):
        VLAConfig.from_dict({"text_vocab_size": 100, "vision_channels": [8, 16.5]})
    vla = tiny_vla()
    for name, change, message in [
        ("float", {"chunk": 2.0}, "field 'chunk' must be int, got 2.0"),
        ("bins", {"n_bins": 250}, r"config.json disagrees with the model as trained \(model.safetensors\): n_bins 250 vs 256"),
    ]:
        vla.save_pretrained(tmp_path / name)
        edit_json(tmp_path / name / "config.json", **change)
        with pytest.raises(CheckpointError, match=message):
            VLA.from_pretrained(tmp_path / name)
    # a checkpoint saved before the layout was recorded in the weights: train_info.json tells
    from safetensors.torch import load_file, save_file

    old = tmp_path / "old"
    vla.save_pretrained(old)
    save_file(load_file(str(old / "model.safetensors")), str(old / "model.safetensors"))  # no metadata
    (old / "train_info.json").write_text(json.dumps({"model_config": vla.config.to_dict()}))
    assert VLA.from_pretrained(old).fingerprint() == vla.fingerprint()
    edit_json(old / "config.json", n_bins=250)
    with pytest.raises(CheckpointError, match=r"\(train_info.json\): n_bins 250 vs 256"):
        VLA.from_pretrained(old)
    vla.save_pretrained(tmp_path / "nan")
    edit_json(tmp_path / "nan" / "norm_stats.json", q99=[1.0, float("nan"), 1.0, 1.0])
    with pytest.raises(CheckpointError, match="norm stats q99 must be a list of finite numbers"):
        VLA.from_pretrained(tmp_path / "nan")


def test_drafter_config_types_are_checked() -> None:
    from heisd.drafter.model import DrafterConfig

    with pytest.raises(ConfigError, match="DrafterConfig: field 'n_heads' must be int, got 4.0"):
        DrafterConfig.from_dict({"hidden_size": 32, "vocab_size": 300, "padded_vocab_size": 320, "n_heads": 4.0})


def nan_policy() -> VLAPolicy:
    """A real target whose action statistics are NaN: every decoded action is NaN."""
    good = tiny_vla()
    nan = np.full(4, np.nan)
    vla = VLA(good.config, NormStats(nan, nan, good.norm_stats.state_mean, good.norm_stats.state_std),
              good.text_tokenizer)
    vla.load_state_dict(good.state_dict())
    return VLAPolicy(vla.eval(), build_decoders(MethodConfig("ar"), vla))


def test_a_non_finite_action_never_reaches_the_simulator(tmp_path) -> None:
    from heisd.benchmarks.mw import MetaWorldEnv, MWConfig

    env = MetaWorldEnv("reach-v3", MWConfig(image_size=32, max_steps=5))
    with pytest.raises(InputError, match=r"reach-v3: the policy's action at env step 0 is not finite \(\[nan"):
        run_episode(env, nan_policy(), {"layout_seed": 0})
    assert env._steps == 0  # the simulator never stepped
    cfg = EvalConfig(("reach-v3",), episodes=1, max_steps=5, image_size=32)
    with pytest.raises(InputError, match=r"ev: reach-v3 episode 0: reach-v3: the policy's action at env step 0"):
        evaluate(nan_policy(), "ar", cfg, tmp_path / "ev", progress=False)
    assert not (tmp_path / "ev" / "episodes.jsonl").exists()


def test_mujoco_warnings_go_to_the_run_folder(tmp_path, monkeypatch) -> None:
    import mujoco

    from heisd.benchmarks.mujoco_log import mujoco_log

    monkeypatch.chdir(tmp_path)
    model = mujoco.MjModel.from_xml_string('<mujoco><worldbody><body><joint type="slide"/><geom size=".1"/>'
                                           "</body></worldbody></mujoco>")
    data = mujoco.MjData(model)
    data.qvel[0] = np.nan
    (tmp_path / "run").mkdir()
    with mujoco_log(tmp_path / "run" / "mujoco.log", "push-v3 episode 4"):
        mujoco.mj_step(model, data)
    log = (tmp_path / "run" / "mujoco.log").read_text()
    assert "push-v3 episode 4 WARNING: Nan, Inf or huge value in QVEL" in log
    assert not (tmp_path / "MUJOCO_LOG.TXT").exists() and mujoco.get_mju_user_warning() is None


@pytest.mark.parametrize("field, value", [("episodes", 0), ("max_steps", 0), ("execute", -1), ("seed", -1)])
def test_eval_config_ranges(field, value) -> None:
    with pytest.raises(ConfigError, match=f"EvalConfig.{field} must be >= "):
        EvalConfig(**{"tasks": ("reach-v3",), "episodes": 1, field: value})



def test_train_drafter_skips_invalid_episodes_only_when_asked(tmp_path, capsys) -> None:
    from heisd.cli import main

    path = tmp_path / "bad.hdf5"
    write_demo_file(path, ["reach-v3"], episodes=3, steps=20)  # one held out, one to train on, one broken
    with h5py.File(path, "a") as f:
        set_value("actions", 0, np.nan)(f["data"])
    tiny_vla().save_pretrained(tmp_path / "vla")
    argv = ["train-drafter", "--target", str(tmp_path / "vla"), "--demos", str(path), "--out", str(tmp_path / "d"),
            "--steps", "2", "--batch-size", "4", "--eval-every", "2", "--threads", "1", "--max-frames", "12"]
    assert main(argv) == 1
    assert "bad.hdf5: data/demo_1 has non-finite actions" in capsys.readouterr().err
    assert main([*argv, "--skip-invalid-episodes"]) == 0  # the good episode's frames, read again for the target's tokens
