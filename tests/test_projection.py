"""`heisd project`: a bench run's steps priced with a profile's per-piece costs, over the whole step
distribution, with the cost-based choices re-decided under those costs."""

from __future__ import annotations

import json

import numpy as np
import pytest

from heisd.cli import main
from heisd.kinematics import CostAwareSwitch, KinematicConfig, KinematicStats
from heisd.profiling.projection import PieceCosts, RecordedStep, distribution, price_recorded
from heisd.profiling.redecide import redecide
from heisd.runtime.passes import StepPasses, split_step


def profile(prefill=10.0, decode=3.0, tree8=4.0, tree32=6.0, drafter=0.5, query=0.25) -> dict:
    return {"target": "t", "device": "cpu", "device_name": "test", "dtype": "float32", "threads": 1,
            "spec": {"n_action_tokens": 8},
            "pieces_ms": {"vision": {"median_ms": 2.0}, "prefill": {"median_ms": prefill},
                          "decode_step": {"median_ms": decode},
                          "tree_verify": {"8": {"median_ms": tree8}, "32": {"median_ms": tree32}},
                          "drafter_pass": {"median_ms": drafter}, "datastore_query": {"median_ms": query}}}


PROFILE = profile()
COSTS = PieceCosts.from_profile(PROFILE)
CONFIG = {"method": "heisd", "switch": "cost", "tree_budget": 8, "tree_depth": 3, "retrieval_budget": 32,
          "retrieval_fallback": "cost", "drafter_tree": "fixed"}


def priced(mode, forwards, accepted, depths, sizes, fallback=(0, 0), option=None, config=CONFIG) -> float:
    step = split_step(mode, forwards, accepted, depths, sizes, fallback, option, config, 8)
    return COSTS.step(mode, step.prefill, step.passes(option), step.fused).total


def test_a_fused_step_prices_its_first_tree_inside_the_prefill() -> None:
    """Retrieval's first tree verified in the prefill pass: no pass of its own, only what its tokens add."""
    step = split_step("retrieval", 1, [7], [8], [20], (0, 0), None, CONFIG, 8)
    assert step.fused and step.head == ((20, 0),) and StepPasses.from_json(step.to_json()) == step
    cost = COSTS.step("retrieval", step.prefill, step.passes(None), step.fused)
    assert cost.forwards == 1 and cost.verify == 0.0 and cost.prefill == pytest.approx(10 + (5.0 - 3))
    # a rejection at position 3, then the AR fallback's 4 plain passes; the tokens left count from 0
    step = split_step("retrieval", 5, [3, 0, 0, 0, 0], [8, 0, 0, 0, 0], [20, 0, 0, 0, 0], (4, 4), "ar", CONFIG, 8)
    assert step.fused and step.tokens_left == 4
    assert priced("retrieval", 5, [3, 0, 0, 0, 0], [8, 0, 0, 0, 0], [20, 0, 0, 0, 0], (4, 4), "ar") == pytest.approx(
        2 + 0.25 + 10 + 2.0 + 4 * 3)
    with pytest.raises(ValueError, match="target passes"):
        split_step("retrieval", 2, [1, 1, 1], [8, 1, 1], [20, 1, 1], (0, 0), None, CONFIG, 8)
    # a profile that timed the fused prefill (a 32-node tree) prices the tree's share from it
    timed = PieceCosts.from_profile({**PROFILE, "fused_prefill_nodes": 32,
                                     "pieces_ms": {**PROFILE["pieces_ms"], "fused_prefill": {"median_ms": 12.0}}})
    assert timed.fused_extra(16) == pytest.approx(1.0) and COSTS.fused_extra(16) == pytest.approx(COSTS.verify(16) - 3)


