"""`scripts/libero10.sh` (LIBERO-10's whole chain) and `scripts/libero_row.sh` (the other suites'
rows from their shipped targets): run with a stand-in `heisd` that logs its arguments, every command
line they would run must parse with heisd's own parser and pass its flag checks, stages whose
outputs are complete are skipped, a cut-off training resumes, a wrong stage or one that would build
on an unfinished step is refused, and the bench stage prints BENCHMARKS 17.4's row from its two
halves."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from heisd.commands.runner import _subparser, build_parser
from heisd.flags import check_args

SCRIPTS = Path(__file__).resolve().parents[1] / "scripts"
SCRIPT = SCRIPTS / "libero10.sh"
ROW_SCRIPT = SCRIPTS / "libero_row.sh"
TASK_0 = "LIVING_ROOM_SCENE2_put_both_the_alphabet_soup_and_the_tomato_sauce_in_the_basket"
# every row benches the same methods beside AR: the paper's HeiSD is its switch and tolerance
ROW_METHODS = ["specvla", "retrieval", "heisd", "heisd+no-prefill-skip+tol:paper+threshold"]


# logs its arguments and leaves what the stages check: a training's train_info.json at its last step,
# a datastore's manifest, and the calibration's hybrid threshold in it
STAND_IN = """
from pathlib import Path
argv = sys.argv[1:]
open(log, "a").write(json.dumps(argv) + "\\n")
flag = lambda name: argv[argv.index(name) + 1]
if argv[0] in ("train-vla", "dagger"):
    out = Path(flag("--out")) / (f"round_{flag('--rounds')}/vla" if argv[0] == "dagger" else "")
    out.mkdir(parents=True, exist_ok=True)
    (out / "train_info.json").write_text(json.dumps({"step": int(flag("--steps"))}))
if argv[0] == "demos":  # the task's file, as a finished recording leaves it
    Path(flag("--out")).mkdir(parents=True, exist_ok=True)
    (Path(flag("--out")) / f"{flag('--tasks')}_demo.hdf5").write_bytes(b"")
if argv[0] == "build-datastore":
    Path(flag("--out")).mkdir(parents=True)
    (Path(flag("--out")) / "manifest.json").write_text(json.dumps({"extras": {}}))
if argv[0] == "calibrate":
    (Path(flag("--datastore")) / "manifest.json").write_text(json.dumps({"extras": {"hybrid": {}}}))
