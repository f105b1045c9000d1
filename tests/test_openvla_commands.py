"""Every command on an OpenVLA checkpoint directory (`--target DIR`, recognized from config.json):
train-drafter, build-datastore, calibrate, replay with every method, profile, on LIBERO-layout
demonstrations with 7-D actions and no proprioception read by the target."""

from __future__ import annotations

import json

import pytest
from helpers import write_libero_demo_file

from heisd.cli import main
from heisd.data.dataset import DemoFile

KEY = ["--unnorm-key", "libero_spatial", "--threads", "1"]


@pytest.fixture(scope="module")
def run(tiny_openvla_dir, tmp_path_factory):
    """Demonstrations, a trained drafter, a calibrated datastore: each made by its command."""
    work = tmp_path_factory.mktemp("openvla-commands")
    target = ["--target", str(tiny_openvla_dir), *KEY]
    train, held_out = work / "train.hdf5", work / "held_out.hdf5"
    write_libero_demo_file(train, episodes=4, steps=16, seed=0)
    write_libero_demo_file(held_out, episodes=2, steps=16, seed=1)
    assert main(["train-drafter", *target, "--demos", str(train), "--out", str(work / "drafter"), "--steps", "4",
                 "--batch-size", "8", "--eval-every", "4", "--max-frames", "16"]) == 0
    assert main(["build-datastore", *target, "--demos", str(train), "--out", str(work / "store"),
                 "--batch-size", "16"]) == 0
    assert main(["calibrate", *target, "--datastore", str(work / "store"), "--demos", str(held_out),
                 "--drafter", str(work / "drafter"), "--frames", "32", "--seed", "0"]) == 0
    return {"dir": tiny_openvla_dir, "work": work, "target": target, "train": train, "held_out": held_out}


def test_drafter_follows_the_targets_width_and_action_count(run, tiny_openvla):
    info = json.loads((run["work"] / "drafter" / "train_info.json").read_text())
    config = info["drafter_config"]
    spec = tiny_openvla.spec
    assert config["hidden_size"] == spec.hidden_size and config["max_positions"] == spec.n_action_tokens == 7
    assert config["intermediate_size"] == tiny_openvla.llm.config.intermediate_size
    assert info["target_fingerprint"] == tiny_openvla.fingerprint()
    assert info["train_frames"] == 16 and info["val_frames"] == 16  # one 16-step episode held out


def test_datastore_holds_openvla_tokens_and_keys(run, tiny_openvla):
    manifest = json.loads((run["work"] / "store" / "manifest.json").read_text())
    extras = manifest["extras"]
    assert extras["action_layout"] == {"action_dim": 7, "chunk": 1, "vocab_size": 32000, "n_bins": 256}
    assert manifest["n_entries"] == 64 and manifest["n_tokens"] == 7
    assert manifest["key_dim"] == manifest["hidden_dim"] == tiny_openvla.spec.hidden_size  # pooled projector output
    assert manifest["target_fingerprint"] == tiny_openvla.fingerprint()
    assert {"hybrid", "verify_skip", "prefill_skip"} <= set(extras)  # calibrate stored its thresholds


def replay(run, method: str, *flags: str, demos: str = "held_out") -> dict:
    out = run["work"] / f"replay-{method}-{'-'.join(f.strip('-') for f in flags)}-{demos}"
    argv = ["replay", "--method", method, *run["target"], "--benchmark", "libero_spatial", "--demos", str(run[demos]), "--frames", "6",
            "--drafter", str(run["work"] / "drafter"), "--datastore", str(run["work"] / "store"), "--out", str(out),
            *flags]
    assert main(argv) == 0
    return json.loads((out / "replay.json").read_text())


@pytest.mark.parametrize("method, flags", [("ar", ()), ("jacobi", ()), ("specvla", ()),
                                           ("retrieval", ("--lossless",)), ("heisd", ("--lossless",))])
def test_exact_methods_give_the_ar_tokens(run, method, flags):
    result = replay(run, method, *flags)
    assert result["frames"] == 6 and result["token_mismatch_rate"] == 0.0 and result["max_bin_deviation"] == 0


def test_retrieval_on_stored_frames_drafts_the_whole_action(run):
    """Frames the datastore holds retrieve the target's own tokens: the prefill's token, then the 6
    drafted ones in one verification pass (2 target forwards); fused, all 7 accepted in the prefill
    pass that verifies them (one target forward)."""
    result = replay(run, "retrieval", "--lossless", demos="train")
    assert result["token_mismatch_rate"] == 0.0
    assert result["target_forwards"] == 2.0 and result["tokens_per_forward"] == 3.5
    result = replay(run, "retrieval", "--lossless", "--fused-prefill", demos="train")
    assert result["token_mismatch_rate"] == 0.0
    assert result["target_forwards"] == 1.0 and result["tokens_per_forward"] == 7.0


@pytest.mark.parametrize("method", ["specvla-relaxed", "retrieval", "heisd"])
def test_relaxed_methods_decode_seven_token_actions(run, method):
    result = replay(run, method)
    assert result["frames"] == 6 and result["control_steps"] == 6
    assert len(result["skipped_steps"].get("max_bin_deviation_per_dim", [0] * 7)) == 7


