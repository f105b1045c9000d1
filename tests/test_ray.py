"""`--ray`: the commands' jobs on a local Ray cluster of 2 CPUs give what a local run gives, episode
for episode (timings aside), and a worker killed mid-episode costs one rerun, never a lost or a
doubled episode. One cluster for the module; each command's workers start afresh (seconds each)."""

from __future__ import annotations

import json
import os
import signal
import threading
import time
from pathlib import Path

import h5py
import numpy as np
import pytest

from heisd.commands.runner import main

# per step, what the clock measured: the rest of an episode line is a pure function of its seed
TIMED = {"latency_ms", "breakdown_ms", "decode_ms", "expected_ms", "choices"}
ROOT = Path(__file__).resolve().parents[1]
MW = ["--tasks", "reach-v3", "--episodes", "3", "--max-steps", "16"]


@pytest.fixture(scope="module")
def cluster():
    import ray

    ray.init(num_cpus=2, include_dashboard=False, logging_level="WARNING")
    yield
    ray.shutdown()


@pytest.fixture(autouse=True)
def in_repository(monkeypatch):
    monkeypatch.chdir(ROOT)  # the shipped checkpoints are where the flags' defaults say


def heisd(*argv) -> None:
    assert main([str(a) for a in argv]) == 0


def episodes(out: Path) -> dict[tuple[str, int], dict]:
    lines = [json.loads(line) for line in (out / "episodes.jsonl").read_text().splitlines()]
    by_key = {(e["task"], e["episode"]): e for e in lines}
    assert len(by_key) == len(lines), "an episode was recorded twice"
    return by_key


def untimed(line: dict) -> dict:
    kept = {k: v for k, v in line.items() if k != "worker"}
    kept["steps"] = {k: v for k, v in line["steps"].items() if k not in TIMED}
    return kept


def assert_same_episodes(ray_run: Path, local_run: Path) -> None:
    ours, theirs = episodes(ray_run), episodes(local_run)
    assert sorted(ours) == sorted(theirs)
    for key in theirs:
        assert untimed(ours[key]) == untimed(theirs[key]), key
    assert all("worker" in e for e in ours.values())


def kill_first_worker(out: Path, killed: list[str]) -> threading.Thread:
    """Once the first episode line lands in `out`, SIGKILL the worker that wrote it: by then the
    driver has handed that worker the next episode."""

    def watch() -> None:
        path, deadline = out / "episodes.jsonl", time.time() + 300
        while time.time() < deadline:
            if path.exists() and path.read_text().strip():
                worker = json.loads(path.read_text().splitlines()[0])["worker"]
                os.kill(int(worker.rsplit(":", 1)[1]), signal.SIGKILL)
                killed.append(worker)
                return
            time.sleep(0.02)

    thread = threading.Thread(target=watch, daemon=True)
    thread.start()
    return thread


def test_eval_on_ray_equals_local_and_survives_a_killed_worker(cluster, tmp_path, caplog):
    heisd("eval", "--method", "ar", *MW, "--out", tmp_path / "local")
    killed: list[str] = []
    watcher = kill_first_worker(tmp_path / "ray", killed)
    heisd("eval", "--method", "ar", *MW, "--out", tmp_path / "ray", "--ray", "--ray-workers", 2)
    watcher.join(1)
    assert killed, "no worker was killed"
    assert "runs again on another worker" in caplog.text
    assert_same_episodes(tmp_path / "ray", tmp_path / "local")
    workers = {e["worker"] for e in episodes(tmp_path / "ray").values()}
    assert len(workers) == 3  # the two started, and the one that took over the killed one's episode
    ours = json.loads((tmp_path / "ray" / "summary.json").read_text())
    theirs = json.loads((tmp_path / "local" / "summary.json").read_text())
    assert ours["sr"] == theirs["sr"] and ours["per_task"] == theirs["per_task"]



def h5_contents(path: Path) -> dict:
    """Every dataset's values and every attribute but the time of writing."""
    out: dict = {}

    def visit(name, obj) -> None:
        attrs = {k: str(v) for k, v in obj.attrs.items() if k != "created"}
        out[name] = (obj[()].tobytes() if isinstance(obj, h5py.Dataset) else None, attrs)

    with h5py.File(path, "r") as f:
        f.visititems(visit)
    return out


