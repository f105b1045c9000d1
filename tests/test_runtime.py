"""Policy, closed-loop eval (summary schema, determinism, resume) and offline replay."""

from __future__ import annotations

import json

import numpy as np
import pytest
from helpers import save_tiny_drafter, tiny_vla, write_demo_file

from heisd.benchmarks.mw import MetaWorldEnv, MWConfig
from heisd.errors import OutputError
from heisd.runtime.evaluation import EvalConfig, evaluate
from heisd.runtime.methods import MethodConfig, build_decoders
from heisd.runtime.metrics import BREAKDOWN_KEYS
from heisd.runtime.policy import VLAPolicy
from heisd.runtime.replay import replay

SUMMARY_KEYS = {"method", "benchmark", "episodes", "sr", "per_task", "latency_ms", "breakdown_ms",
                "target_forwards", "tokens_per_forward", "acceptance_length", "skip_rate", "retrieval_fraction"}


def ar_policy(vla=None) -> VLAPolicy:
    vla = vla or tiny_vla()
    return VLAPolicy(vla, build_decoders(MethodConfig("ar"), vla))


def test_step_record_breakdown_is_the_decode_timing(monkeypatch):
    """Each breakdown piece is the decode loop's own timing of it; vision is what ran before it."""
    policy = ar_policy()
    env = MetaWorldEnv("reach-v3", MWConfig(image_size=32))
    obs, info = env.reset(seed=0)
    policy.reset(env.instruction, env.task)
    decoder = policy.decoders.by_mode["drafter"]
    results, decode = [], decoder.decode
    monkeypatch.setattr(decoder, "decode", lambda *a, **k: results.append(decode(*a, **k)) or results[-1])
    actions, rec = policy.act(obs["image"], obs["state"], info["ee_pos"])
    timing = results[0].timing
    assert actions.shape == (2, 4) and np.abs(actions).max() <= 1.0 + 1e-6
    assert rec.tokens == results[0].tokens and rec.target_forwards == 8 == results[0].target_forwards
    assert rec.tokens_per_forward == 1.0 and set(rec.breakdown_ms) == set(BREAKDOWN_KEYS)
    assert rec.breakdown_ms["prefill"] == timing.prefill_ms > 0 and rec.breakdown_ms["verify"] == timing.verify_ms > 0
    assert rec.breakdown_ms["draft"] + rec.breakdown_ms["retrieval"] == pytest.approx(timing.draft_ms)
    assert rec.breakdown_ms["vision"] > 0 and rec.breakdown_ms["other"] >= timing.other_ms


def test_act_before_reset_is_refused():
    with pytest.raises(RuntimeError, match="reset"):
        ar_policy().act(np.zeros((32, 32, 3), np.uint8), np.zeros(7, np.float32))


def test_methods_without_their_resources_are_refused():
    with pytest.raises(ValueError, match="needs a drafter"):
        MethodConfig("specvla")
    with pytest.raises(ValueError, match="needs a datastore"):
        MethodConfig("retrieval")
    with pytest.raises(ValueError, match="unknown method"):
        MethodConfig("magic")


def test_eval_summary_determinism_and_resume(tmp_path):
    cfg = EvalConfig(tasks=("reach-v3", "push-v3"), episodes=2, seed=3, max_steps=8, image_size=32)
    vla = tiny_vla()
    full = evaluate(ar_policy(vla), "ar", cfg, tmp_path / "a", progress=False)
    assert SUMMARY_KEYS <= set(full)
    assert full["episodes"] == 4 and set(full["per_task"]) == {"reach-v3", "push-v3"}
    assert full["target_forwards"] == 8.0 and full["tokens_per_forward"] == 1.0
    lines = (tmp_path / "a" / "episodes.jsonl").read_text().splitlines()
    # episode by episode across the tasks: a run stopped part way holds the same episodes of every task
    assert [(json.loads(x)["task"], json.loads(x)["episode"]) for x in lines] == [
        ("reach-v3", 0), ("push-v3", 0), ("reach-v3", 1), ("push-v3", 1)]

    # an interrupted run: two finished episodes and a half-written third line
    (tmp_path / "b").mkdir()
    (tmp_path / "b" / "run.json").write_text((tmp_path / "a" / "run.json").read_text())
    (tmp_path / "b" / "episodes.jsonl").write_text("\n".join(lines[:2]) + "\n" + lines[2][:40])
    resumed = evaluate(ar_policy(vla), "ar", cfg, tmp_path / "b", progress=False)
    again = (tmp_path / "b" / "episodes.jsonl").read_text().splitlines()
    assert again[:2] == lines[:2] and len(again) == 4
    key = lambda line: {k: v for k, v in json.loads(line).items() if k != "steps"}  # noqa: E731
    assert [key(x) for x in again] == [key(x) for x in lines]  # same seeds, same episodes
    assert resumed["episodes"] == 4 and resumed["sr"] == full["sr"]

    with pytest.raises(OutputError, match=r"other settings \(episodes: 2 -> 1; tasks"):
        evaluate(ar_policy(vla), "ar", EvalConfig(("reach-v3",), 1, seed=3, max_steps=8, image_size=32),
                 tmp_path / "a", progress=False)


