"""The target VLA: tokenizers, checkpoints and a short training run on a synthetic HDF5 file."""

from __future__ import annotations

import json
from pathlib import Path

import h5py
import numpy as np
import pytest
import torch

from heisd.targets.vla import VLA, ActionTokenizer, CheckpointError, NormStats, TextTokenizer, VLAConfig
from heisd.targets.vla.frames import EpisodeRecord, Frames, build_frames, chunk_targets, keyframe_weights
from heisd.targets.vla.vision import random_shift, resize_images, resize_views

INSTRUCTIONS = ["move left", "move right and open the gripper"]
TINY = {"hidden_size": 32, "n_layers": 1, "intermediate_size": 64, "image_size": 16,
        "vision_channels": (8, 16), "max_positions": 64}


# ----- action tokenizer -----
def test_action_tokenizer_hand_computed():
    tok = ActionTokenizer(1000, q01=np.array([-2.0, 0.0]), q99=np.array([2.0, 1.0]), n_bins=256)
    # -2 -> -1 -> digitize 1 -> id 999 (bin 0). q99 normalizes to just below 1 (OpenVLA's
    # 1e-8 in the denominator) -> digitize 255 -> id 745 (bin 254)
    assert tok.encode(np.array([-2.0, 1.0])).tolist() == [999, 745]
    # 0 normalizes to 0.0: edges are k*2/255 - 1, 0.0 lies in [edge 127, edge 128) -> digitize 128 -> id 872
    assert tok.encode(np.array([0.0, 0.5])).tolist() == [872, 872]
    # out of the q01/q99 range clips to exactly +-1; +1 is the only value in bin 255 (id 744)
    assert tok.encode(np.array([-9.0, 9.0])).tolist() == [999, 744]
    assert tok.vocab.bin(999) == 0 and tok.vocab.token(255) == 744
    assert tok.vocab.is_action(np.array([743, 744, 999, 1000])).tolist() == [False, True, True, False]
    # decode: id 872 -> index clip(1000-872-1) = 127 -> center (edge127 + edge128)/2 = 0.0
    np.testing.assert_allclose(tok.decode(np.array([872, 872])), [0.0, 0.5], atol=1e-6)
    # id 744 (bin 255) decodes into the last of the 255 centers, like OpenVLA
    last_center = (np.linspace(-1, 1, 256)[-2] + 1.0) / 2
    np.testing.assert_allclose(tok.decode(np.array([744, 999]))[0], 2.0 * last_center, rtol=1e-6)


def test_action_tokenizer_round_trip_within_half_a_bin():
    rng = np.random.default_rng(0)
    q01, q99 = np.array([-1.0, -0.5, 0.0, -1.0]), np.array([1.0, 0.5, 2.0, 1.0])
    tok = ActionTokenizer(32000, q01, q99, n_bins=256)
    actions = rng.uniform(q01, q99, size=(50, 2, 4))
    ids = tok.encode(actions)
    assert ids.shape == (50, 2, 4) and tok.vocab.is_action(ids).all()
    assert ids.min() >= 31744 and ids.max() <= 31999
    bin_width = (q99 - q01) * (2 / 255) / 2
    assert (np.abs(tok.decode(ids) - actions) <= bin_width / 2 + 1e-6).all()
    np.testing.assert_allclose(tok.unnormalize(tok.normalize(actions)), actions, atol=1e-6)


def test_chunk_targets_repeats_last_action():
    a = np.arange(6, dtype=np.float32).reshape(3, 2)
    assert chunk_targets(a, 2).tolist() == [[[0, 1], [2, 3]], [[2, 3], [4, 5]], [[4, 5], [4, 5]]]


# ----- text tokenizer -----
def test_text_tokenizer_prompt_and_unseen_words(tmp_path):
    text = TextTokenizer.train(INSTRUCTIONS)
    ids = text.encode_prompt("Move left.")
    assert text.decode(ids) == "In: What action should the robot take to move left?\nOut:"
    assert 0 < len(ids) < 20 and text.pad_id not in ids
    assert text.decode(text.encode_prompt("close the window")).endswith("close the window?\nOut:")
    text.save(tmp_path / "tokenizer.json")
    assert TextTokenizer.load(tmp_path / "tokenizer.json").encode_prompt("move left") == ids


