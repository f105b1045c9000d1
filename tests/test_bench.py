"""`heisd bench` end to end on a tiny configuration: every method, one report, the plots."""

from __future__ import annotations

import json

import pytest
from helpers import save_tiny_drafter, tiny_vla, write_demo_file

from heisd.commands.calibrate import calibrate
from heisd.retrieval import build_datastore, open_datastore
from heisd.runtime.bench import ladder, run_bench, write_report
from heisd.runtime.evaluation import EvalConfig
from heisd.runtime.methods import MethodConfig


@pytest.fixture(scope="module")
def resources(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("bench")
    vla = tiny_vla()
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
