"""The command line on bad input: one line on stderr naming the flag / file, exit 1 (2 for
usage), no traceback unless --debug or HEISD_DEBUG=1 asks for it."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import h5py
import pytest
from helpers import tiny_vla, write_demo_file

from heisd.cli import main
from heisd.retrieval import build_datastore

ROOT = Path(__file__).resolve().parents[1]
SRC = str(ROOT / "src")


@pytest.fixture(scope="module")
def files(tmp_path_factory) -> dict[str, str]:
    root = tmp_path_factory.mktemp("cli")
    vla = tiny_vla()
    vla.save_pretrained(root / "vla")
    write_demo_file(root / "demos.hdf5", ["reach-v3"], episodes=2, steps=20)
    build_datastore(vla, [root / "demos.hdf5"], root / "store")
    (root / "notes.txt").write_text("not a demonstration file")
    (root / "photos").mkdir()
    (root / "photos" / "cat.jpg").write_text("x")
    with h5py.File(root / "theirs.hdf5", "w") as f:
        f.create_group("data")
    names = {"vla": "vla", "demos": "demos.hdf5", "store": "store", "notes": "notes.txt", "photos": "photos",
             "theirs": "theirs.hdf5"}
    shipped = {"drafter": ROOT / "checkpoints" / "drafter", "vla7d": ROOT / "checkpoints" / "libero_object" / "vla",
               "shipped": ROOT / "checkpoints" / "vla", "edited": root / "edited"}
    shutil.copytree(shipped["drafter"], root / "edited")
    config = json.loads((root / "edited" / "config.json").read_text())
    (root / "edited" / "config.json").write_text(json.dumps({**config, "target_fingerprint": "0" * 64}))
    return {key: str(root / name) for key, name in names.items()} | {"root": str(root)} | {
        key: str(path) for key, path in shipped.items()}


EVAL = ["eval", "--target", "{vla}", "--tasks", "reach-v3", "--out", "{root}/ev"]
CASES = [  # argv, exit code, what the one line must say
    (EVAL + ["--episodes", "0"], 2, "--episodes must be >= 1, got 0"),
    (EVAL + ["--max-steps", "0"], 2, "--max-steps must be >= 1, got 0"),
    (EVAL + ["--execute", "-1"], 2, "--execute must be >= 0, got -1"),
    (EVAL + ["--execute", "3"], 2, "--execute 3 exceeds the target's action chunk (2)"),
    (EVAL + ["--tree-depth", "0"], 2, "--tree-depth must be >= 1, got 0"),
    (EVAL + ["--switch-threshold", "nan"], 2, "--switch-threshold must be a finite number >= 0, got nan"),
    (EVAL + ["--method", "specvla"], 2, "needs a drafter (--drafter DIR)"),
    (["eval", "--target", "{vla}", "--tasks", "fly-v3", "--out", "{root}/ev"], 2, "unknown mw task 'fly-v3'"),
    (["eval", "--target", "{root}/missing", "--out", "{root}/ev"], 1,
     "{root}/missing: no such checkpoint directory"),
    (["eval", "--target", "missing", "--out", "{root}/ev"], 1,
     "missing: no such checkpoint directory (a relative path is read from here, "),
    (["eval", "--target", "{root}", "--out", "{root}/ev"], 1,
     "no config.json in {root}: not a target checkpoint directory"),
    (EVAL + ["--bogus"], 2, "unrecognized arguments: --bogus"),
    (["eval", "--target", "{vla}", "--out", "{notes}/ev"], 1, "notes.txt/ev: Not a directory"),  # an OSError
    (["build-datastore", "--target", "{vla}", "--demos", "{demos}", "{demos}", "--out", "{root}/s"], 2,
     "--demos lists the same file twice"),
    (["build-datastore", "--target", "{vla}", "--demos", "{notes}", "--out", "{root}/s"], 1,
     "notes.txt: not a readable HDF5 file"),
    (["build-datastore", "--target", "{vla}", "--demos", "{demos}", "--out", "{photos}", "--overwrite"], 1,
     "photos exists and is not a heisd datastore; heisd never replaces it"),
    (["build-datastore", "--target", "{vla}", "--demos", "{demos}", "--out", "{store}"], 1,
     "store already holds a heisd datastore; pass --overwrite to replace it"),
    (["demos", "--tasks", "reach-v3", "--seed", "10000", "--out", "{root}/d.hdf5"], 2,
     "--seed must be in [0, 10000)"),
    (["demos", "--tasks", "reach-v3", "--out", "{theirs}", "--overwrite"], 1,
     "theirs.hdf5 exists and is not a heisd demonstration file"),
    (["demos", "--benchmark", "libero_goal", "--episodes", "0", "--out", "{root}/lg"], 2, "--episodes must be >= 1, got 0"),
    (["demos", "--tasks", "reach-v3"], 2, "demos needs --out"),
    (["demos", "--tasks", "reach-v3", "--measure", "--policy", "{vla}"], 2, "the target reads frames"),
    (["train-vla", "--demos", "{demos}", "--out", "{root}/t", "--resume", "--overwrite"], 2,
     "--resume continues the run in --out, --overwrite replaces it"),
    (["train-vla", "--demos", "{root}/none.hdf5", "--out", "{root}/t"], 2, "--demos {root}/none.hdf5: no such file"),
    (["train-vla", "--demos", "{demos}", "--out", "{root}/t", "--device", "gpu0"], 2, "--device gpu0: not a torch device"),
    (["train-vla", "--demos", "{demos}", "--out", "{root}/t", "--shift-pad", "-1"], 2, "--shift-pad must be >= 0 pixels"),
    (["calibrate", "--target", "{vla}", "--datastore", "{store}", "--demos", "{demos}"], 1,
     "store was built from this file"),
    (["dagger", "--init", "{drafter}", "--demos", "{demos}", "--tasks", "reach-v3", "--out", "{root}/dg"], 1,
     "{drafter} is a drafter (made by heisd train-drafter), not a target: pass it as --drafter"),
    (["dagger", "--init", "{vla7d}", "--demos", "{demos}", "--tasks", "reach-v3", "--out", "{root}/dg"], 2,
     "--init {vla7d}: a target with 7-D actions and the 'raw' protocol cannot be recorded in mw"),
    (["eval", "--target", "{drafter}", "--out", "{root}/ev"], 1, "is a drafter (made by heisd train-drafter), not a target"),
    (EVAL + ["--method", "specvla", "--drafter", "{vla}"], 1,
     "{vla} is a target checkpoint, not a drafter: pass it as --target"),
    (["eval", "--target", "{shipped}", "--method", "specvla", "--drafter", "{edited}", "--out", "{root}/ev"], 1,
     "train one for this target (heisd train-drafter --target DIR) or pass the drafter made for it as --drafter"),
]


@pytest.mark.parametrize("argv, code, message", CASES, ids=[" ".join(c[0][:1] + c[0][-2:]) for c in CASES])
def test_bad_input_gives_one_line_and_the_exit_code(files, capsys, argv, code, message) -> None:
    try:
        rc = main([a.format(**files) for a in argv])
    except SystemExit as exit_:  # argparse's own errors exit from the parser
        rc = exit_.code
    assert rc == code
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1 and "Traceback" not in err, err
    assert message.format(**files) in lines[0] and lines[0].startswith("heisd")
    assert not any(Path(files["root"], name).exists() for name in ("dg", "ev"))  # a refused run leaves nothing


def test_argparse_errors_are_one_line_with_exit_2(capsys) -> None:
    with pytest.raises(SystemExit) as exit_:
        main(["eval", "--episodes", "many"])
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and err.count("\n") == 1
    assert "argument --episodes: invalid int value: 'many'" in err and "see heisd eval --help" in err


def test_debug_shows_the_traceback(files, capsys, monkeypatch) -> None:
    argv = ["eval", "--target", files["root"] + "/missing", "--out", files["root"] + "/ev"]
    assert main([*argv, "--debug"]) == 1
    err = capsys.readouterr().err
    assert "Traceback" in err and "CheckpointError" in err and err.rstrip().endswith(
        f"{files['root']}/missing: no such checkpoint directory")
    monkeypatch.setenv("HEISD_DEBUG", "1")
    assert main(argv) == 1 and "Traceback" in capsys.readouterr().err
    monkeypatch.setenv("HEISD_DEBUG", "0")
    assert main(argv) == 1 and "Traceback" not in capsys.readouterr().err


def test_a_real_process_exits_with_the_code(files) -> None:
    env = {**os.environ, "PYTHONPATH": SRC}
    done = subprocess.run([sys.executable, "-m", "heisd.cli", "eval", "--episodes", "0", "--out", files["root"] + "/ev"],
                          env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and done.stderr == "heisd eval: error: --episodes must be >= 1, got 0\n"


def test_a_multi_line_message_is_printed_on_one_line() -> None:
    from heisd.commands.runner import _one_line
    from heisd.errors import InputError

    assert _one_line(InputError("demos.hdf5: cannot read\n  (truncated chunk)")) == \
        "demos.hdf5: cannot read (truncated chunk)"
    assert _one_line(FileNotFoundError(2, "No such file or directory", "x.hdf5")) == "x.hdf5: No such file or directory"


def test_target_defaults_to_the_benchmarks_shipped_one():
    from heisd.benchmarks.registry import BENCHMARKS
    from heisd.commands.common import SHIPPED_TARGETS, shipped_target
    from heisd.commands.runner import build_parser

    parser, _ = build_parser("eval")
    assert set(SHIPPED_TARGETS) == set(BENCHMARKS)  # every benchmark has one
    for benchmark, path in (("mw", "checkpoints/vla"), ("libero_object", "checkpoints/libero_object/vla"),
                            ("libero_spatial", "checkpoints/libero_spatial/vla"),
                            ("libero_goal", "checkpoints/libero_goal/vla"), ("libero_10", "checkpoints/libero_10/vla")):
        args = parser.parse_args(["eval", "--benchmark", benchmark, "--out", "x"])
        shipped_target(args)
        assert args.target == path
        assert (ROOT / path / "config.json").is_file(), f"{path} is not shipped"
    args = parser.parse_args(["eval", "--benchmark", "libero_object", "--target", "mine", "--out", "x"])
    shipped_target(args)
    assert args.target == "mine"  # a given --target is never replaced


HOLD_LOCK = """
import sys, time
from heisd.storage import output_lock
with output_lock(sys.argv[1], "heisd demos (another recording)"):
    print("held", flush=True)
    time.sleep(60)
