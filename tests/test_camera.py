"""A closed-loop run shows the target the camera its demonstrations were recorded with."""

import argparse
import json

import h5py
import pytest
from helpers import write_demo_file

from heisd.commands.common import camera_of
from heisd.errors import InputError, UsageError
from heisd.vla.train import demo_camera


def _with_camera(path, camera):
    write_demo_file(path, ["reach-v3"], episodes=1, steps=4)
    with h5py.File(path, "a") as f:
        f["data"].attrs["env_args"] = json.dumps({"seed": 0, "camera": camera})
    return path


def test_training_records_the_demonstrations_camera(tmp_path):
    a, b = _with_camera(tmp_path / "a.hdf5", "corner"), _with_camera(tmp_path / "b.hdf5", "corner")
    assert demo_camera([a, b]) == "corner"
    write_demo_file(tmp_path / "plain.hdf5", ["reach-v3"], episodes=1, steps=4)  # no camera recorded
    assert demo_camera([tmp_path / "plain.hdf5"]) is None
    with pytest.raises(InputError, match="different cameras"):
        demo_camera([a, _with_camera(tmp_path / "c.hdf5", "corner3")])


def test_runs_use_the_trained_camera_and_refuse_another(tmp_path):
    args = lambda camera: argparse.Namespace(target=str(tmp_path), camera=camera)  # noqa: E731
    assert camera_of(args(None)) == "corner3"  # nothing recorded: the default camera
    assert camera_of(args("topview")) == "topview"
    (tmp_path / "train_info.json").write_text(json.dumps({"camera": "corner"}))
    assert camera_of(args(None)) == "corner"
    assert camera_of(args("corner")) == "corner"
    with pytest.raises(UsageError, match="trained on frames of camera 'corner'"):
        camera_of(args("corner3"))