def test_keyframe_weights_mark_the_frames_after_each_gripper_change():
    actions = np.zeros((12, 4), dtype=np.float32)
    actions[:, -1] = -1.0
    actions[3:10, -1] = 1.0  # closes at frame 3, opens at frame 10
    assert keyframe_weights(actions, 3, 5.0).tolist() == [1, 1, 1, 5, 5, 5, 1, 1, 1, 1, 5, 5]  # cut at the end
    assert keyframe_weights(actions[:3], 3, 5.0).tolist() == [1, 1, 1]  # no change, nothing weighted
    # training frames carry them into every batch; unweighted frames carry none
    record = EpisodeRecord("e", "t", INSTRUCTIONS[0], np.zeros((12, 8, 8, 3), np.uint8), np.zeros((12, 4), np.float32),
                           actions, 1)
    text, tok = TextTokenizer.train(INSTRUCTIONS), ActionTokenizer(1000, -np.ones(4), np.ones(4), n_bins=256)
    weighted = build_frames([record, record], text, tok, 1, keyframe_window=3, keyframe_weight=5.0)
    assert weighted.batch(torch.tensor([3, 22]))["weight"].tolist() == [5.0, 5.0]
    assert "weight" not in build_frames([record], text, tok, 1).batch(torch.tensor([3]))


# ----- model -----
def tiny_model(seed: int = 0, views: int = 1) -> VLA:
    torch.manual_seed(seed)
    text = TextTokenizer.train(INSTRUCTIONS)
    norm = NormStats(q01=-np.ones(4), q99=np.ones(4), state_mean=np.zeros(4), state_std=np.ones(4))
    return VLA(VLAConfig(text_vocab_size=text.vocab_size, views=views, **TINY), norm, text).eval()


def inputs(model: VLA, b: int = 2):
    """Frames of the model's cameras stacked (`heisd.data.views`), a prompt, states and action ids."""
    g = torch.Generator().manual_seed(1)
    images = torch.randint(0, 256, (b, 32 * model.config.views, 32, 3), dtype=torch.uint8, generator=g)
    prompt = model.encode_prompt("move left").expand(b, -1)
    lo = model.config.vocab_size - 256
    actions = torch.randint(lo, model.config.vocab_size, (b, 8), generator=g)
    return images, prompt, torch.randn(b, 4, generator=g), actions


@pytest.mark.parametrize("views", [1, 2], ids=["agentview", "with-wrist"])
def test_vocab_layout_and_prefix_shape(views):
    model = tiny_model(views=views)
    cfg = model.config
    assert cfg.vocab_size == model.text_tokenizer.vocab_size + 256
    assert model.llm.config.vocab_size == cfg.padded_vocab_size >= cfg.vocab_size
    assert cfg.padded_vocab_size % 64 == 0
    images, prompt, state, _ = inputs(model)
    emb = model.prefix_embeds(images, prompt, state)
    assert emb.shape == (2, views * cfg.image_grid ** 2 + 1 + prompt.shape[1], cfg.hidden_size)
    key = model.retrieval_key(images, state)
    assert key.shape == (2, views * 4 * cfg.vision_channels[-1] + cfg.state_dim)
    prefix, same_key = model.encode_observation(images, prompt, state)  # one CNN pass, same values
    torch.testing.assert_close(prefix, emb)
    torch.testing.assert_close(same_key, key)


@pytest.mark.parametrize("views", [1, 2], ids=["agentview", "with-wrist"])
def test_left_padded_prompt_gives_the_same_logits(views):
    model = tiny_model(views=views)
    images, prompt, state, actions = inputs(model)
    with torch.no_grad():
        plain = model.teacher_forced(images, prompt, state, actions).logits
        padded = torch.cat([torch.zeros(2, 3, dtype=torch.long), prompt], 1)
        mask = torch.cat([torch.zeros(2, 3, dtype=torch.long), torch.ones_like(prompt)], 1)
        out = model.teacher_forced(images, padded, state, actions, mask).logits
    torch.testing.assert_close(out, plain, atol=1e-5, rtol=1e-5)