@pytest.mark.slow
def test_demos_and_build_datastore_on_ray_equal_local(cluster, tmp_path):
    """The demonstration file holds the same episodes in the same order; the datastore's files
    are bit-identical (its manifest differs only in when and how fast it was built)."""
    demos = ["demos", "--tasks", "reach-v3", "drawer-close-v3", "--episodes", "2", "--max-steps", "40",
             "--image-size", "64", "--camera", "corner"]
    heisd(*demos, "--out", tmp_path / "local.hdf5")
    heisd(*demos, "--out", tmp_path / "ray.hdf5", "--ray", "--ray-workers", 2)
    assert h5_contents(tmp_path / "ray.hdf5") == h5_contents(tmp_path / "local.hdf5")
    # the target's own rollouts with the expert's labels (what each DAgger round records)
    dagger = ["demos", "--policy", "checkpoints/vla", "--expert-labels", "--tasks", "reach-v3", "--episodes", "2",
              "--max-steps", "16", "--image-size", "64", "--camera", "corner", "--seed", "7"]
    heisd(*dagger, "--out", tmp_path / "dagger_local.hdf5")
    heisd(*dagger, "--out", tmp_path / "dagger_ray.hdf5", "--ray", "--ray-workers", 2)
    assert h5_contents(tmp_path / "dagger_ray.hdf5") == h5_contents(tmp_path / "dagger_local.hdf5")

    build = ["build-datastore", "--target", "checkpoints/vla", "--demos", tmp_path / "local.hdf5", "--threads", 1,
             "--batch-size", 16]
    heisd(*build, "--out", tmp_path / "ds_local")
    heisd(*build, "--out", tmp_path / "ds_ray", "--ray", "--ray-workers", 2)
    local, ray = (json.loads((tmp_path / d / "manifest.json").read_text()) for d in ("ds_local", "ds_ray"))
    assert ray["files"] == local["files"] and local["n_entries"] > 0  # every file's size and sha256
    for name in local["files"]:
        assert (tmp_path / "ds_ray" / name).read_bytes() == (tmp_path / "ds_local" / name).read_bytes(), name
    for manifest in (local, ray):
        for key in ("seconds", "frames_per_s"):
            del manifest["extras"]["build"][key]
        del manifest["created"]
    assert ray == local


@pytest.fixture(scope="module")
def held_out(tmp_path_factory) -> Path:
    """Expert demonstrations of reach (held out: a seed of their own) and a datastore built from them."""
    root = tmp_path_factory.mktemp("held_out")
    cwd = os.getcwd()
    os.chdir(ROOT)
    try:
        heisd("demos", "--tasks", "reach-v3", "--episodes", "2", "--max-steps", "100", "--image-size", "64",
              "--camera", "corner", "--seed", "3", "--out", root / "held.hdf5")
        heisd("build-datastore", "--target", "checkpoints/vla", "--demos", root / "held.hdf5", "--threads", 1,
              "--out", root / "ds")
    finally:
        os.chdir(cwd)
    return root


@pytest.mark.slow
def test_bench_on_ray_runs_every_configuration_of_an_episode_on_one_worker(cluster, held_out, tmp_path):
    bench = ["bench", "--only", "specvla", "--drafter", "checkpoints/drafter", "--datastore", held_out / "ds", *MW]
    heisd(*bench, "--out", tmp_path / "local")
    heisd(*bench, "--out", tmp_path / "ray", "--ray", "--ray-workers", 2)
    for folder in ("ar", "specvla"):
        assert_same_episodes(tmp_path / "ray" / folder, tmp_path / "local" / folder)
    ar, spec = episodes(tmp_path / "ray" / "ar"), episodes(tmp_path / "ray" / "specvla")
    assert all(ar[key]["worker"] == spec[key]["worker"] for key in ar)  # the ratio is formed within a worker
    summaries = json.loads((tmp_path / "ray" / "bench.json").read_text())
    by_worker = summaries[1].get("speedup_by_worker", {})
    if len(by_worker) > 1:  # both workers got episodes: the headline is the median of their ratios
        assert summaries[1]["speedup"] == pytest.approx(float(np.median(list(by_worker.values()))))
        assert f"over {len(by_worker)} workers" in (tmp_path / "ray" / "report.md").read_text()


@pytest.mark.slow
def test_replay_on_ray_equals_local(cluster, held_out, tmp_path):
    replay = ["replay", "--method", "specvla", "--drafter", "checkpoints/drafter", "--demos", held_out / "held.hdf5",
              "--frames", "20"]
    heisd(*replay, "--out", tmp_path / "local")
    heisd(*replay, "--out", tmp_path / "ray", "--ray", "--ray-workers", 2)
    local, ray = (json.loads((tmp_path / d / "replay.json").read_text()) for d in ("local", "ray"))
    for key in ("frames", "tasks", "token_mismatch_rate", "mean_bin_deviation", "max_bin_deviation",
                "acceptance_length", "target_forwards", "tokens_per_forward"):
        assert ray[key] == local[key], key


@pytest.mark.slow
def test_libero_eval_on_ray_equals_local(cluster, tmp_path):
    """One LIBERO-Object task with the shipped small target, 2 episodes from the suite's init states."""
    pytest.importorskip("libero", reason="the libero extra is not installed")
    from conftest import LIBERO_TASK

    run = ["eval", "--benchmark", "libero_object", "--method", "ar", "--tasks", LIBERO_TASK, "--episodes", 2,
           "--max-steps", 40]
    heisd(*run, "--out", tmp_path / "local")
    heisd(*run, "--out", tmp_path / "ray", "--ray", "--ray-workers", 2)
    assert_same_episodes(tmp_path / "ray", tmp_path / "local")

    # resume: an interrupted Ray run reruns only what its episodes.jsonl lacks
    lines = (tmp_path / "ray" / "episodes.jsonl").read_text().splitlines()
    (tmp_path / "ray" / "episodes.jsonl").write_text(lines[0] + "\n")
    heisd(*run, "--out", tmp_path / "ray", "--ray", "--ray-workers", 1)
    assert_same_episodes(tmp_path / "ray", tmp_path / "local")
    assert (tmp_path / "ray" / "episodes.jsonl").read_text().splitlines()[0] == lines[0]
