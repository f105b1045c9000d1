"""Runs know what they are and datastores stay read-only at run time: run.json fingerprints and a
resume refused with the difference named, one process per --out, an eval killed by SIGTERM that
resumes without duplicates, online thresholds kept in the run folder and merged into the manifest
only with --persist-thresholds (under the lock; two processes both count)."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from helpers import tiny_vla, write_demo_file

from heisd.cli import main
from heisd.errors import OutputError, UsageError
from heisd.retrieval import Datastore, VerifySkip, build_datastore, manifest
from heisd.retrieval.manifest import DatastoreError
from heisd.retrieval.online import persist_thresholds
from heisd.storage import LOCK_FILE

SRC = str(Path(__file__).resolve().parents[1] / "src")
SUPPORT = {"skipped": 60, "passed": 60, "lower_bound": 0.957, "confidence": 0.95, "min_support": 20, "frames": 80}
CALIBRATION = {"verify_skip": {"theta": 0.9, "calibrated_theta": 0.85, "frames": 12, "support": SUPPORT},
               "prefill_skip": {"theta": 0.95, "calibrated_theta": 0.9, "frames": 12, "support": SUPPORT}}


@pytest.fixture(scope="module")
def res(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("runs")
    vla = tiny_vla()
    vla.save_pretrained(root / "vla")
    tiny_vla(seed=1).save_pretrained(root / "other")
    write_demo_file(root / "demos.hdf5", ["reach-v3"], episodes=2, steps=20)
    build_datastore(vla, [root / "demos.hdf5"], root / "store")
    Datastore.load(root / "store").update_extras(CALIBRATION)
    return {"root": root, "vla": root / "vla", "other": root / "other", "store": root / "store"}


def hold_lock(directory: Path, purpose: str) -> subprocess.Popen:
    """Another process holding `directory`'s lock (returns once it does)."""
    code = textwrap.dedent("""
        import sys, time
        from heisd.storage import directory_lock
        with directory_lock(sys.argv[1], sys.argv[2]):
            print("locked", flush=True)
            time.sleep(60)
    """)
    env = {**os.environ, "PYTHONPATH": SRC}
    child = subprocess.Popen([sys.executable, "-c", code, str(directory), purpose], env=env, stdout=subprocess.PIPE,
                             text=True)
    assert child.stdout.readline().strip() == "locked"
    return child


def eval_argv(res: dict, out: Path, *extra: str) -> list[str]:
    return ["eval", "--target", str(res["vla"]), "--tasks", "reach-v3", "--episodes", "2", "--max-steps", "4",
            "--out", str(out), *extra]


def retrieval(res: dict, store: Path | None = None) -> list[str]:
    return ["--method", "retrieval", "--datastore", str(store or res["store"])]


def test_run_json_records_the_resources_and_a_resume_must_match(res, tmp_path, capsys) -> None:
    out = tmp_path / "ev"
    assert main(eval_argv(res, out, *retrieval(res))) == 0
    run = json.loads((out / "run.json").read_text())
    assert run["target"]["fingerprint"] == tiny_vla().fingerprint()
    assert set(run["datastore"]) == {"fingerprint", "calibration"} and run["method_config"]["method"] == "retrieval"
    assert run["max_steps"] == 4 and run["paths"]["datastore"] == str(res["store"])
    capsys.readouterr()
    for extra, difference in [(["--retrieval-k", "4"], "method_config.retrieval_k: 8 -> 4"),
                              (["--max-steps", "5"], "max_steps: 4 -> 5")]:
        assert main(eval_argv(res, out, *retrieval(res), *extra)) == 1
        err = capsys.readouterr().err
        assert f"holds a run with other settings ({difference}" in err and "use another --out" in err
    assert main(eval_argv(res, tmp_path / "ar")) == 0
    assert main(eval_argv(res, tmp_path / "ar", "--target", str(res["other"]))) == 1
    assert "holds a run with other settings (target.fingerprint: " in capsys.readouterr().err
    # a recalibrated datastore is another datastore for a resume
    recalibrated, moved = tmp_path / "recalibrated", tmp_path / "moved"
    for copy in (recalibrated, moved):
        shutil.copytree(res["store"], copy)
    Datastore.load(recalibrated).update_extras({"hybrid": {"threshold": 0.4}})
    assert main(eval_argv(res, out, *retrieval(res, recalibrated))) == 1
    assert "datastore.calibration: " in capsys.readouterr().err
    # a theta moved online (another run's --persist-thresholds) leaves it the same datastore
    Datastore.load(moved).update_extras({"verify_skip": {**CALIBRATION["verify_skip"], "theta": 0.88,
                                                         "online_updates": 3}})
    assert main(eval_argv(res, out, *retrieval(res, moved))) == 0