def test_teacher_forced_matches_prefill_then_cached_steps():
    """What the decoding engine will do (prefill with inputs_embeds, then one id at a time)."""
    model = tiny_model()
    images, prompt, state, actions = inputs(model, b=1)
    with torch.no_grad():
        tf = model.teacher_forced(images, prompt, state, actions)
        out = model.llm(inputs_embeds=model.prefix_embeds(images, prompt, state), use_cache=True, logits_to_keep=1)
        steps = [out.logits[:, -1]]
        for i in range(actions.shape[1] - 1):
            out = model.llm(input_ids=actions[:, i:i + 1], cache=out.past_key_values, use_cache=True)
            steps.append(out.logits[:, -1])
    torch.testing.assert_close(torch.stack(steps, 1), tf.logits, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(model.llm.lm_head(tf.hidden), tf.logits)


def test_each_camera_has_its_own_cnn_and_image_tokens():
    model = tiny_model(views=2)
    images, prompt, state, _ = inputs(model)
    n = model.config.image_grid ** 2
    other_wrist = images.clone()
    other_wrist[:, 32:] = 255 - other_wrist[:, 32:]
    with torch.no_grad():
        a, b = (model.image_tokens(x) for x in (images, other_wrist))
        assert torch.equal(a[:, :n], b[:, :n]) and not torch.allclose(a[:, n:], b[:, n:])  # agentview's tokens first
        one = tiny_model(views=1)
        one.load_state_dict({k: v for k, v in model.state_dict().items() if not k.startswith("wrist_vision.")})
        assert torch.equal(one.image_tokens(images[:, :32]), a[:, :n])  # the agentview CNN is a one-camera target's
        resized = resize_views(images, 16, 2)
        assert resized.shape == (2, 32, 16, 3)
        assert torch.equal(resized[:, 16:], resize_images(images[:, 32:], 16))
    for wrong in (images[:, :33], images[:, :32]):  # not two frames; one camera's frame alone
        with pytest.raises(ValueError, match="2 square camera frames stacked"):
            model.image_tokens(wrong)
    with pytest.raises(ValueError, match="views must be one of"):
        VLAConfig(text_vocab_size=8, views=3).validate()


def test_image_ops():
    img = torch.randint(0, 256, (3, 32, 32, 3), dtype=torch.uint8)
    small = resize_images(img, 16)
    assert small.dtype == torch.uint8 and small.shape == (3, 16, 16, 3)
    assert torch.equal(resize_images(small, 16), small)  # idempotent: load-time == run-time resizing
    x = torch.arange(2 * 1 * 4 * 4, dtype=torch.float32).view(2, 1, 4, 4)
    shifted = random_shift(x, 2)
    assert shifted.shape == x.shape
    for b in range(2):  # each output is a 4x4 window of the replicate-padded image
        padded = torch.nn.functional.pad(x[b:b + 1], (2, 2, 2, 2), mode="replicate")[0, 0]
        assert any(torch.equal(shifted[b, 0], padded[i:i + 4, j:j + 4]) for i in range(5) for j in range(5))


def test_frames_move_to_a_device_whole():
    """train-vla --device holds every frame there; a batch drawn with CPU indices comes from there."""
    n = 6
    frames = Frames(images=torch.zeros(n, 8, 8, 3, dtype=torch.uint8), states=torch.randn(n, 7),
                    action_ids=torch.arange(n * 4).view(n, 4), prompt_ids=torch.ones(2, 3, dtype=torch.long),
                    prompt_mask=torch.ones(2, 3, dtype=torch.long), episode=torch.tensor([0, 0, 0, 1, 1, 1]))
    moved = frames.to("meta")
    batch = moved.batch(torch.tensor([1, 4]))
    assert all(v.device.type == "meta" for v in batch.values())
    assert batch["images"].shape == (2, 8, 8, 3) and batch["prompt_ids"].shape == (2, 3)
    assert torch.equal(frames.batch(torch.tensor([1, 4]))["action_ids"], torch.tensor([[4, 5, 6, 7], [16, 17, 18, 19]]))


@pytest.mark.parametrize("views", [1, 2], ids=["agentview", "with-wrist"])
def test_save_load_round_trip(tmp_path, views):
    model = tiny_model(views=views)
    model.save_pretrained(tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "config.json", "model.safetensors", "norm_stats.json", "tokenizer.json"]
    assert all(p.stat().st_mode & 0o777 == 0o644 for p in tmp_path.iterdir())
    loaded = VLA.from_pretrained(tmp_path)
    images, prompt, state, actions = inputs(model)
    with torch.no_grad():
        a = model.teacher_forced(images, prompt, state, actions).logits
        b = loaded.teacher_forced(images, prompt, state, actions).logits
    assert torch.equal(a, b)
    assert loaded.fingerprint() == model.fingerprint() != tiny_model(seed=1, views=views).fingerprint()
    assert loaded.spec.views == views
    # one camera: the config written as before the option, so shipped checkpoints keep their fingerprints
    assert ("views" in json.loads((tmp_path / "config.json").read_text())) == (views == 2)


def test_a_masked_state_value_is_read_neither_by_the_llm_nor_the_key(tmp_path):
    model = tiny_model()
    model.mask_state((3,))  # the gripper opening of mw's state
    images, prompt, state, actions = inputs(model)
    moved = state.clone()
    moved[:, 3] += 5.0

    def outputs(m, s):
        with torch.no_grad():
            return m.teacher_forced(images, prompt, s, actions).logits, m.retrieval_key(images, s)

    for a, b in zip(outputs(model, state), outputs(model, moved)):
        assert torch.equal(a, b)
    moved[:, 0] += 5.0  # the end effector is still read
    assert not torch.equal(outputs(model, state)[0], outputs(model, moved)[0])

    model.save_pretrained(tmp_path / "masked")
    loaded = VLA.from_pretrained(tmp_path / "masked")
    assert loaded.config.masked_state == (3,) and torch.equal(outputs(loaded, moved)[1], outputs(model, moved)[1])
    assert loaded.fingerprint() == model.fingerprint() != tiny_model().fingerprint()
    tiny_model().save_pretrained(tmp_path / "plain")  # nothing masked: the config as before the option
    assert "masked_state" not in json.loads((tmp_path / "plain" / "config.json").read_text())
    with pytest.raises(ValueError, match=r"masked_state must name distinct state values in \[0, 4\), got \[4\]"):
        model.mask_state((4,))
    assert model.config.masked_state == (3,) and model.state_read.tolist() == [1, 1, 1, 0]  # left as it was


def test_bad_checkpoints_error_clearly(tmp_path):
    tiny_model().save_pretrained(tmp_path / "ok")
    with pytest.raises(CheckpointError, match="no VLA checkpoint"):
        VLA.from_pretrained(tmp_path / "absent")
    for name, damage, message in [
        ("missing", lambda d: (d / "norm_stats.json").unlink(), "lacks norm_stats.json"),
        ("corrupt", lambda d: (d / "model.safetensors").write_bytes(b"\x00" * 40), "corrupt model.safetensors"),
        ("badjson", lambda d: (d / "config.json").write_text("{"), "corrupt config.json"),
        ("mismatch", lambda d: (d / "config.json").write_text(json.dumps(
            {**json.loads((d / "config.json").read_text()), "hidden_size": 64, "intermediate_size": 128})),
         "does not match the weights"),
    ]:
        d = tmp_path / name
        tiny_model().save_pretrained(d)
        damage(d)
        with pytest.raises(CheckpointError, match=message):
            VLA.from_pretrained(d)


# ----- training -----
def write_demos(path: Path, n_episodes: int = 8, t: int = 12) -> None:
    """Episodes whose action is set by the instruction and the position of a bright square."""
    rng = np.random.default_rng(0)
    with h5py.File(path, "w") as f:
        data = f.create_group("data")
        data.attrs["benchmark"] = "mw"
        data.attrs["env_args"] = json.dumps({"camera": "corner2"})
        for i in range(n_episodes):
            k = i % 2
            images = np.zeros((t, 32, 32, 3), dtype=np.uint8)
            row = rng.integers(0, 24)
            images[:, row:row + 8, 8:16] = 255
            actions = np.zeros((t, 4), dtype=np.float32)
            actions[:, 0] = -0.5 if k == 0 else 0.5
            actions[:, 1] = row / 12.0 - 1.0
            actions[:, 3] = np.where(np.arange(t) < t // 2, -1.0, 1.0)
            g = data.create_group(f"demo_{i}")
            g.attrs.update({"task": f"task{k}", "instruction": INSTRUCTIONS[k], "success": True})
            g.create_dataset("actions", data=actions)
            g.create_dataset("obs/agentview_rgb", data=images)
            g.create_dataset("obs/ee_pos", data=rng.normal(size=(t, 3)).astype(np.float32))
            g.create_dataset("obs/gripper_states", data=rng.uniform(size=(t, 1)).astype(np.float32))


def run_train(demos: Path, out: Path, steps: int, resume: bool = False, benchmark: str = "mw",
              extra: tuple[str, ...] = ()) -> int:
    from heisd.cli import main

    return main(["train-vla", "--benchmark", benchmark, "--demos", str(demos), "--out", str(out),
                 "--steps", str(steps), "--batch-size", "16", "--lr", "3e-3", "--warmup-steps", "5",
                 "--threads", "1", "--val-fraction", "0.25", "--eval-every", "10", "--save-every", "20",
                 "--hidden-size", "32", "--layers", "1", "--image-size", "16", "--vision-channels", "8,16",
                 *(["--resume"] if resume else []), *extra])


def log(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / "train_log.jsonl").read_text().splitlines()]


def test_training_lowers_loss_and_resume_continues_exactly(tmp_path, capsys):
    demos = tmp_path / "demos.hdf5"
    write_demos(demos)
    straight, split = tmp_path / "straight", tmp_path / "split"
    assert run_train(demos, straight, 40) == 0
    lines = log(straight)
    assert [r["step"] for r in lines] == [10, 20, 30, 40]
    assert lines[-1]["train_loss"] < lines[0]["train_loss"] * 0.7
    assert lines[-1]["val_loss"] < lines[0]["val_loss"]
    model = VLA.from_pretrained(straight)
    assert len(model.text_tokenizer.encode_prompt("open the door")) < len(model.encode_prompt("open the dxqr")[0])
    info = json.loads((straight / "train_info.json").read_text())
    assert info["train_episodes"] == 6 and info["val_episodes"] == 2 and info["train_frames"] == 72
    assert info["fingerprint"] == VLA.from_pretrained(straight).fingerprint()

    assert run_train(demos, tmp_path / "wrong", 40, benchmark="libero") == 1
    assert "benchmark 'mw', not 'libero'" in capsys.readouterr().err

    # a run killed right after its step-20 checkpoint, with a log line written after it
    from heisd.targets.vla import train as train_module

    save = train_module._save

    def save_then_die(model, out, state):
        save(model, out, state)
        if state["step"] == 20:
            raise KeyboardInterrupt

    train_module._save = save_then_die
    try:
        assert run_train(demos, split, 40) == 130
    finally:
        train_module._save = save
    with open(split / "train_log.jsonl", "a") as f:
        f.write(json.dumps({"step": 30, "train_loss": 0.0}) + "\n")
    capsys.readouterr()
    assert run_train(demos, split, 40) == 1
    assert "already holds a heisd VLA checkpoint; pass --overwrite to replace it or --resume" in capsys.readouterr().err
    assert run_train(demos, split, 40, resume=True) == 0
    assert [r["step"] for r in log(split)] == [10, 20, 30, 40]
    assert log(split)[-1]["train_loss"] == pytest.approx(lines[-1]["train_loss"], rel=1e-6)
    assert VLA.from_pretrained(split).fingerprint() == VLA.from_pretrained(straight).fingerprint()


def test_weighted_loss_counts_each_frame_by_its_weight():
    from heisd.targets.vla.train import action_loss

    model = tiny_model()
    images, prompt, state, actions = inputs(model)
    batch = {"images": images, "prompt_ids": prompt, "state": state, "action_ids": actions,
             "prompt_mask": torch.ones_like(prompt)}
    with torch.no_grad():
        plain, logits = action_loss(model, batch)
        first = torch.nn.functional.cross_entropy(logits[0], actions[0])
        torch.testing.assert_close(action_loss(model, {**batch, "weight": torch.tensor([2.0, 2.0])})[0], plain)
        torch.testing.assert_close(action_loss(model, {**batch, "weight": torch.tensor([1.0, 0.0])})[0], first)


def test_keyframe_weight_is_recorded_kept_on_resume_and_checked(tmp_path, capsys):
    demos = tmp_path / "demos.hdf5"
    write_demos(demos)  # the gripper command changes once per episode, at frame 6 of 12
    out = tmp_path / "kf"
    assert run_train(demos, out, 20, extra=("--keyframe-weight", "4", "--keyframe-window", "3")) == 0
    config = json.loads((out / "train_info.json").read_text())["train_config"]
    assert (config["keyframe_weight"], config["keyframe_window"]) == (4.0, 3)
    assert run_train(demos, out, 30, resume=True) == 0  # resumed without the flags: still weighted
    assert json.loads((out / "train_info.json").read_text())["train_config"]["keyframe_weight"] == 4.0
    capsys.readouterr()
    for flags, message in ((("--keyframe-weight", "0"), "--keyframe-weight must be a positive number, got 0.0"),
                           (("--keyframe-weight", "nan"), "--keyframe-weight must be a positive number, got nan"),
                           (("--keyframe-window", "0"), "--keyframe-window must be >= 1 frame, got 0"),
                           (("--arch", "openvla", "--keyframe-weight", "2"), "--keyframe-weight is for --arch vla")):
        assert run_train(demos, tmp_path / "bad", 10, extra=flags) == 2
        assert message in capsys.readouterr().err
    assert not (tmp_path / "bad").exists()


def test_no_gripper_state_masks_it_when_training_and_fine_tuning(tmp_path, capsys):
    demos = tmp_path / "demos.hdf5"
    write_demos(demos)
    assert run_train(demos, tmp_path / "plain", 10) == 0
    assert VLA.from_pretrained(tmp_path / "plain").config.masked_state == ()
    # fine-tuning a target that read it (a DAgger round's fine-tunes keep the mask: they start from the actor)
    assert run_train(demos, tmp_path / "tuned", 10, extra=("--no-gripper-state", "--init-from",
                                                            str(tmp_path / "plain"))) == 0
    assert VLA.from_pretrained(tmp_path / "tuned").config.masked_state == (3,)  # after mw's end-effector xyz
    assert json.loads((tmp_path / "tuned" / "train_info.json").read_text())["model_config"]["masked_state"] == [3]
    assert run_train(demos, tmp_path / "tuned", 20, resume=True) == 0  # resumed without the flag: still masked
    assert VLA.from_pretrained(tmp_path / "tuned").config.masked_state == (3,)
    capsys.readouterr()
    assert run_train(demos, tmp_path / "plain", 20, resume=True, extra=("--no-gripper-state",)) == 2
    assert "--no-gripper-state on --resume: the run was started reading the gripper opening" in capsys.readouterr().err


def test_absmax_action_bounds_keep_a_rare_large_action_and_rebin_a_fine_tune(tmp_path, capsys):
    """A move made in one frame of 96 is clipped to about a twentieth by OpenVLA's q01/q99 bins; with absmax
    bounds it decodes to within half a bin and a zero action to zero. Fine-tuning with the flag
    recomputes the bins from its demonstrations; a resumed run keeps its own and refuses others."""
    demos = tmp_path / "demos.hdf5"
    write_demos(demos)
    with h5py.File(demos, "r+") as f:
        f["data/demo_0/actions"][3, 2] = 0.9  # dimension 2 is zero everywhere else
        recorded = np.concatenate([f[f"data/demo_{i}/actions"][()] for i in range(8)])
    assert run_train(demos, tmp_path / "plain", 10) == 0
    plain = VLA.from_pretrained(tmp_path / "plain")
    assert plain.norm_stats.extra["action_bounds"] == "quantile"
    rare = np.array([[0.0, 0.0, 0.9, 0.0]])
    assert plain.action_tokenizer.decode(plain.action_tokenizer.encode(rare))[0, 2] < 0.1

    assert run_train(demos, tmp_path / "tuned", 10, extra=("--init-from", str(tmp_path / "plain"),
                                                            "--action-bounds", "absmax")) == 0
    tuned = VLA.from_pretrained(tmp_path / "tuned")
    tok, m = tuned.action_tokenizer, np.abs(recorded).max(0)
    np.testing.assert_allclose(tuned.norm_stats.q99, m, rtol=1e-6)
    np.testing.assert_allclose(tuned.norm_stats.q01, -m, rtol=1e-6)
    assert tuned.norm_stats.extra["action_bounds"] == "absmax"
    half_bin = (m + 1e-8) / (tok.n_bins - 1)
    assert (np.abs(tok.decode(tok.encode(recorded)) - recorded) <= half_bin + 1e-6).all()
    assert (np.abs(tok.decode(tok.encode(np.zeros((1, 4))))) < 1e-7).all()  # 0, but for OpenVLA's 1e-8 guard
    np.testing.assert_array_equal(tuned.norm_stats.state_mean, plain.norm_stats.state_mean)  # the checkpoint's

    assert run_train(demos, tmp_path / "tuned", 20, resume=True) == 0  # resumed without the flag: its own bins
    np.testing.assert_array_equal(VLA.from_pretrained(tmp_path / "tuned").norm_stats.q99, tuned.norm_stats.q99)
    capsys.readouterr()
    assert run_train(demos, tmp_path / "tuned", 30, resume=True, extra=("--action-bounds", "quantile")) == 2
    assert "--action-bounds quantile on --resume: the run in" in capsys.readouterr().err
    assert run_train(demos, tmp_path / "bad", 10, extra=("--arch", "openvla", "--action-bounds", "absmax")) == 2
    assert "--action-bounds is for --arch vla" in capsys.readouterr().err


def test_train_vla_offers_the_datasets_action_bounds():
    from heisd.commands.train_vla import ACTION_BOUNDS
    from heisd.data import dataset

    assert ACTION_BOUNDS == dataset.ACTION_BOUNDS
