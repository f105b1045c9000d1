"""Records name no machine: train_info.json, run.json, bench reports and datastore manifests keep
paths relative to where the command ran (as the user gave them when outside it), commands as
`heisd ...` a reader can paste, and no host name."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

from helpers import tiny_vla, write_demo_file

from heisd.cli import main
from heisd.storage import recorded_command, recorded_path


def absolute_strings(value) -> list[str]:
    """Every string in a JSON value that holds an absolute path (anywhere in it, e.g. in a command)."""
    if isinstance(value, dict):
        return [s for v in value.values() for s in absolute_strings(v)]
    if isinstance(value, list):
        return [s for v in value for s in absolute_strings(v)]
    if isinstance(value, str) and any(word.startswith(os.sep) for word in value.replace("=", " ").split()):
        return [value]
    return []


def test_paths_inside_the_working_directory_are_recorded_relative(tmp_path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    assert recorded_path(tmp_path / "demos" / "a.hdf5") == os.path.join("demos", "a.hdf5")
    assert recorded_path("demos/a.hdf5") == "demos/a.hdf5"  # relative: as given
    assert recorded_path(tmp_path) == "."
    elsewhere = tmp_path.parent / "elsewhere.hdf5"
    assert recorded_path(elsewhere) == str(elsewhere)  # outside: as given, there is no better form
    argv = ["train-vla", "--demos", str(tmp_path / "d.hdf5"), f"--out={tmp_path / 'run'}", "--note", "a b"]
    assert recorded_command(argv) == "heisd train-vla --demos d.hdf5 --out=run --note 'a b'"


def test_written_records_hold_no_absolute_path(tmp_path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    tiny_vla().save_pretrained(tmp_path / "vla")
    write_demo_file(tmp_path / "demos.hdf5", ["reach-v3", "push-v3"], episodes=2, steps=16)

    def run(*args: str) -> None:
        # as a shell would launch it: the program by its absolute path, the target given absolute
        # (inside the working directory), everything else relative
        monkeypatch.setattr(sys, "argv", [str(Path(sys.executable).parent / "heisd"), *args])
        assert main(list(args)) == 0

    run("train-vla", "--demos", "demos.hdf5", "--out", "run", "--steps", "2", "--batch-size", "4", "--threads", "1",
        "--eval-every", "2", "--save-every", "2", "--hidden-size", "32", "--layers", "1", "--image-size", "16",
        "--vision-channels", "8,16")
    run("train-drafter", "--target", str(tmp_path / "vla"), "--demos", "demos.hdf5", "--out", "drafter",
        "--steps", "2", "--batch-size", "4", "--eval-every", "2", "--threads", "1", "--max-frames", "8")
    run("build-datastore", "--target", str(tmp_path / "vla"), "--demos", "demos.hdf5", "--out", "store",
        "--threads", "1")
    run("bench", "--target", str(tmp_path / "vla"), "--drafter", "drafter", "--datastore", "store", "--only", "ar",
        "--tasks", "reach-v3", "--episodes", "1", "--max-steps", "2", "--out", "bench")

    vla_info = json.loads((tmp_path / "run" / "train_info.json").read_text())
    drafter_info = json.loads((tmp_path / "drafter" / "train_info.json").read_text())
    manifest = json.loads((tmp_path / "store" / "manifest.json").read_text())
    run_json = json.loads((tmp_path / "bench" / "ar" / "run.json").read_text())
    for record in (vla_info, drafter_info, manifest, run_json):
        assert absolute_strings(record) == []
    assert vla_info["command"].startswith("heisd train-vla --demos demos.hdf5 --out run ")
    assert drafter_info["command"].startswith("heisd train-drafter --target vla ") and drafter_info["target"] == "vla"
    assert manifest["extras"]["build"]["demo_files"][0]["path"] == "demos.hdf5"
    assert "host" not in manifest["created"] and "heisd" in manifest["created"]
    assert run_json["paths"] == {"target": "vla", "drafter": "drafter", "datastore": "store"}
    command = next(line for line in (tmp_path / "bench" / "report.md").read_text().splitlines()
                   if line.startswith("Command: "))
    assert command.startswith("Command: `heisd bench --target vla --drafter drafter") and os.sep + "tmp" not in command