def test_step_costs_by_hand() -> None:
    ar = {**CONFIG, "method": "ar"}
    assert priced("drafter", 8, [0] * 7, [0] * 7, [0] * 7, config=ar) == 2 + 10 + 7 * 3
    # drafter mode: 3 verify passes of an 8-node tree; drafter passes min(3, tokens left): 3, 3, then 1 left
    assert priced("drafter", 4, [2, 2, 0], [3, 3, 1], [8, 8, 1]) == pytest.approx(
        2 + 10 + 4 + 4 + (3 + 1 / 8) + (3 + 3 + 1) * 0.5)
    # retrieval: query, prefill, a 20-node group tree, then the AR fallback's two plain passes
    assert priced("retrieval", 4, [4, 0, 0], [5, 0, 0], [20, 0, 0], (2, 2), "ar") == pytest.approx(
        2 + 0.25 + 10 + 5.0 + 2 * 3)
    assert priced("retrieval", 0, [], [], [], (0, 0)) == 2 + 0.25  # a prefill skip: vision and the query only
    # the drafter as fallback runs the drafter: 2 levels with 2 tokens left
    assert priced("retrieval", 3, [4, 1], [5, 2], [20, 6], (1, 2), "drafter") == pytest.approx(
        2 + 0.25 + 10 + 5.0 + (3 + 6 / 8) + 2 * 0.5)
    assert priced("jacobi", 3, [4, 1], [7, 2], [7, 2], config={**CONFIG, "method": "jacobi"}) == pytest.approx(
        2 + 10 + (3 + 7 / 8) + (3 + 2 / 8))
    assert COSTS.verify(20) == pytest.approx(5.0) and COSTS.verify(64) == 6.0
    # a run recorded before sizes and fallback passes were kept: the configured budgets, the old split
    old = split_step("retrieval", 3, [3, 0], [5, 0], None, None, "ar", CONFIG, 8)
    assert old.head == ((32, 0),) and old.fallbacks == {"ar": ((0, 0),)} and old.tokens_left == 3


def test_whole_proposals_are_priced_where_profiled() -> None:
    """A drafter proposal costs more than its passes (it chooses the tree); a retrieval step builds a tree."""
    full = profile()
    full["pieces_ms"].update(drafter_proposal={"median_ms": 2.5}, retrieval_proposal={"median_ms": 0.75})
    full["drafter_tree"] = {"topk": 4, "depth": 3, "budget": 8}
    costs = PieceCosts.from_profile(full)
    assert costs.proposal(3) == 2.5 and costs.proposal(1) == 2.5 - 2 * 0.5
    step = split_step("drafter", 4, [3, 1, 0], [3, 3, 1], [8, 8, 1], (0, 0), None, CONFIG, 8)  # 3, 3, 1 levels
    assert costs.step("drafter", True, step.passes(None)).total == pytest.approx(
        2 + 10 + (4 + 4 + 3.125) + (2.5 + 2.5 + 1.5))
    assert costs.step("retrieval", True, ((32, 0),)).total == 2 + 0.75 + 10 + 6
    assert costs.step("retrieval", False, ()).total == 2 + 0.25  # a prefill skip built no tree


def test_the_mean_sees_the_tail_the_median_does_not() -> None:
    """A fifth of the steps in drafter mode, each dear: the median step is a retrieval step, the mean is not."""
    steps = [RecordedStep("retrieval", StepPasses(True, ((32, 0),)), None, 0.0, None)] * 8
    steps += [RecordedStep("drafter", StepPasses(True, ((8, 3),) * 5), None, 0.0, None)] * 2
    d = distribution(price_recorded(steps, COSTS))
    retrieval, drafter = 2 + 0.25 + 10 + 6, 2 + 10 + 5 * (4 + 1.5)
    assert d["median_ms"] == retrieval and d["modes"] == {"drafter": 2, "retrieval": 8}
    assert d["mean_ms"] == pytest.approx(0.8 * retrieval + 0.2 * drafter) and d["mean_ms"] > 1.2 * d["median_ms"]


# ----- re-deciding: the cost switch and the cost fallback under another device's costs -----
KIN = KinematicConfig()
STATS = KinematicStats(r_min=0.0, r_p95=1.0, d_min=0.0, d_p95=1.0, window=KIN.window, r_cap=KIN.r_cap, n_windows=10)
GPU = PieceCosts.from_profile(profile(prefill=1.5, decode=1.0, tree8=1.05, tree32=1.2, drafter=0.05, query=0.1))
# CPU-like: a drafter pass dearer than a decode step (OpenVLA-7B on a CPU, the case)
CPU = PieceCosts.from_profile(profile(prefill=4.0, decode=0.9, tree8=1.7, tree32=3.3, drafter=2.0, query=0.04))


def _switch() -> CostAwareSwitch:
    """Calibration as the options below: slow motion (F < 0.5) needs 5 passes in retrieval mode (the
    prefill, a group tree, 3 Jacobi chains), fast motion 2; the drafter 3."""
    f = np.linspace(0.0, 1.0, 40)
    frames = {"F": f.tolist(), "tokens_per_forward_retrieval": np.where(f >= 0.5, 4.0, 8 / 5).tolist(),
              "tokens_per_forward_drafter": [8 / 3] * 40}
    return CostAwareSwitch(KIN, STATS, frames, n_tokens=8)