def test_eval_never_writes_the_datastore_and_keeps_thresholds_in_its_folder(res, tmp_path) -> None:
    manifest = (res["store"] / "manifest.json").read_bytes()
    out = tmp_path / "ev"
    assert main(eval_argv(res, out, *retrieval(res))) == 0
    assert (res["store"] / "manifest.json").read_bytes() == manifest
    lines = [json.loads(x) for x in (out / "episodes.jsonl").read_text().splitlines()]
    assert [line["thresholds"]["verify_skip"]["updates"] for line in lines] == [1, 2]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["thresholds"] == lines[-1]["thresholds"]
    assert json.loads((out / "thresholds.json").read_text()) == {
        "start": {k: CALIBRATION[k] for k in ("verify_skip", "prefill_skip")}, "persisted": None}
    # the resumed half of a run continues from its last finished episode's thetas
    half = tmp_path / "half"
    assert main(eval_argv(res, half, *retrieval(res))) == 0
    kept = (half / "episodes.jsonl").read_text().splitlines()[:1]
    (half / "episodes.jsonl").write_text(kept[0] + "\n")
    assert main(eval_argv(res, half, *retrieval(res))) == 0
    again = [json.loads(x) for x in (half / "episodes.jsonl").read_text().splitlines()]
    assert [line["thresholds"] for line in again] == [line["thresholds"] for line in lines]


def test_persist_thresholds_merges_once_under_the_lock(res, tmp_path, capsys, monkeypatch) -> None:
    store = tmp_path / "store"
    shutil.copytree(res["store"], store)
    out = tmp_path / "ev"
    argv = eval_argv(res, out, *retrieval(res, store), "--persist-thresholds")
    assert main(argv) == 0
    extras = Datastore.load(store).extras
    end = json.loads((out / "summary.json").read_text())["thresholds"]
    for key in ("verify_skip", "prefill_skip"):
        assert extras[key]["theta"] == pytest.approx(end[key]["theta"]) and extras[key]["online_updates"] == 2
        assert extras[key]["calibrated_theta"] == CALIBRATION[key]["calibrated_theta"]
    assert main(argv) == 0  # a finished run persists once
    assert Datastore.load(store).extras["verify_skip"]["online_updates"] == 2
    holder = hold_lock(store, "heisd calibrate")  # calibrate holds the lock: a persist waits, then says who
    try:
        monkeypatch.setattr(manifest, "LOCK_WAIT_S", 0.2)
        with pytest.raises(OutputError, match=rf"in use by another heisd process \(pid {holder.pid}: heisd calibrate\)"):
            persist_thresholds(Datastore.load(store), [VerifySkip.from_datastore(Datastore.load(store))])
    finally:
        holder.kill()
        holder.wait()
    stale = VerifySkip.from_datastore(Datastore.load(store))
    Datastore.load(store).update_extras({"verify_skip": {**CALIBRATION["verify_skip"], "calibrated_theta": 0.8}})
    with pytest.raises(DatastoreError, match="verify_skip was recalibrated since this run started"):
        persist_thresholds(Datastore.load(store), [stale])
    capsys.readouterr()
    assert main(eval_argv(res, tmp_path / "ar", "--persist-thresholds")) == 2
    assert "--persist-thresholds: this method adapts no skip threshold" in capsys.readouterr().err
    with pytest.raises(UsageError, match="has no calibrated verify_skip"):
        persist_thresholds(Datastore.load(store), [VerifySkip(0.9)])


def test_calibrate_is_the_one_writer(res, tmp_path, capsys, monkeypatch) -> None:
    """A second calibrate is refused at its start, not after measuring (when its manifest edit
    would wait for the lock instead)."""
    from test_retrieval_build import write_demos

    write_demos(tmp_path / "heldout.hdf5", episodes=2, seed=5)
    monkeypatch.setattr(manifest, "LOCK_WAIT_S", 60.0)
    holder = hold_lock(res["store"], "heisd calibrate")
    try:
        argv = ["calibrate", "--target", str(res["vla"]), "--datastore", str(res["store"]),
                "--demos", str(tmp_path / "heldout.hdf5"), "--threads", "1"]
        start = time.monotonic()
        assert main(argv) == 1 and time.monotonic() - start < 30
        assert f"is in use by another heisd process (pid {holder.pid}: heisd calibrate)" in capsys.readouterr().err
    finally:
        holder.kill()
        holder.wait()


