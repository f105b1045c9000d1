"""A closed-loop run shows the target the camera its demonstrations were recorded with."""

import argparse
import json

import h5py
import pytest
from helpers import write_demo_file

from heisd.commands.common import camera_of
from heisd.errors import InputError, UsageError
from heisd.targets.vla.train import demo_camera


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
    assert camera_of(args(None)) == "corner3"  # nothing recorded: what heisd recorded with before
    assert camera_of(args("topview")) == "topview"
    (tmp_path / "train_info.json").write_text(json.dumps({"camera": "corner"}))
    assert camera_of(args(None)) == "corner"
    assert camera_of(args("corner")) == "corner"
    with pytest.raises(UsageError, match="trained on frames of camera 'corner'"):
        camera_of(args("corner3"))


@pytest.mark.parametrize("command", ["build-datastore", "train-drafter", "calibrate"])
def test_demonstrations_of_another_camera_are_refused(tmp_path, capsys, command):
    """A datastore, drafter or calibration from frames the target never sees in closed loop is refused."""
    from helpers import tiny_vla

    from heisd.cli import main

    tiny_vla().save_pretrained(tmp_path / "vla")
    (tmp_path / "vla" / "train_info.json").write_text(json.dumps({"camera": "corner"}))
    demos = _with_camera(tmp_path / "old.hdf5", "corner3")
    extra = {"build-datastore": ["--out", str(tmp_path / "store")], "train-drafter": ["--out", str(tmp_path / "d")],
             "calibrate": ["--datastore", str(tmp_path / "vla")]}[command]
    rc = main([command, "--target", str(tmp_path / "vla"), "--demos", str(demos), *extra])
    err = capsys.readouterr().err
    assert rc == 1 and "old.hdf5: recorded with camera 'corner3', but the target was trained on camera 'corner'" in err
    assert not (tmp_path / "store").exists() and not (tmp_path / "d").exists()