def _option_step(metric: float) -> RecordedStep:
    """A recorded step with its options, recorded in retrieval mode (as a CPU run records them)."""
    slow = metric < 0.5
    retrieval = StepPasses(True, ((20, 0),), 4, {"ar": ((0, 0),) * 4, "jacobi": ((4, 0), (2, 0), (1, 0)),
                                                  "drafter": ((8, 3), (1, 1))}) if slow \
        else StepPasses(True, ((32, 0),))
    drafter = StepPasses(True, ((8, 3), (8, 3)))
    options = {"F": metric, "retrieval": retrieval.to_json(), "drafter": drafter.to_json()}
    return RecordedStep("retrieval", retrieval, "jacobi" if slow else None, 0.0, options)


STEPS = [_option_step(f) for f in np.tile([0.1, 0.2, 0.8, 0.9], 30)]


def test_a_nearly_free_drafter_moves_slow_motion_to_the_drafter() -> None:
    out = redecide(STEPS, CONFIG, GPU, _switch(), 8)
    late = out[8:]  # after each mode's first tries
    assert all(p.mode == "drafter" for p, s in zip(late, STEPS[8:], strict=True) if s.options["F"] < 0.5)
    assert all(p.mode == "retrieval" for p, s in zip(late, STEPS[8:], strict=True) if s.options["F"] >= 0.5)
    # and it is cheaper than keeping the recorded choices on that device
    assert np.mean([p.ms for p in out]) < np.mean([p.ms for p in price_recorded(STEPS, GPU)])


def test_cpu_like_costs_keep_retrieval() -> None:
    out = redecide(STEPS, CONFIG, CPU, _switch(), 8)
    assert [p.mode for p in out].count("drafter") <= 1  # the one try of an unmeasured mode
    assert all(p.mode == "retrieval" for p in out[2:])


@pytest.mark.parametrize("costs, best", [(GPU, "drafter"), (CPU, "jacobi")])
def test_the_fallback_is_re_decided(costs, best) -> None:
    """Retrieval alone (no switch): after each fallback's first try, the cheapest on the device.
    The drafter finishes the 4 tokens in 2 passes, Jacobi in 3, AR in 4: with a nearly free drafter
    pass (2.3 ms against 3.0 and 4.0) the drafter; with a drafter pass dearer than a decode step
    (10.7 ms against 3.4 and 3.6) Jacobi."""
    retrieval = {**CONFIG, "method": "retrieval"}
    slow = [s for s in STEPS if s.options["F"] < 0.5]
    out = redecide(slow, retrieval, costs, None, 8)
    assert [p.fallback for p in out[:3]] == ["ar", "jacobi", "drafter"]  # each option tried once first
    assert {p.fallback for p in out[3:]} == {best}
    assert all(p.mode == "retrieval" for p in out)