def _persist_after_both_loaded(store: Path, me: str, other: str, successes: int) -> None:
    datastore = Datastore.load(store)
    skip = VerifySkip.from_datastore(datastore)
    for _ in range(successes):
        skip.update(True)
    (store.parent / me).touch()
    while not (store.parent / other).exists():  # both have read the manifest before either writes
        time.sleep(0.01)
    persist_thresholds(datastore, [skip])


def test_two_processes_persisting_both_count(res, tmp_path) -> None:
    import multiprocessing

    store = tmp_path / "store"
    shutil.copytree(res["store"], store)
    fork = multiprocessing.get_context("fork")  # two real processes, without importing torch twice more
    children = [fork.Process(target=_persist_after_both_loaded, args=(store, me, other, n))
                for me, other, n in (("a", "b", 2), ("b", "a", 3))]
    for child in children:
        child.start()
    for child in children:
        child.join(timeout=60)
    assert [child.exitcode for child in children] == [0, 0]
    record = Datastore.load(store).extras["verify_skip"]
    assert record["online_updates"] == 5
    assert record["theta"] == pytest.approx(0.9 - 5 * 0.01)  # both runs' changes, none lost
    assert not (store / LOCK_FILE).exists()


def test_a_second_process_cannot_write_the_same_out(res, tmp_path, capsys) -> None:
    out = tmp_path / "ev"
    child = hold_lock(out, "heisd eval --out ev")
    try:
        assert main(eval_argv(res, out)) == 1
        assert f"is in use by another heisd process (pid {child.pid}: heisd eval --out ev)" in capsys.readouterr().err
        assert [p.name for p in out.iterdir()] == [LOCK_FILE]  # nothing written beside the holder's lock
    finally:
        child.kill()
        child.wait()
    assert main(eval_argv(res, out)) == 0  # the kernel dropped the dead holder's lock


@pytest.mark.slow
def test_sigterm_stops_an_eval_cleanly_and_it_resumes_without_duplicates(res, tmp_path) -> None:
    out = tmp_path / "ev"
    argv = eval_argv(res, out, "--max-steps", "60")
    argv[argv.index("--episodes") + 1] = "4"
    env = {**os.environ, "PYTHONPATH": SRC}
    child = subprocess.Popen([sys.executable, "-m", "heisd.cli", *argv], env=env, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 300
        while not (out / "episodes.jsonl").exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        child.send_signal(signal.SIGTERM)
        assert child.wait(timeout=120) == 143
        assert "interrupted" in child.stderr.read()
    finally:
        child.kill()
    assert sorted(p.name for p in out.iterdir()) == ["episodes.jsonl", "run.json"]  # no lock, no temporaries
    assert 1 <= len((out / "episodes.jsonl").read_text().splitlines()) < 4
    assert main(argv) == 0
    lines = [json.loads(x) for x in (out / "episodes.jsonl").read_text().splitlines()]
    assert sorted(line["episode"] for line in lines) == [0, 1, 2, 3]
    assert json.loads((out / "summary.json").read_text())["episodes"] == 4


def test_eval_through_a_server_records_the_server_target(res, tmp_path, capsys) -> None:
    from heisd.runtime.methods import MethodConfig
    from heisd.serving.launch import ServerThread, make_service
    from heisd.serving.service import ServeConfig

    vla, out = tiny_vla(), tmp_path / "served"
    with ServerThread(*make_service(vla, MethodConfig("ar"), ServeConfig(), str(res["vla"]))) as server:
        argv = ["eval", "--server", server.url, "--tasks", "reach-v3", "--episodes", "1", "--max-steps", "4",
                "--out", str(out)]
        assert main(argv) == 0
        run = json.loads((out / "run.json").read_text())
        assert run["target"]["fingerprint"] == vla.fingerprint() and run["method_config"]["method"] == "ar"
        assert run["paths"] == {"server": server.url, "target": str(res["vla"])}
        capsys.readouterr()
        assert main([*argv, "--persist-thresholds"]) == 2
        assert "with --server the skip thresholds adapt on the server" in capsys.readouterr().err
    with ServerThread(*make_service(tiny_vla(seed=1), MethodConfig("ar"), ServeConfig(), "other")) as other:
        assert main(["eval", "--server", other.url, *argv[3:]]) == 1  # another target behind the URL
        assert "holds a run with other settings (target.fingerprint: " in capsys.readouterr().err