"""


def _run(tmp_path: Path, *stages: str, script: Path = SCRIPT) -> tuple[subprocess.CompletedProcess, list[list[str]]]:
    log = tmp_path / "calls.jsonl"
    stand_in = tmp_path / "heisd"
    stand_in.write_text(f"#!{sys.executable}\nimport json, sys\nlog = {str(log)!r}\n" + STAND_IN)
    stand_in.chmod(0o755)
    env = {**os.environ, "OUT": str(tmp_path / "work"), "HEISD": str(stand_in), "PY": sys.executable}
    done = subprocess.run(["bash", str(script), *stages], env=env, capture_output=True, text=True, timeout=120)
    calls = [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []
    return done, calls


def _demo(work: Path, folder: str, task: str = TASK_0) -> None:
    (work / "demos" / folder).mkdir(parents=True, exist_ok=True)
    (work / "demos" / folder / f"{task}_demo.hdf5").write_bytes(b"")


def _trained(run: Path, step: int) -> None:
    """A training run in `run` that saved its checkpoint at `step` (what the stages read)."""
    run.mkdir(parents=True, exist_ok=True)
    (run / "train_info.json").write_text(json.dumps({"step": step}))


def _calibrated(datastore: Path) -> None:
    """A datastore that calibrate has written its hybrid threshold into (what the bench stage reads)."""
    datastore.mkdir(parents=True)
    (datastore / "manifest.json").write_text(json.dumps({"extras": {"hybrid": {}}}))


def test_every_command_line_parses_and_finished_recordings_are_skipped(tmp_path, monkeypatch) -> None:
    work = tmp_path / "work"
    _demo(work, "l10w_s0")  # task 0's files are there: only the other 9 tasks are recorded
    _demo(work, "l10w_heldout")
    done, calls = _run(tmp_path)
    assert done.returncode == 0, done.stderr
    monkeypatch.chdir(work)  # the commands' paths are relative to OUT
    commands = [c[0] for c in calls]
    assert commands == ["demos"] * (9 + 2 + 9) + ["train-vla", "dagger", "train-vla", "train-drafter",
                                                   "build-datastore", "calibrate", "bench", "bench", "eval"]
    train, keyframe = (c for c in calls if c[0] == "train-vla")
    # the round's fine-tune again with keyframe weights, on its rollouts in the registry's task order
    rollouts = [a for a in keyframe if a.startswith("dag_l10w/round_1/rollouts/")]
    assert rollouts[0] == f"dag_l10w/round_1/rollouts/{TASK_0}_demo.hdf5" and len(set(rollouts)) == 10
    (work / "dag_l10w" / "round_1" / "rollouts").mkdir()
    for path in rollouts:  # what the real dagger stage leaves (the stand-in does not record)
        (work / path).write_bytes(b"")
    for argv in calls:
        parser, _ = build_parser(argv[0])
        args = parser.parse_args(argv)
        check_args(_subparser(parser, args.command), args)
    recorded = [c[c.index("--tasks") + 1] for c in calls if c[0] == "demos" and "demos/l10w_s0" in c]
    assert TASK_0 not in recorded and len(set(recorded)) == 9
    assert "--resume" not in train and "demos/l10w_s0/" + TASK_0 + "_demo.hdf5" in train
    flag = lambda name: keyframe[keyframe.index(name) + 1]  # noqa: E731
    assert flag("--init-from") == "l10w_bc" and flag("--out") == "l10w_kf" and flag("--keyframe-weight") == "5"
    assert "--resume" not in keyframe
    assert all(c[c.index("--target") + 1] == "l10w_kf" for c in calls if "--target" in c)
    halves = [c[c.index("--tasks") + 1:c.index("--episodes")] for c in calls if c[0] == "bench"]
    assert sorted(len(h) for h in halves) == [5, 5] and len(set(halves[0]) | set(halves[1])) == 10
    assert all(c[c.index("--only") + 1:c.index("--out")] == ROW_METHODS for c in calls if c[0] == "bench")


@pytest.mark.parametrize("stage, run, steps", [("bc", "l10w_bc", 6000), ("keyframe", "l10w_kf", 3000)])
def test_a_cut_off_training_resumes_and_a_finished_one_is_skipped(tmp_path, stage, run, steps) -> None:
    work = tmp_path / "work"
    _demo(work, "l10w_s0")
    _trained(work / "dag_l10w" / "round_1" / "vla", 3000)  # what the keyframe stage builds on
    _trained(work / run, steps // 2)
    (work / run / "train_state.pt").write_bytes(b"")
    done, calls = _run(tmp_path, stage)
    assert done.returncode == 0, done.stderr
    assert [c[0] for c in calls] == ["train-vla"] and "--resume" in calls[0]
    _trained(work / run, steps)
    (tmp_path / "calls.jsonl").unlink()
    done, calls = _run(tmp_path, stage)
    assert done.returncode == 0 and calls == []


@pytest.mark.parametrize("stages, message, folder_made", [(("demos", "nope"), "unknown stage 'nope'", False),
                                                          (("bc",), "no demonstrations", True)])
def test_bad_stages_are_refused_before_anything_runs(tmp_path, stages, message, folder_made) -> None:
    done, calls = _run(tmp_path, *stages)
    assert done.returncode == 2 and message in done.stderr and calls == []
    assert (tmp_path / "work").exists() == folder_made  # a wrong stage name makes nothing


def test_a_stage_never_builds_on_an_unfinished_training(tmp_path) -> None:
    work = tmp_path / "work"
    _demo(work, "l10w_s0")
    _trained(work / "l10w_bc", 3500)
    for stage, message in (("dagger", "l10w_bc has not finished its 6000 steps: run the bc stage first"),
                           ("keyframe", "dag_l10w/round_1/vla has not finished its 3000 steps: run the dagger stage"),
                           ("bench", "l10w_kf has not finished its 3000 steps: run the keyframe stage")):
        done, calls = _run(tmp_path, stage)
        assert done.returncode == 2 and message in done.stderr and calls == []


@pytest.mark.parametrize("script, ready", [(SCRIPT, "l10w_kf"), (ROW_SCRIPT, "datastore")])
def test_the_bench_stage_prints_the_row_from_both_halves(tmp_path, script, ready) -> None:
    work = tmp_path / "work"
    if script == SCRIPT:
        _trained(work / ready, 3000)
    else:
        _calibrated(work / ready)
    for half, (sr, speedup) in {"a": (0.6, 1.25), "b": (0.8, 1.5)}.items():
        (work / "bench" / half).mkdir(parents=True)
        rows = [{"method": m, "episodes": 5, "sr": sr, "speedup": speedup if m == "heisd" else 1.0,
                 "acceptance_length": 4.5 if m == "heisd" else 1.0} for m in ("ar", "heisd")]
        (work / "bench" / half / "bench.json").write_text(json.dumps(rows))
    stages = ("bench",) if script == SCRIPT else ("libero_goal", "bench")
    done, calls = _run(tmp_path, *stages, script=script)
    assert done.returncode == 0, done.stderr
    assert [c[0] for c in calls] == ["bench", "bench"]
    assert "ar: 7/10 (70.0%), speedup 1.00x / 1.00x, AL 1.00 / 1.00" in done.stdout
    assert "heisd: 7/10 (70.0%), speedup 1.25x / 1.50x, AL 4.50 / 4.50" in done.stdout


# per suite: the recordings (training folders, then the held-out one) and demos calls
ROWS = {"libero_goal": (["goal_s0", "goal_s1", "goal_s1c", "goal_s3"], "goal_heldout", 29),
        "libero_spatial": (["spatial_s3", "spatial_s4"], "spatial_heldout", 24),
        "libero_object": (["libero_object"], "libero_heldout", 20)}


@pytest.mark.parametrize("suite", ROWS)
def test_a_row_runs_from_the_shipped_target_and_every_command_line_parses(tmp_path, suite) -> None:
    from heisd.benchmarks.libero import suite_tasks

    folders, heldout, n_demos = ROWS[suite]
    tasks = suite_tasks(suite)
    work = tmp_path / "work"
    _demo(work, heldout, tasks[0])  # a finished recording is not made again
    done, calls = _run(tmp_path, suite, script=ROW_SCRIPT)
    assert done.returncode == 0, done.stderr
    assert [c[0] for c in calls] == ["demos"] * (n_demos - 1) + ["build-datastore", "calibrate", "bench", "bench"]
    for argv in calls:
        parser, _ = build_parser(argv[0])
        args = parser.parse_args(argv)
        check_args(_subparser(parser, args.command), args)
        assert args.benchmark == suite if "--benchmark" in argv else argv[0] == "calibrate"
    demos = [c for c in calls if c[0] == "demos"]
    assert all(c[c.index("--tasks") + 1] in tasks for c in demos)  # the scripts' task names are the suite's
    assert {c[c.index("--tasks") + 1] for c in demos if c[-1].endswith(heldout)} == set(tasks[1:])
    flag = lambda argv, name: argv[argv.index(name) + 1]  # noqa: E731
    store, calibrate, *benches = calls[-4:]
    recorded = {Path(p).parent.name for p in store[store.index("--demos") + 1:store.index("--out")]}
    assert recorded == set(folders)  # the datastore holds the training recordings, never the held-out ones
    assert {Path(p).parent.name for p in calibrate[calibrate.index("--demos") + 1:calibrate.index("--drafter")]} == {heldout}
    assert all(flag(c, "--target") == f"checkpoints/{suite}/vla" for c in (store, calibrate, *benches))
    assert all(flag(c, "--drafter") == f"checkpoints/{suite}/drafter" for c in (calibrate, *benches))
    assert all(c[c.index("--only") + 1:c.index("--out")] == ROW_METHODS for c in benches)
    halves = {tuple(c[c.index("--tasks") + 1:c.index("--episodes")]) for c in benches}  # run at once: any order
    assert halves == {tasks[:5], tasks[5:]}
    (tmp_path / "calls.jsonl").unlink()  # run again: everything is there, nothing but the bench runs
    done, calls = _run(tmp_path, suite, script=ROW_SCRIPT)
    assert done.returncode == 0 and [c[0] for c in calls] == ["bench", "bench"]


@pytest.mark.parametrize("args, message", [((), "usage:"), (("libero_10",), "usage:"),
                                           (("libero_goal", "bc"), "unknown stage 'bc'"),
                                           (("libero_goal", "datastore"), "no demonstrations in"),
                                           (("libero_goal", "calibrate"), "run the datastore stage first"),
                                           (("libero_goal", "bench"), "is not calibrated: run the calibrate stage")])
def test_a_row_refuses_a_wrong_suite_or_stage_and_steps_out_of_order(tmp_path, args, message) -> None:
    done, calls = _run(tmp_path, *args, script=ROW_SCRIPT)
    assert done.returncode == 2 and message in done.stderr and calls == []