def test_project_a_bench_directory(tmp_path, capsys) -> None:
    """AR and a retrieval run with its options: both projections, the re-decided fallback mix."""
    def method(name, label, steps: list[dict], fallback="cost"):
        (tmp_path / label).mkdir()
        columns = {k: [s[k] for s in steps] for k in steps[0]}
        columns["latency_ms"] = [10.0] * len(steps)
        (tmp_path / label / "episodes.jsonl").write_text(json.dumps({"steps": columns}) + "\n")
        return {"method": label, "dir": label, "config": {**CONFIG, "method": name, "retrieval_fallback": fallback}}

    ar_step = {"mode": "drafter", "target_forwards": 8, "accepted": [0] * 7, "draft_depth": [0] * 7,
               "draft_size": [0] * 7, "fallback": [0, 0], "choices": []}
    slow = _option_step(0.1)
    r_step = {"mode": "retrieval", "target_forwards": 5, "accepted": [2, 0, 0, 1], "draft_depth": [5, 4, 2, 1],
              "draft_size": [20, 4, 2, 1], "fallback": [3, 4], "choices": [["fallback", "jacobi", 1.0, 1.0, 4]],
              "options": slow.options}
    bench = [method("ar", "ar", [ar_step] * 3), method("retrieval", "retrieval", [r_step] * 12)]
    (tmp_path / "bench.json").write_text(json.dumps(bench))
    gpu = profile(prefill=1.5, decode=1.0, tree8=1.05, tree32=1.2, drafter=0.05, query=0.1)
    (tmp_path / "profile.json").write_text(json.dumps(gpu))
    assert main(["project", "--bench", str(tmp_path), "--profile", str(tmp_path / "profile.json"),
                 "--out", str(tmp_path / "p.json")]) == 0
    rows = json.loads((tmp_path / "p.json").read_text())["rows"]
    assert rows[0]["recorded"]["median_ms"] == 2 + 1.5 + 7 and rows[0]["redecided_what"] == []
    assert rows[1]["measured"]["fallbacks"] == {"jacobi": 12} and rows[1]["recorded"]["fallbacks"] == {"jacobi": 12}
    assert rows[1]["redecided_what"] == ["fallback"]
    assert rows[1]["redecided"]["fallbacks"] == {"ar": 1, "drafter": 10, "jacobi": 1}
    assert rows[1]["redecided"]["mean_ms"] < rows[1]["recorded"]["mean_ms"]
    assert rows[1]["recorded"]["speedup"] == pytest.approx(rows[0]["recorded"]["median_ms"]
                                                           / rows[1]["recorded"]["median_ms"])
    out = capsys.readouterr().out
    assert "PROJECTION" in out and "RE-DECIDED" in out and "drafter 10" in out
    again = ["project", "--bench", str(tmp_path), "--profile", str(tmp_path / "profile.json"), "--out",
             str(tmp_path / "p.json")]
    assert main(again) == 1 and "p.json already holds a heisd projection" in capsys.readouterr().err
    assert main([*again, "--overwrite", "--compare", str(tmp_path)]) == 0  # beside a run "measured there"
    rows = json.loads((tmp_path / "p.json").read_text())["rows"]
    assert rows[1]["there"]["speedup"] == 1.0  # every measured step took 10 ms
    assert rows[1]["speedup_error"]["redecided"]["speedup"] == pytest.approx(rows[1]["redecided"]["speedup"] - 1)
    assert "CHECK against the run measured" in capsys.readouterr().out
    partial = {**gpu, "pieces_ms": {k: v for k, v in gpu["pieces_ms"].items() if k != "datastore_query"}}
    (tmp_path / "partial.json").write_text(json.dumps(partial))
    with pytest.raises(SystemExit, match="datastore_query"):
        main(["project", "--bench", str(tmp_path), "--profile", str(tmp_path / "partial.json")])
    # the query runs on the host: a device profile without one takes the bench host's (source) query
    host = profile(query=0.75)
    (tmp_path / "host.json").write_text(json.dumps(host))
    assert main(["project", "--bench", str(tmp_path), "--profile", str(tmp_path / "partial.json"), "--source-profile",
                 str(tmp_path / "host.json"), "--out", str(tmp_path / "p.json"), "--overwrite"]) == 0
    written = json.loads((tmp_path / "p.json").read_text())
    out = capsys.readouterr().out
    assert written["host_pieces_from_source"] and "priced as --source-profile measured them" in out
    assert written["bench_target"] is None and "bench's target" not in out  # no run.json: nothing to say
    (tmp_path / "ar" / "run.json").write_text(json.dumps({"paths": {"target": "checkpoints/libero_object/vla"}}))
    assert main(["project", "--bench", str(tmp_path), "--profile", str(tmp_path / "profile.json")]) == 0
    assert ("from the bench's target checkpoints/libero_object/vla; costs of the profile's t."
            in capsys.readouterr().out)
    borrowed = written["rows"][1]["recorded"]
    assert borrowed["mean_ms"] == pytest.approx(rows[1]["recorded"]["mean_ms"] + 0.75 - 0.1)
    assert PieceCosts.from_profile(gpu).with_host_pieces(PieceCosts.from_profile(host)).query == 0.1  # its own kept


def test_without_options_nothing_is_re_decided(tmp_path) -> None:
    ar = {"mode": "drafter", "target_forwards": 1, "accepted": [], "draft_depth": [], "latency_ms": 1.0}
    r = {"mode": "retrieval", "target_forwards": 1, "accepted": [], "draft_depth": [], "latency_ms": 1.0}
    for label, step in (("ar", ar), ("heisd", r)):
        (tmp_path / label).mkdir()
        (tmp_path / label / "episodes.jsonl").write_text(json.dumps({"steps": {k: [v] for k, v in step.items()}}))
    bench = [{"method": m, "dir": m, "config": {**CONFIG, "method": m}} for m in ("ar", "heisd")]
    (tmp_path / "bench.json").write_text(json.dumps(bench))
    from heisd.profiling.projection import project_bench

    rows = project_bench(tmp_path, PROFILE)
    assert rows[1]["redecided"] is None and "--record-options" in rows[1]["not_redecided"]
    assert isinstance(rows[1]["recorded"]["median_ms"], float)



