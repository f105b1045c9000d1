"""`heisd bench` end to end on a tiny configuration: every method, one report, the plots."""

from __future__ import annotations

import json
import shutil
from dataclasses import replace

import pytest
from helpers import save_tiny_drafter, tiny_vla, write_demo_file

from heisd.cli import main
from heisd.commands.calibrate import calibrate
from heisd.errors import InputError
from heisd.retrieval.manifest import DatastoreError, read_manifest
from heisd.retrieval import Datastore, build_datastore, open_datastore
from heisd.runtime import tolerance
from heisd.runtime.bench import ladder, run_bench, write_report
from heisd.runtime.evaluation import EvalConfig
from heisd.runtime.methods import MethodConfig


@pytest.fixture(scope="module")
def resources(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("bench")
    vla = tiny_vla()
    vla.save_pretrained(tmp / "vla")
    save_tiny_drafter(vla, tmp / "drafter")
    write_demo_file(tmp / "demos.hdf5", ["reach-v3", "drawer-close-v3"], episodes=2, steps=20)
    build_datastore(vla, [tmp / "demos.hdf5"], tmp / "datastore")
    write_demo_file(tmp / "heldout.hdf5", ["reach-v3"], episodes=1, steps=24)
    method = MethodConfig("heisd", drafter=str(tmp / "drafter"), datastore=str(tmp / "datastore"),
                          verify_skip=False, prefill_skip=False)
    calibrate(vla, open_datastore(tmp / "datastore", vla), [tmp / "heldout.hdf5"], method, n_frames=24)
    return vla, tmp


def test_bench_quick_smoke(resources):
    vla, tmp = resources
    # threshold 0: retrieval mode whenever the kinematic window exists
    base = MethodConfig("heisd", drafter=str(tmp / "drafter"), datastore=str(tmp / "datastore"),
                        switch_threshold=0.0)
    configs = ladder(base)
    labels = [c.label for c in configs]
    assert labels == ["ar", "jacobi", "specvla", "specvla-relaxed", "retrieval", "retrieval+lossless",
                      "heisd+lossless+threshold@0", "heisd+no-group+no-prefill-skip+threshold@0",
                      "heisd+no-prefill-skip+tol:paper+threshold@0", "heisd+tol:paper+threshold@0",
                      "heisd+lossless", "heisd", "retrieval+ar-fallback", "heisd+ar-fallback", "heisd+cost-tree",
                      "heisd+tol:paper", "heisd+fuse"]
    # 24 env steps: the kinematic window (15) fills, so heisd runs retrieval mode too
    cfg = EvalConfig(("reach-v3",), episodes=1, seed=0, max_steps=24, image_size=32)
    out = tmp / "out"
    manifest = (tmp / "datastore" / "manifest.json").read_bytes()
    summaries = run_bench(vla, configs, cfg, out, progress=False)
    assert (tmp / "datastore" / "manifest.json").read_bytes() == manifest  # read-only at run time
    assert all((out / s["dir"] / "run.json").is_file() for s in summaries)
    assert [s["method"] for s in summaries] == labels
    assert summaries[0]["speedup"] == 1.0
    ar_latency = summaries[0]["latency_ms"]["median"]
    for s in summaries:
        assert s["episodes"] == 1 and s["speedup"] == pytest.approx(ar_latency / s["latency_ms"]["median"])
    # lossless configurations act exactly as AR does: the same path, step for step
    episode = lambda i: json.loads((out / summaries[i]["dir"] / "episodes.jsonl").read_text())  # noqa: E731
    assert "retrieval" in episode(6)["steps"]["mode"]
    for lossless in (1, 2, 5, 6, 10):  # jacobi, specvla (exact), retrieval and heisd lossless
        assert episode(lossless)["steps"]["ee_pos"] == episode(0)["steps"]["ee_pos"]
        assert episode(lossless)["env_steps"] == episode(0)["env_steps"]
    assert summaries[4]["retrieval_fraction"] == 1.0  # retrieval SD everywhere
    assert summaries[0]["tokens_per_forward"] == summaries[0]["acceptance_length"] == 1.0  # AR
    report = write_report(summaries, out, "heisd bench --quick", cfg)
    text = report.read_text()
    for label in labels:
        assert f"| {label} |" in text
    assert "## Switch decisions" in text and summaries[labels.index("heisd")]["switch"]["predicted_steps"] > 0
    assert json.loads((out / "bench.json").read_text())[0]["method"] == "ar"
    for plot in ("pareto.png", "acceptance.png", "heisd_episode_modes.png"):
        assert (out / plot).stat().st_size > 0


def test_bench_needs_ar_first(resources):
    vla, tmp = resources
    with pytest.raises(ValueError, match="first configuration must be AR"):
        run_bench(vla, [MethodConfig("specvla", drafter=str(tmp / "drafter"))],
                  EvalConfig(("reach-v3",), 1), tmp / "x", progress=False)


def test_kinematic_window_counts_env_steps(resources):
    """The switch's window holds env-step positions (as the demonstration statistics do), so with
    2 actions per inference it fills after 8 inferences, not 15."""
    import numpy as np

    from heisd.runtime.methods import build_decoders
    from heisd.runtime.policy import VLAPolicy

    vla, tmp = resources
    cfg = MethodConfig("heisd", drafter=str(tmp / "drafter"), datastore=str(tmp / "datastore"), switch="threshold",
                       switch_threshold=0.3)
    policy = VLAPolicy(vla, build_decoders(cfg, vla))
    policy.reset("reach the red target with the gripper", "reach-v3")
    image, state = np.zeros((16, 16, 3), np.uint8), np.zeros(7, np.float32)
    path = [np.array([0.0, 0.6, 0.2]) + 0.01 * i * np.array([1.0, 0.5, 0.0]) for i in range(15)]
    metrics = [policy.act(image, state, path[:1])[1].metric]
    metrics += [policy.act(image, state, path[i : i + 2])[1].metric for i in range(1, 15, 2)]
    assert metrics[:-1] == [None] * 7 and metrics[-1] is not None  # 1 + 7 x 2 = 15 positions


def bench_argv(tmp, out, *extra: str) -> list[str]:
    return ["bench", "--target", str(tmp / "vla"), "--drafter", str(tmp / "drafter"), "--datastore",
            str(tmp / "datastore"), "--tasks", "reach-v3", "--episodes", "1", "--max-steps", "8",
            "--only", "heisd", "heisd+tol:scale=0", "--tolerances", "scale=0", "--persist-tolerance",
            "--out", str(out), *extra]


def test_persist_tolerance_chooses_on_layouts_the_evaluation_never_uses(resources, capsys):
    _, tmp = resources
    assert main(bench_argv(tmp, tmp / "t0", "--seed", "0")) == 2
    assert "--persist-tolerance on mw needs a --seed other than the evaluation's" in capsys.readouterr().err
    assert main(bench_argv(tmp, tmp / "t1", "--seed", "1", "--only", "specvla")) == 2
    assert "no full heisd run to choose from" in capsys.readouterr().err
    libero = ["--benchmark", "libero_object", "--tasks", "all", "--seed", "1"]
    assert main(bench_argv(tmp, tmp / "t2", *libero)) == 2
    assert "--persist-tolerance on LIBERO needs --sampled-layouts" in capsys.readouterr().err
    assert not any((tmp / t).exists() for t in ("t0", "t1", "t2"))  # refused before anything ran


def test_persist_tolerance_needs_a_success_to_keep(resources, capsys):
    """The tiny target never succeeds: the run is kept and reported, nothing is stored."""
    _, tmp = resources
    manifest = (tmp / "datastore" / "manifest.json").read_bytes()
    assert main(bench_argv(tmp, tmp / "t", "--seed", "1")) == 1
    assert "AR succeeded in no episode" in capsys.readouterr().err
    assert (tmp / "datastore" / "manifest.json").read_bytes() == manifest
    bench = json.loads((tmp / "t" / "bench.json").read_text())
    assert [s["method"] for s in bench] == ["ar", "heisd", "heisd+tol:scale=0"]


def test_the_stored_tolerance_is_the_fastest_that_kept_ars_successes_and_the_default(resources, tmp_path, capsys):
    _, tmp = resources
    store = tmp_path / "store"
    shutil.copytree(tmp / "datastore", store)
    tried = [tolerance.Candidate("scale=0.5,floor=2", 2, 4, 1, 1.5),
             tolerance.Candidate("scale=0.1,floor=1", 3, 4, 1, 1.3),
             tolerance.Candidate("scale=0.2,floor=1", 3, 4, 0, 1.2),
             tolerance.Candidate("scale=0", 4, 4, 0, 1.1)]
    # AR's count kept, then the fewest of AR's episodes lost (a trade at an equal count loses), then speed
    assert tolerance.choose(3, tried) == tried[2]
    assert tolerance.choose(4, tried) == tried[3]
    with pytest.raises(InputError, match="AR succeeded in no episode"):
        tolerance.choose(0, tried)
    files = read_manifest(store)["files"]
    with pytest.raises(InputError, match=r"no candidate tolerance kept AR's 5 successes \(scale=0.5,floor=2 2/4, .*"
                                         r"nothing was stored"):
        tolerance.persist(store, files, 5, tried, {})
    with pytest.raises(DatastoreError, match="rebuilt since it was loaded"):
        tolerance.persist(store, {}, 3, tried, {})
    assert tolerance.stored(store) is None
    Datastore.load(store).update_extras({"tolerance": {"tolerance": "scale=lots"}})
    with pytest.raises(DatastoreError, match="extras 'tolerance' holds no usable tolerance"):
        tolerance.stored(store)
    Datastore.load(store).update_extras({"tolerance": None})
    record = tolerance.persist(store, files, 3, tried, {"episodes": 4})
    assert record["tolerance"] == tolerance.stored(store)
    assert record["tolerance"] == "scale=0.2,floor=1"
    assert record["candidates"][0] == {"tolerance": "scale=0.5,floor=2", "successes": 2, "episodes": 4, "lost": 1,
                                       "speedup": 1.5}

    def run_tolerance(out, *extra):
        argv = ["eval", "--method", "heisd", "--target", str(tmp / "vla"), "--drafter", str(tmp / "drafter"),
                "--datastore", str(store), "--tasks", "reach-v3", "--episodes", "1", "--max-steps", "2",
                "--out", str(tmp_path / out), *extra]
        assert main(argv) == 0
        return json.loads((tmp_path / out / "run.json").read_text())["method_config"]["tolerance"]

    assert run_tolerance("stored") == "scale=0.2,floor=1"  # the datastore's, unasked
    assert run_tolerance("given", "--tolerance", "paper") == "paper"  # a flag wins


def test_candidates_count_the_episodes_ar_won_that_they_lost(tmp_path):
    """A run that trades one of AR's successes for another keeps AR's count but loses one."""
    full = MethodConfig("heisd", drafter="d", datastore="s")
    configs = [MethodConfig("ar"), full, replace(full, tolerance="scale=0")]
    won = {"ar": [1, 1, 0], "heisd": [1, 0, 1], "exact": [1, 1, 0]}
    for name, successes in won.items():
        (tmp_path / name).mkdir()
        lines = [json.dumps({"task": "reach-v3", "episode": i, "success": bool(ok)}) for i, ok in enumerate(successes)]
        (tmp_path / name / "episodes.jsonl").write_text("".join(line + "\n" for line in lines))
    summaries = [{"dir": name, "sr": sum(v) / 3, "episodes": 3, "speedup": speed}
                 for (name, v), speed in zip(won.items(), (1.0, 1.6, 1.4), strict=True)]
    ar_successes, found = tolerance.scored(configs, summaries, full, tmp_path)
    assert ar_successes == 2
    assert found == [tolerance.Candidate("scale=0.5,floor=2", 2, 3, 1, 1.6),
                     tolerance.Candidate("scale=0", 2, 3, 0, 1.4)]
    assert tolerance.choose(2, found).tolerance == "scale=0"