"""


@pytest.mark.parametrize("command", [
    ["demos", "--tasks", "reach-v3", "--episodes", "1", "--out", "{out}"],
    ["build-datastore", "--target", "{vla}", "--demos", "{demos}", "--out", "{out}"],
])
def test_a_second_writer_of_the_same_output_is_refused(files, capsys, tmp_path, command) -> None:
    """Two recordings into one --out used to both print 'wrote' while one of them was lost."""
    out = tmp_path / "same-out"
    holder = subprocess.Popen([sys.executable, "-c", HOLD_LOCK, str(out)], env={**os.environ, "PYTHONPATH": SRC},
                              stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        assert main([a.format(**files, out=out) for a in command]) == 1
    finally:
        holder.kill()
        holder.wait()
    err = capsys.readouterr().err
    assert f"{out} is in use by another heisd process (pid {holder.pid}: heisd demos (another recording))" in err
    assert not out.exists()


def test_a_camera_name_the_model_lacks_is_refused(tmp_path, capsys) -> None:
    """A typo used to record from MuJoCo's free camera and store the typo in the file."""
    out = tmp_path / "d.hdf5"
    assert main(["demos", "--tasks", "reach-v3", "--episodes", "1", "--camera", "corner5", "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert "--camera 'corner5': Meta-World has no such camera; its cameras: " in err and "corner2" in err
    assert not out.exists() and list(tmp_path.iterdir()) == []


def test_a_task_named_twice_is_refused(tmp_path, capsys) -> None:
    for command in (["demos", "--out", str(tmp_path / "d.hdf5")], ["eval", "--out", str(tmp_path / "ev")]):
        assert main([*command, "--tasks", "reach-v3", "push-v3", "reach-v3"]) == 2
        assert "--tasks names reach-v3 more than once" in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []


def test_a_corrupt_run_record_is_named_not_called_foreign(files, capsys, tmp_path) -> None:
    for command, record in ((["eval", "--target", files["vla"], "--tasks", "reach-v3"], "run.json"),
                            (["dagger", "--init", files["vla"], "--demos", files["demos"], "--tasks", "reach-v3"],
                             "dagger.json")):
        out = tmp_path / record.split(".")[0]
        out.mkdir()
        (out / record).write_text('{"bench')  # cut short, as by a full disk or an editor
        assert main([*command, "--out", str(out)]) == 1
        err = capsys.readouterr().err
        assert f"{out / record} is corrupt or incomplete, so heisd cannot tell whether {out} holds its" in err, err
        assert [p.name for p in out.iterdir()] == [record]