def test_replay_of_exact_speculative_decoding_matches_ar(tmp_path):
    """Replay compares a method with AR on the same frames: SpecVLA with exact acceptance is lossless."""
    write_demo_file(tmp_path / "d.hdf5", ["reach-v3", "push-v3"], episodes=1, steps=10)
    vla = tiny_vla()
    save_tiny_drafter(vla, tmp_path / "drafter", seed=0)
    specvla = VLAPolicy(vla, build_decoders(MethodConfig("specvla", drafter=str(tmp_path / "drafter")), vla))
    result = replay(specvla, ar_policy(vla), "specvla", [tmp_path / "d.hdf5"], frames=8, progress=False)
    assert result["frames"] == 8 and result["tasks"] == ["push-v3", "reach-v3"]
    assert result["token_mismatch_rate"] == 0.0 and result["max_bin_deviation"] == 0
    assert 1.0 <= result["tokens_per_forward"] <= 8.0 and result["target_forwards"] <= 8.0
    # a method that does change tokens is caught: relaxed acceptance with r = 255 keeps any draft
    relaxed = VLAPolicy(vla, build_decoders(MethodConfig("specvla-relaxed", drafter=str(tmp_path / "drafter"),
                                                         relaxed_r=255), vla))
    loose = replay(relaxed, ar_policy(vla), "specvla-relaxed", [tmp_path / "d.hdf5"], frames=8, progress=False)
    assert loose["token_mismatch_rate"] > 0.0 and loose["tokens_per_forward"] > result["tokens_per_forward"]


def test_replay_plan_interleaves_tasks_at_the_chunk_cadence_up_to_the_frame_count(tmp_path):
    """Whole episodes in turn, one task after the other; frames every `stride` steps; the last
    episode cut at `frames`. Demos 0-1 are reach-v3, 2-3 push-v3 (10 steps each)."""
    from heisd.runtime.replay import replay_plan

    path = tmp_path / "d.hdf5"
    write_demo_file(path, ["reach-v3", "push-v3"], episodes=2, steps=10)
    plan = replay_plan([path], frames=10, stride=4)
    assert plan == [(str(path), "demo_0", (0, 4, 8)), (str(path), "demo_2", (0, 4, 8)),
                    (str(path), "demo_1", (0, 4, 8)), (str(path), "demo_3", (0,))]
    assert replay_plan([path], frames=100, stride=4)[-1] == (str(path), "demo_3", (0, 4, 8))


def test_acceptance_length_and_rates_by_position_by_hand():
    """Two steps: passes (accepted, depth) = (2, 3), (0, 0: an AR pass), (1, 1), (3, 3); the AR
    pass drafted nothing, so AL = 1 + (2 + 1 + 3) / 3 = 3; depth 1 reached 3 times, accepted 3
    times; depth 2 reached twice (2 and 3 accepted); depth 3 twice, accepted once."""
    from heisd.runtime.metrics import acceptance_metrics

    steps = [{"accepted": [[2, 0], [1, 3]], "draft_depth": [[3, 0], [1, 3]]}]
    m = acceptance_metrics(steps)
    assert m["acceptance_length"] == 3.0 and m["drafted_passes"] == 3
    assert m["acceptance_rate_by_position"] == [1.0, 1.0, 0.5]
    ar = acceptance_metrics([{"accepted": [[0, 0]], "draft_depth": [[0, 0]]}])
    assert ar == {"acceptance_length": 1.0, "drafted_passes": 0, "acceptance_rate_by_position": []}


def test_gripper_switches_count_sign_changes_of_the_executed_gripper_command():
    """Steps of executed actions (chunks of 1 or 2) with grippers [-1, -1], [+1], [+1, 0], [-1], [+1]:
    three switches (a zero command is skipped, so +1, 0, -1 is one). The summary gives the medians per
    task and by outcome, and leaves them out for episodes recorded without their actions."""
    from heisd.runtime.metrics import gripper_switches, summarize

    actions = [[[0.1, -1.0], [0.0, -1.0]], [[0.2, 1.0]], [[0.0, 1.0], [0.0, 0.0]], [[0.0, -1.0]], [[0.0, 1.0]]]
    assert gripper_switches(actions) == 3 and gripper_switches([]) == 0
    assert gripper_switches([[[0.0, 0.5]], [[0.0, 0.9]]]) == 0

    def line(task, success, switch_actions):
        steps = {k: [v] for k, v in {"latency_ms": 1.0, "target_forwards": 7, "tokens_per_forward": 1.0,
                                     "skipped": False, "mode": "ar"}.items()}
        steps.update(breakdown_ms={k: [0.0] for k in BREAKDOWN_KEYS}, accepted=[[0]], draft_depth=[[0]])
        if switch_actions is not None:
            steps["actions"] = switch_actions
        return {"task": task, "success": success, "steps": steps}

    flips = lambda n: [[[0.0, (-1.0) ** k]] for k in range(n + 1)]  # noqa: E731
    s = summarize("ar", "libero_10", [line("a", True, flips(2)), line("a", False, flips(9)),
                                      line("b", False, flips(30)), line("b", False, None)])
    assert s["per_task"]["a"]["gripper_switches_median"] == 5.5
    assert s["per_task"]["b"]["gripper_switches_median"] == 30.0
    assert s["gripper_switches"] == {"median": 9.0, "successes_median": 2.0, "failures_median": 19.5}
    old = summarize("ar", "libero_10", [line("a", True, None)])
    assert "gripper_switches" not in old and "gripper_switches_median" not in old["per_task"]["a"]