# ----- the options a bench records (`--record-options`), end to end on a tiny target -----
@pytest.fixture(scope="module")
def recorded_bench(tmp_path_factory):
    from dataclasses import replace

    from helpers import save_tiny_drafter, tiny_vla, write_demo_file

    from heisd.commands.calibrate import calibrate
    from heisd.retrieval import build_datastore, open_datastore
    from heisd.runtime.bench import run_bench
    from heisd.runtime.evaluation import EvalConfig
    from heisd.runtime.methods import MethodConfig

    tmp = tmp_path_factory.mktemp("options")
    vla = tiny_vla()
    save_tiny_drafter(vla, tmp / "drafter")
    write_demo_file(tmp / "demos.hdf5", ["reach-v3"], episodes=2, steps=20)
    build_datastore(vla, [tmp / "demos.hdf5"], tmp / "datastore")
    write_demo_file(tmp / "heldout.hdf5", ["reach-v3"], episodes=1, steps=24)
    # drafts from the demonstrator's actions, which an untrained target disagrees with: fallbacks run
    base = MethodConfig("heisd", drafter=str(tmp / "drafter"), datastore=str(tmp / "datastore"), payload="demo")
    calibrate(vla, open_datastore(tmp / "datastore", vla), [tmp / "heldout.hdf5"],
              replace(base, verify_skip=False, prefill_skip=False), n_frames=24)
    configs = [replace(base, method="ar"), replace(base, method="retrieval", lossless=True),
               replace(base, lossless=True), base]
    cfg = EvalConfig(("reach-v3",), episodes=1, seed=0, max_steps=24, image_size=32)
    summaries = run_bench(vla, configs, cfg, tmp / "bench", progress=False, record_options=True)
    return tmp, summaries


def test_recorded_options_leave_the_episode_alone(recorded_bench) -> None:
    tmp, summaries = recorded_bench
    episode = lambda i: json.loads((tmp / "bench" / summaries[i]["dir"] / "episodes.jsonl").read_text())  # noqa: E731
    ar = episode(0)["steps"]
    assert "options" not in ar  # AR chooses nothing by cost
    for i in (1, 2):  # lossless: AR's tokens whatever the recorder decoded beside them
        assert episode(i)["steps"]["ee_pos"] == ar["ee_pos"]
    heisd = episode(3)["steps"]
    columns = (heisd["mode"], heisd["options"], heisd["fallback"], heisd["choices"])
    for mode, options, fallback, choices in zip(*columns, strict=True):
        assert set(options) == {"F", "drafter", "retrieval"}
        retrieval = StepPasses.from_json(options["retrieval"])
        if retrieval.tokens_left:  # every fallback on the same frame, the same tokens left
            assert set(retrieval.fallbacks) == {"ar", "jacobi", "drafter"}
            assert retrieval.fallbacks["ar"] == ((0, 0),) * retrieval.tokens_left
            assert all(1 <= len(p) <= retrieval.tokens_left for p in retrieval.fallbacks.values())
        if mode == "retrieval":  # the live step is one of its own options
            assert retrieval.tokens_left == fallback[1]
            ran = next((c[1] for c in choices if c[0] == "fallback"), None)
            if ran is not None:
                assert len(retrieval.fallbacks[ran]) == fallback[0]
    assert any(StepPasses.from_json(o["retrieval"]).tokens_left for o in heisd["options"])


def test_project_re_decides_a_recorded_bench(recorded_bench, tmp_path) -> None:
    tmp, summaries = recorded_bench
    gpu = profile(prefill=1.5, decode=1.0, tree8=1.05, tree32=1.2, drafter=0.05, query=0.1)
    (tmp_path / "gpu.json").write_text(json.dumps(gpu))
    assert main(["project", "--bench", str(tmp / "bench"), "--profile", str(tmp_path / "gpu.json"),
                 "--datastore", str(tmp / "datastore"), "--out", str(tmp_path / "p.json")]) == 0
    rows = json.loads((tmp_path / "p.json").read_text())["rows"]
    assert [r["redecided_what"] for r in rows] == [[], ["fallback"], ["mode", "fallback"], ["mode", "fallback"]]
    for row in rows:
        d = row["redecided"]
        assert sum(d["modes"].values()) == row["steps"] and d["mean_ms"] > 0 and d["speedup"] > 0