def test_bfloat16_target_runs_heisd_with_its_skips(run):
    """The same drafter and datastore bind to the checkpoint loaded in bfloat16 (one fingerprint)."""
    result = replay(run, "heisd", "--dtype", "bfloat16")
    assert result["frames"] == 6 and 0.0 <= result["token_mismatch_rate"] <= 1.0


def test_profile_with_the_trained_drafter_and_datastore(run):
    out = run["work"] / "profile.json"
    assert main(["profile", *run["target"], "--drafter", str(run["work"] / "drafter"), "--datastore",
                 str(run["work"] / "store"), "--out", str(out), "--repeats", "1", "--warmup", "0",
                 "--tree-sizes", "4"]) == 0
    pieces = json.loads(out.read_text())["pieces_ms"]
    assert {"vision", "prefill", "decode_step", "tree_verify", "drafter_pass", "datastore_query"} <= set(pieces)


def test_openvla_reads_no_state_so_the_recorded_one_does_not_matter(run, tiny_openvla):
    from heisd.targets.rollout import rollout_frames

    with DemoFile(run["held_out"]) as f:
        ep = next(iter(f))
    a = rollout_frames(tiny_openvla, ep.images[:2], ep.instruction, ep.state[:2])
    b = rollout_frames(tiny_openvla, ep.images[:2], ep.instruction, ep.state[:2] * 0 + 5)
    assert tiny_openvla.spec.state_input(ep.state[:2]) is None
    assert a.features.tokens.tolist() == b.features.tokens.tolist()


def test_closed_loop_refuses_an_openvla_target_on_mw(run, capsys):
    for command in (["eval", "--method", "ar"], ["bench"]):
        argv = [*command, *run["target"], "--benchmark", "mw", "--drafter", str(run["work"] / "drafter"),
                "--datastore", str(run["work"] / "store"), "--out", str(run["work"] / "closed-loop")]
        assert main(argv) == 2
        assert "--target's actions have 7 dims, --benchmark mw takes 4" in capsys.readouterr().err


def test_an_openvla_libero_episode_runs_end_to_end_with_openvlas_protocol(tiny_openvla):
    """The tiny OpenVLA checkpoint drives LIBERO-Object under OpenVLA's protocol: 224 px JPEG'd
    frames in (from a 256 px render), a [0, 1] gripper out that reaches the simulator as -1 / +1."""
    from heisd.benchmarks.libero import LiberoConfig, LiberoEnv, suite_tasks
    from heisd.benchmarks.libero_protocol import PROTOCOL_RENDER_SIZE
    from heisd.runtime.evaluation import run_episode
    from heisd.runtime.methods import MethodConfig, build_decoders
    from heisd.runtime.policy import VLAPolicy

    assert tiny_openvla.spec.protocol == "openvla"
    task = suite_tasks("libero_object")[0]
    env = LiberoEnv("libero_object", task, LiberoConfig(image_size=PROTOCOL_RENDER_SIZE, fast_render=True,
                                                         max_steps=3, protocol="openvla"))
    policy = VLAPolicy(tiny_openvla, build_decoders(MethodConfig("ar"), tiny_openvla))
    seen, sent = [], []
    act, step = policy.act, env._env.step
    policy.act = lambda image, *a: seen.append(image.shape) or act(image, *a)
    env._env.step = lambda action: sent.append(action[-1]) or step(action)
    line = run_episode(env, policy, {"init_state": 0})
    assert line["env_steps"] == 3 and len(line["steps"]["target_forwards"]) == 3
    assert seen == [(224, 224, 3)] * 3
    assert sent[-3:] and all(g in (-1.0, 1.0) for g in sent[-3:])  # the wait steps' dummy action first


def test_missing_unnorm_key_names_the_available_ones(run, capsys, tmp_path):
    assert main(["replay", "--target", str(run["dir"]), "--threads", "1", "--benchmark", "libero_spatial",
                 "--demos", str(run["held_out"]), "--frames", "1", "--out", str(tmp_path)]) == 1
    err = capsys.readouterr().err
    assert "choose one with --unnorm-key: bridge_orig, libero_spatial_no_noops" in err


def test_offline_tools_see_the_frames_the_protocol_shows(run, tiny_openvla):
    """A datastore key is computed on the frame the closed loop would show (JPEG + Lanczos to 224), not
    on the recorded frame resized by the processor."""
    import numpy as np
    import torch

    from heisd.benchmarks.libero_protocol import openvla_image

    keys = np.load(run["work"] / "store" / "keys.npy")
    with DemoFile(run["train"]) as f:
        frame = f.episode(f.episode_names()[0]).images[0]

    def key(image):
        with torch.no_grad():
            k = tiny_openvla.retrieval_key(torch.from_numpy(np.ascontiguousarray(image[None]))).numpy()[0]
        return k / np.linalg.norm(k)

    stored = keys[0] / np.linalg.norm(keys[0])
    assert np.abs(stored - key(openvla_image(frame))).max() < 1e-5
    assert np.abs(stored - key(frame)).max() > 1e-3
