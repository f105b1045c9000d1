"""build-datastore and calibrate on a tiny random VLA and a synthetic demonstration file.

The helpers here (tiny_vla, write_demos, the `built` fixture) are shared by the other
test_retrieval_* modules.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import faiss
import h5py
import helpers
import numpy as np
import pytest
import torch

from heisd.cli import main
from heisd.data.dataset import DemoFile
from heisd.decoding import DecodeConfig, SpeculativeDecoder, Verifier
from heisd.kinematics import KinematicConfig, KinematicStats
from heisd.retrieval import DatastoreError
from heisd.retrieval.build import KINEMATIC_STATS_KEY, demo_tokens, encode_frames, open_datastore
from heisd.targets.vla import VLA
from heisd.targets.vla.frames import chunk_targets

torch.set_num_threads(1)
faiss.omp_set_num_threads(1)

INSTRUCTIONS = {"reach": "reach the goal", "push": "push the puck to the goal"}
EPISODES, STEPS = 4, 18  # 18 >= the kinematic window (15)


def tiny_vla(seed: int = 0) -> VLA:
    return helpers.tiny_vla(seed, list(INSTRUCTIONS.values()))


def write_demos(path: Path, episodes: int = EPISODES, steps: int = STEPS, seed: int = 0,
                tasks: tuple[str, ...] = ("reach", "push"), failed: tuple[int, ...] = ()) -> None:
    """A bright square moving across the frame (every frame distinct); actions follow it."""
    rng = np.random.default_rng(seed)
    with h5py.File(path, "w") as f:
        data = f.create_group("data")
        data.attrs["benchmark"] = "mw"
        for i in range(episodes):
            task = tasks[i % len(tasks)]
            images = rng.integers(0, 40, size=(steps, 32, 32, 3), dtype=np.uint8)
            row = int(rng.integers(0, 20))
            for t in range(steps):
                images[t, row : row + 6, t : t + 6] = 255
            actions = rng.uniform(-1, 1, size=(steps, 4)).astype(np.float32)
            actions[:, 3] = np.where(np.arange(steps) < steps // 2, -1.0, 1.0)
            ee = np.cumsum(rng.normal(0, 0.01, size=(steps, 3)), axis=0).astype(np.float32)
            g = data.create_group(f"demo_{i}")
            g.attrs.update({"task": task, "instruction": INSTRUCTIONS[task], "success": i not in failed})
            g.create_dataset("actions", data=actions)
            g.create_dataset("obs/agentview_rgb", data=images)
            g.create_dataset("obs/ee_pos", data=ee)
            g.create_dataset("obs/gripper_states", data=rng.uniform(size=(steps, 1)).astype(np.float32))
            g.create_dataset("obs/goal_pos", data=np.repeat(rng.normal(0, 0.1, (1, 3)), steps, 0).astype(np.float32))


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> dict:
    """A tiny target checkpoint, a demo file and the datastore built from it with the CLI."""
    root = tmp_path_factory.mktemp("retrieval")
    vla = tiny_vla()
    vla.save_pretrained(root / "target")
    write_demos(root / "demos.hdf5", failed=(3,))
    rc = main(["build-datastore", "--target", str(root / "target"), "--demos", str(root / "demos.hdf5"),
               "--out", str(root / "store"), "--batch-size", "7", "--threads", "1"])
    assert rc == 0
    return {"root": root, "vla": VLA.from_pretrained(root / "target"), "store": root / "store",
            "demos": root / "demos.hdf5"}


def test_build_round_trip(built) -> None:
    vla, store = built["vla"], open_datastore(built["store"], built["vla"])
    # episode 3 failed: 3 episodes kept, batches of 7 over 18 steps
    assert len(store) == 3 * STEPS and store.tasks == ("reach", "push")
    assert store.extras["build"]["dropped_failed"] == 1
    with DemoFile(built["demos"]) as f:
        episodes = [ep for ep in f if ep.success]
    for e, ep in enumerate(episodes):
        rows = np.flatnonzero(store.episode == e)
        assert store.step[rows].tolist() == list(range(STEPS))
        np.testing.assert_allclose(store.ee_pos[rows], ep.ee_pos)
        # demonstrator tokens: step t holds the chunks of steps t..t+3, last action repeated
        ids = vla.action_tokenizer.encode(chunk_targets(ep.actions, 2)).reshape(STEPS, 8)
        assert (store.tokens[rows][:, 0] == ids).all() and (store.tokens[rows][-1, 3] == ids[-1]).all()
        assert (store.tokens[rows][5, 2] == ids[7]).all()
        enc = encode_frames(vla, ep.images, ep.instruction, ep.state)
        for t in (0, 9, STEPS - 1):  # the query of a stored frame's key returns that frame
            result = store.query(enc.keys[t], ep.task, k=3)
            assert result.indices[0] == rows[t] and result.similarities[0] > 0.9999
            assert not result.fell_back
    assert np.array_equal(demo_tokens(vla, episodes[0].actions, 4), store.tokens[store.episode == 0])


def test_stored_tokens_and_hidden_match_the_decode_loop(built) -> None:
    vla, store = built["vla"], open_datastore(built["store"], built["vla"])
    with DemoFile(built["demos"]) as f:
        ep = f.episode("demo_1")
    decoder = SpeculativeDecoder(Verifier(vla.llm), DecodeConfig(8, vla.config.vocab_size, 256))
    rows = np.flatnonzero(store.episode == 1)
    for t in (0, 11):
        with torch.no_grad():
            embeds = vla.prefix_embeds(torch.from_numpy(ep.images[t : t + 1]), vla.encode_prompt(ep.instruction),
                                       torch.from_numpy(ep.state[t : t + 1]))
            prefill = decoder.verifier.prefill(embeds)
        assert decoder.decode(embeds).tokens == store.own_tokens[rows[t]].tolist()
        np.testing.assert_allclose(prefill.hidden.numpy(), store.hidden[rows[t]], atol=1e-5)


def test_kinematic_stats_and_layout_in_extras(built) -> None:
    store = open_datastore(built["store"], built["vla"])
    with DemoFile(built["demos"]) as f:
        trajectories = [ep.ee_pos for ep in f if ep.success]
    expected = KinematicStats.fit(trajectories, KinematicConfig())
    assert KinematicStats.from_dict(store.extras[KINEMATIC_STATS_KEY]) == expected
    assert store.extras["action_layout"] == {"action_dim": 4, "chunk": 2, "n_bins": 256,
                                             "vocab_size": built["vla"].config.vocab_size}


def test_fingerprint_mismatch_is_refused(built, tmp_path, capsys) -> None:
    other = tiny_vla(seed=1)
    with pytest.raises(DatastoreError, match="built for target"):
        open_datastore(built["store"], other)
    other.save_pretrained(tmp_path / "other")
    write_demos(tmp_path / "heldout.hdf5", episodes=2, seed=5)
    assert main(["calibrate", "--target", str(tmp_path / "other"), "--datastore", str(built["store"]),
                 "--demos", str(tmp_path / "heldout.hdf5"), "--threads", "1"]) == 1
    assert "built for target" in capsys.readouterr().err


def test_calibrate_stores_theta_and_threshold(built, tmp_path, capsys) -> None:
    heldout = tmp_path / "heldout.hdf5"
    write_demos(heldout, episodes=2, seed=5)
    copy = tmp_path / "store"
    shutil.copytree(built["store"], copy)
    rc = main(["calibrate", "--target", str(built["root"] / "target"), "--datastore", str(copy),
               "--demos", str(heldout), "--frames", "12", "--threads", "1"])
    assert rc == 0 and "verify-skip theta" in capsys.readouterr().out

    def not_json(literal: str):
        raise AssertionError(f"manifest.json holds {literal}, which is not JSON")

    extras = json.loads((copy / "manifest.json").read_text(), parse_constant=not_json)["extras"]
    skip, pre, hybrid, frames = (extras[k] for k in ("verify_skip", "prefill_skip", "hybrid", "calibration_frames"))
    assert skip["frames_total"] == pre["frames"] == 12 == len(frames["similarity"]) == len(frames["frame"])
    # the stored rates are what the stored thresholds do on the stored frames (the thresholds
    # themselves are recomputed from these frames in the next test)
    guard, sims = np.asarray(frames["guard"], bool), np.asarray(frames["similarity"])
    assert skip["skip_rate"] == pytest.approx(np.mean(guard & (sims >= skip["theta"])))
    pre_skipped = np.asarray(frames["gripper_kept"], bool) & (np.asarray(frames["key_similarity"]) >= pre["theta"])
    assert pre["skip_rate"] == pytest.approx(np.mean(pre_skipped))
    assert frames["prefill_skipped"] == pre_skipped.tolist()
    # random target + unrelated held-out frames: AR drafter never beats retrieval's >= 1 token/forward
    assert hybrid["drafter"] == "ar" and hybrid["retrieval_fraction"] == 1.0
    assert sum(f is not None for f in frames["F"]) == hybrid["frames"] > 0


def test_calibrated_thresholds_follow_from_the_stored_frames(built, tmp_path) -> None:
    """theta is the smallest observed similarity whose skips reach the precision (brute force here),
    and the hybrid threshold is what calibrate_threshold picks from the stored per-frame numbers."""
    from heisd.kinematics import calibrate_threshold
    from heisd.retrieval.verify_skip import wilson_lower_bound

    heldout = tmp_path / "heldout.hdf5"
    write_demos(heldout, episodes=3, seed=6)
    copy = tmp_path / "store"
    shutil.copytree(built["store"], copy)
    assert main(["calibrate", "--target", str(built["root"] / "target"), "--datastore", str(copy),
                 "--demos", str(heldout), "--frames", "40", "--threads", "1", "--precision", "0.5",
                 "--min-support", "5", "--no-gripper-guard"]) == 0
    extras = json.loads((copy / "manifest.json").read_text())["extras"]
    frames = extras["calibration_frames"]

    def brute_theta(sims, passes, precision):
        def supported(sel):
            return len(sel) >= 5 and wilson_lower_bound(sum(sel), len(sel), 0.95) >= precision - 1e-9
        ok = [t for t in sorted(set(sims)) if supported([p for s, p in zip(sims, passes) if s >= t])]
        return min(ok) if ok else None

    guard = np.asarray(frames["guard"], bool)
    sims = np.asarray(frames["similarity"])[guard].tolist()
    expected = brute_theta(sims, np.asarray(frames["passes"], bool)[guard].tolist(), 0.5)
    theta = extras["verify_skip"]["theta"]
    assert (expected is None and theta > 1.0) or theta == pytest.approx(expected, abs=1e-5)
    kept = np.asarray(frames["gripper_kept"], bool)
    expected = brute_theta(np.asarray(frames["key_similarity"])[kept].tolist(),
                           np.asarray(frames["passes_full"], bool)[kept].tolist(), 0.5)
    assert expected is not None and extras["prefill_skip"]["theta"] == pytest.approx(expected, abs=1e-5)
    support = extras["prefill_skip"]["support"]  # the support stored next to theta is what theta skips
    skipped = kept & (np.asarray(frames["key_similarity"]) >= extras["prefill_skip"]["theta"])
    assert support["skipped"] == skipped.sum() >= 5 and support["min_support"] == 5
    assert support["passed"] == np.asarray(frames["passes_full"], bool)[skipped].sum()
    assert support["lower_bound"] == pytest.approx(wilson_lower_bound(support["passed"], support["skipped"]))
    has_f = [f is not None for f in frames["F"]]
    pick = lambda key: np.asarray(frames[key])[has_f]  # noqa: E731
    assert extras["hybrid"]["threshold"] == pytest.approx(
        calibrate_threshold(pick("F").astype(float), pick("tokens_per_forward_retrieval"), pick("tokens_per_forward_drafter")), abs=1e-5)


def test_calibrate_decodes_drafter_mode_as_the_method_runs_it(built, tmp_path) -> None:
    """calibrate's drafter-mode tokens per forward on each stored frame equal what the specvla
    policy (exact acceptance, the same tree flags) gets on that frame, as replay measures it."""
    from heisd.decoding.rollout import greedy_rollout
    from heisd.drafter import Drafter, DrafterConfig, DrafterTarget
    from heisd.drafter.train import DrafterTrainConfig, fit
    from heisd.runtime.methods import MethodConfig, build_decoders
    from heisd.runtime.policy import VLAPolicy

    vla = built["vla"]
    target = DrafterTarget.from_target(vla)
    torch.manual_seed(0)
    drafter = Drafter(DrafterConfig.for_target(target, intermediate_size=32), target)
    with DemoFile(built["demos"]) as f:  # a drafter that knows the target, so trees get accepted
        ep = f.episode("demo_0")
        embeds = vla.prefix_embeds(torch.from_numpy(ep.images), vla.encode_prompt(ep.instruction).expand(len(ep), -1),
                                   torch.from_numpy(ep.state)).detach()
    fit(drafter, greedy_rollout(vla.llm, embeds, 8), DrafterTrainConfig(steps=60, batch_size=16, lr=3e-3, warmup_steps=5))
    drafter.save_pretrained(tmp_path / "drafter")
    copy = tmp_path / "store"
    shutil.copytree(built["store"], copy)
    tree = ["--tree-depth", "2", "--tree-budget", "3"]
    write_demos(tmp_path / "heldout.hdf5", episodes=2, seed=5)
    rc = main(["calibrate", "--target", str(built["root"] / "target"), "--datastore", str(copy),
               "--demos", str(tmp_path / "heldout.hdf5"), "--frames", "12", "--threads", "1",
               "--drafter", str(tmp_path / "drafter"), *tree])
    extras = json.loads((copy / "manifest.json").read_text())["extras"]
    assert rc == 0 and extras["hybrid"]["drafter"] == "drafter"
    frames = extras["calibration_frames"]
    cfg = MethodConfig("specvla", drafter=str(tmp_path / "drafter"), tree_depth=2, tree_budget=3)
    policy = VLAPolicy(vla, build_decoders(cfg, vla))
    replayed = []
    for (path, name, t) in frames["frame"]:
        with DemoFile(path) as f:
            ep = f.episode(name)
        policy.reset(ep.instruction, ep.task)
        replayed.append(policy.act(ep.images[t], ep.state[t])[1].tokens_per_forward)
    assert frames["tokens_per_forward_drafter"] == pytest.approx(replayed, abs=1e-4)
    assert max(replayed) > 1.0  # drafts were accepted: the comparison says something


def test_calibrate_decodes_retrieval_mode_as_a_replay_does(built, tmp_path, monkeypatch) -> None:
    """calibrate's retrieval-mode numbers on each control step equal what `replay` decodes on the
    same frames with the same datastore and flags: the policy's own vision pass and the previous
    action a run has (Jacobi's warm start), not a cold start on each frame."""
    from heisd.runtime.methods import MethodConfig, build_decoders
    from heisd.runtime.policy import VLAPolicy
    from heisd.runtime.replay import replay, replay_frames

    vla = built["vla"]
    copy = tmp_path / "store"
    shutil.copytree(built["store"], copy)
    heldout = tmp_path / "heldout.hdf5"
    write_demos(heldout, episodes=2, seed=5)
    steps = 2 * len(range(0, STEPS, vla.spec.chunk))  # every control step of both episodes
    # the demonstrator's tokens, checked exactly: the random target rejects them, so Jacobi finishes the
    # steps; its greedy action is the same on every frame, which a warm start guesses right
    flags = ["--retrieval-fallback", "jacobi", "--no-continuation", "--no-group-acceptance", "--payload", "demo"]
    assert main(["calibrate", "--target", str(built["root"] / "target"), "--datastore", str(copy),
                 "--demos", str(heldout), "--frames", str(steps), "--threads", "1", *flags]) == 0
    extras = json.loads((copy / "manifest.json").read_text())["extras"]
    frames = extras["calibration_frames"]
    calibrated = {(name, t): (tpf, f) for (_, name, t), tpf, f in
                  zip(frames["frame"], frames["tokens_per_forward_verified"], frames["F"], strict=True)}
    assert len(calibrated) == steps

    cfg = MethodConfig("retrieval", datastore=str(copy), retrieval_fallback="jacobi", continuation=False,
                       group_acceptance=False, payload="demo", verify_skip=False, prefill_skip=False)
    reference = VLAPolicy(vla, build_decoders(MethodConfig("ar"), vla))
    result = replay(VLAPolicy(vla, build_decoders(cfg, vla)), reference, cfg.label, [heldout], steps, progress=False)
    assert result["frames"] == steps
    # (the stored per-frame numbers are rounded to 5 decimals)
    assert result["tokens_per_forward"] == pytest.approx(np.mean(frames["tokens_per_forward_verified"]), abs=1e-4)
    # frame by frame, as replay walks them
    policy, replayed, cold = VLAPolicy(vla, build_decoders(cfg, vla)), {}, {}
    for ep, t, first in replay_frames([heldout], steps, vla.spec.chunk):
        if first:
            policy.reset(ep.instruction, ep.task)
        replayed[(ep.name, t)] = policy.act(ep.images[t], ep.state[t])[1].tokens_per_forward
        alone = VLAPolicy(vla, build_decoders(cfg, vla))  # the same frame with no previous action
        alone.reset(ep.instruction, ep.task)
        cold[(ep.name, t)] = alone.act(ep.images[t], ep.state[t])[1].tokens_per_forward
    assert {key: v[0] for key, v in calibrated.items()} == pytest.approx(replayed, abs=1e-4)
    # the comparison says something: a cold start decodes some frame differently
    assert any(abs(cold[key] - replayed[key]) > 1e-3 for key in replayed)
    assert extras["hybrid"]["tokens_per_forward_retrieval_mean"] == pytest.approx(
        np.mean([v[0] for v in calibrated.values() if v[1] is not None]), abs=1e-4)
    # the greedy rollouts go a few frames per batch: smaller batches give the same numbers
    from heisd.commands import calibrate

    monkeypatch.setattr(calibrate, "ENCODE_BATCH", 4)
    small = tmp_path / "small"
    shutil.copytree(built["store"], small)
    assert main(["calibrate", "--target", str(built["root"] / "target"), "--datastore", str(small),
                 "--demos", str(heldout), "--frames", str(steps), "--threads", "1", *flags]) == 0
    again = json.loads((small / "manifest.json").read_text())["extras"]["calibration_frames"]
    assert again == frames