# ----- host time: the run's measured time outside the profiled pieces, carried over per step -----
def test_host_time_is_added_per_step_and_carried_unchanged() -> None:
    """Each step's projection is its priced pieces plus its own measured host time, under any profile."""
    hosts = [0.5, 1.0, 3.0]
    steps = [RecordedStep("retrieval", StepPasses(True, ((32, 0),)), None, 0.0, None, h) for h in hosts]
    bare = 2 + 0.25 + 10 + 6
    for costs in (COSTS, GPU):
        out = price_recorded(steps, costs)
        priced_alone = costs.step("retrieval", True, ((32, 0),)).total
        assert [p.ms for p in out] == pytest.approx([priced_alone + h for h in hosts])
        assert [p.host_ms for p in out] == hosts  # the same milliseconds whatever the device
    d = distribution(price_recorded(steps, COSTS))
    assert d["median_ms"] == pytest.approx(bare + 1.0) and d["host_median_ms"] == 1.0
    assert d["host_mean_ms"] == pytest.approx(1.5)
    # re-decided steps keep their own host time too
    steps = [RecordedStep(s.mode, s.passes, s.fallback, 0.0, s.options, 2.0) for s in STEPS]
    assert all(p.host_ms == 2.0 for p in redecide(steps, CONFIG, GPU, _switch(), 8))


def test_host_time_is_other_plus_the_vision_column_beyond_the_profiled_pass() -> None:
    from heisd.profiling.projection import host_ms

    steps = {"breakdown_ms": {"other": [0.5, 0.7], "vision": [3.5, 1.0]}}
    assert host_ms(steps, 2) == [0.5, 0.7]  # without the run's own profile: `other` alone
    assert host_ms(steps, 2, source_vision_ms=2.0) == pytest.approx([2.0, 0.7])  # never below 0
    assert host_ms({}, 2) == [0.0, 0.0]  # an older run kept no breakdown


def test_a_run_with_more_host_time_projects_a_slower_method(tmp_path, capsys) -> None:
    """Two methods with the same passes, one with a larger measured 'other' (and vision column):
    the projection carries the difference over, and the table shows it in its own column."""
    step = {"mode": "drafter", "target_forwards": 8, "accepted": [0] * 7, "draft_depth": [0] * 7,
            "draft_size": [0] * 7, "fallback": [0, 0], "choices": [], "latency_ms": 20.0}
    bench = []
    for label, other, vision in (("ar", 0.5, 2.0), ("slow", 2.5, 3.0)):
        (tmp_path / label).mkdir()
        columns = {k: [v] * 4 for k, v in step.items()}
        columns["breakdown_ms"] = {"other": [other] * 4, "vision": [vision] * 4}
        (tmp_path / label / "episodes.jsonl").write_text(json.dumps({"steps": columns}) + "\n")
        bench.append({"method": label, "dir": label, "config": {**CONFIG, "method": "ar"}})
    (tmp_path / "bench.json").write_text(json.dumps(bench))
    from heisd.profiling.projection import format_projection, project_bench

    rows = project_bench(tmp_path, PROFILE)
    assert rows[1]["recorded"]["median_ms"] - rows[0]["recorded"]["median_ms"] == pytest.approx(2.0)
    assert rows[1]["recorded"]["speedup"] < 1.0 and rows[1]["recorded"]["host_median_ms"] == 2.5
    rows = project_bench(tmp_path, PROFILE, source_profile=PROFILE)  # vision profiled at 2.0 there
    assert rows[1]["recorded"]["host_median_ms"] == pytest.approx(3.5)
    assert rows[1]["recorded"]["median_ms"] - rows[0]["recorded"]["median_ms"] == pytest.approx(3.0)
    assert "| host median / mean ms |" in format_projection(rows, PROFILE)
    (tmp_path / "p.json").write_text(json.dumps(PROFILE))
    assert main(["project", "--bench", str(tmp_path), "--profile", str(tmp_path / "p.json"),
                 "--source-profile", str(tmp_path / "p.json")]) == 0
    assert "| 3.50 / 3.50 |" in capsys.readouterr().out
