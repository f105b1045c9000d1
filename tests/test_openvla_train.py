"""`train-vla --arch openvla`: OpenVLA's architecture trained on LIBERO files, saved in its file layout."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from helpers import write_libero_layout_file

from heisd.benchmarks.libero_protocol import openvla_gripper, openvla_gripper_label
from heisd.data.dataset import DemoFormatError
from heisd.errors import UsageError
from heisd.targets.load import load_target
from heisd.targets.openvla.train import OpenVLAShape, action_statistics, train_openvla
from heisd.targets.vla.train import TrainConfig

SOUP = ("pick_up_the_alphabet_soup_and_place_it_in_the_basket", "pick up the alphabet soup and place it in the basket")
MILK = ("pick_up_the_milk_and_place_it_in_the_basket", "pick up the milk and place it in the basket")
TINY = OpenVLAShape(base="tiny")


def _demos(tmp_path, size=256):
    paths = []
    for i, (task, instruction) in enumerate((SOUP, MILK)):
        path = tmp_path / f"{task}_demo.hdf5"
        write_libero_layout_file(path, task, "libero_object", instruction, episodes=3, steps=5, size=size, seed=i)
        paths.append(path)
    return paths


def _cfg(steps):
    return TrainConfig(steps=steps, batch_size=4, lr=1e-3, warmup_steps=1, val_fraction=0.2, eval_every=2,
                       save_every=2)


def test_gripper_labels_are_openvlas_and_invert_back():
    actions = np.array([[0.1, 0, 0, 0, 0, 0, -1.0], [0, 0.2, 0, 0, 0, 0, 1.0]])
    labels = openvla_gripper_label(actions)
    assert labels[:, -1].tolist() == [1.0, 0.0]  # 1 = open, as OpenVLA's LIBERO data
    assert np.allclose(labels[:, :6], actions[:, :6])
    assert openvla_gripper(labels)[:, -1].tolist() == [-1.0, 1.0]


def test_statistics_leave_the_gripper_unnormalized():
    labels = np.random.default_rng(0).uniform(-1, 1, (200, 7))
    stat = action_statistics(labels, 4)
    assert stat["action"]["mask"] == [True] * 6 + [False]
    assert stat["num_transitions"] == 200 and stat["num_trajectories"] == 4
    assert np.allclose(stat["action"]["q01"], np.quantile(labels, 0.01, axis=0))


def test_trained_checkpoint_loads_through_the_native_loader(tmp_path):
    out = tmp_path / "run"
    metrics = train_openvla(_demos(tmp_path), out, _cfg(4), TINY)
    assert metrics["step"] == 4 and np.isfinite(metrics["val_loss"])
    config = json.loads((out / "config.json").read_text())
    assert config["model_type"] == "openvla" and list(config["norm_stats"]) == ["libero_object"]
    assert {p.name for p in out.iterdir()} >= {"model.safetensors", "tokenizer.json", "preprocessor_config.json",
                                               "train_state.pt", "train_info.json", "train_log.jsonl"}
    target = load_target(out)  # OpenVLA's loader: every key and shape checked against config.json
    trained = torch.load(out / "train_state.pt", weights_only=True)["model"]
    loaded = target.state_dict()
    assert set(loaded) == set(trained)
    for key, value in trained.items():  # the file holds the trained weights in bf16, as OpenVLA's do
        assert torch.equal(loaded[key], value.to(torch.bfloat16).float()), key
    info = json.loads((out / "train_info.json").read_text())
    assert info["fingerprint"] == target.fingerprint()  # what drafters and datastores are checked against
    assert target.spec.image_size == 224 and target.spec.protocol == "openvla"


def test_frames_and_labels_are_what_the_protocol_feeds(tmp_path):
    from heisd.benchmarks.libero_protocol import openvla_image
    from heisd.data.dataset import DemoFile
    from heisd.targets.openvla.train import _episodes, new_model, read_frames

    paths = _demos(tmp_path)
    episodes, dropped, invalid, name = _episodes(paths, False, 0.0)
    assert (len(episodes), dropped, invalid, name) == (6, 0, 0, "libero_object")
    stats = {name: action_statistics(np.concatenate([e.labels for e in episodes]), len(episodes))}
    (tmp_path / "m").mkdir()
    model = new_model(tmp_path / "m", TINY.config(stats), seed=0)
    frames = read_frames(episodes[:2], model, workers=1)
    with DemoFile(paths[0]) as f:
        ep = f.episode("demo_0")
    assert torch.equal(frames.images[0], torch.from_numpy(openvla_image(ep.images[0])))
    decoded = model.action_tokenizer.decode(frames.action_ids[:5].numpy())
    tok = model.action_tokenizer  # within a bin of the labels, clipped to q01/q99 as OpenVLA's data is
    clipped = np.clip(ep.actions[:, :6], tok.q01[:6], tok.q99[:6])
    assert np.all(np.abs(decoded[:, :6] - clipped) <= (tok.q99[:6] - tok.q01[:6]) / 255 + 1e-6)
    assert decoded[:, -1].round().tolist() == [1, 1, 0, 0, 0]  # open (1) first, then closed
    prompt = model.parts.prompt.encode(SOUP[1])
    assert frames.prompt_ids[0, -len(prompt):].tolist() == prompt
    assert frames.aux is None  # the auxiliary targets only when asked for
    robot = read_frames(episodes[:2], model, workers=1, robot=True).aux
    with DemoFile(paths[0]) as f:
        ee = f.ee_positions("demo_0")[episodes[0].steps]
    assert robot.shape == (len(frames.images), 3 + 2) and np.allclose(robot[:len(ee), :3].numpy(), ee)


def test_no_op_steps_are_left_out_as_openvlas_data_does():
    from heisd.targets.openvla.train import moving_steps

    a = np.zeros((6, 7))
    a[:, -1] = [-1, -1, 1, 1, 1, 1]
    a[0, 0], a[2, 1], a[3, 2], a[5, 3] = 0.5, 0.01, 0.3, 0.02
    # step 1: still, gripper as before; step 2 closes the gripper; 4 and 5 wait for the fingers
    assert moving_steps(a, 0.1).tolist() == [0, 2, 3]
    assert moving_steps(a, 0.0).tolist() == list(range(6))
    # with the finger positions: step 4's fingers still close (frame 4 -> 5), so it stays; step 5 waits at rest
    fingers = np.array([[0.04, -0.04]] * 4 + [[0.037, -0.037], [0.032, -0.031]])
    assert moving_steps(a, 0.1, fingers).tolist() == [0, 2, 3, 4]
    fingers[3:] = 0.02  # at rest after step 2
    assert moving_steps(a, 0.1, fingers).tolist() == [0, 2, 3]


def test_resume_continues_the_same_run(tmp_path, monkeypatch):
    from heisd.targets.vla import train as train_module

    paths = _demos(tmp_path)
    train_openvla(paths, tmp_path / "straight", _cfg(4), TINY)
    save = train_module._save

    def save_then_die(save_model, out, state):  # a run killed right after its step-2 checkpoint
        save(save_model, out, state)
        if state["step"] == 2:
            raise KeyboardInterrupt

    monkeypatch.setattr(train_module, "_save", save_then_die)
    with pytest.raises(KeyboardInterrupt):
        train_openvla(paths, tmp_path / "resumed", _cfg(4), TINY)
    monkeypatch.setattr(train_module, "_save", save)
    train_openvla(paths, tmp_path / "resumed", _cfg(4), TINY, resume=True)
    a = torch.load(tmp_path / "straight" / "train_state.pt", weights_only=True)["model"]
    b = torch.load(tmp_path / "resumed" / "train_state.pt", weights_only=True)["model"]
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_bad_input_is_refused_and_leaves_nothing(tmp_path):
    from helpers import write_libero_demo_file

    heisd_file = tmp_path / "mw_like.hdf5"
    write_libero_demo_file(heisd_file)
    with pytest.raises(DemoFormatError, match="not a LIBERO demonstration file"):
        train_openvla([heisd_file], tmp_path / "run", _cfg(2), TINY)
    assert not (tmp_path / "run").exists()
    with pytest.raises(UsageError, match="unknown OpenVLA shape"):
        train_openvla(_demos(tmp_path), tmp_path / "run", _cfg(2), OpenVLAShape(base="huge"))
    assert not (tmp_path / "run").exists()


def test_cli_refuses_openvla_outside_libero(tmp_path, capsys):
    from heisd.cli import main

    demos = _demos(tmp_path)
    assert main(["train-vla", "--arch", "openvla", "--benchmark", "mw", "--demos", str(demos[0]),
                 "--out", str(tmp_path / "run")]) != 0
    assert "--benchmark libero" in capsys.readouterr().err


def test_random_crops_center_on_the_eval_crop():
    from heisd.targets.openvla.preprocess import random_resized_crop

    x = torch.arange(64.0).view(1, 1, 8, 8).expand(512, 2, 8, 8).contiguous()
    torch.manual_seed(0)
    out = random_resized_crop(x, 0.9)
    assert out.shape == x.shape and torch.equal(out[:, 0], out[:, 1])  # the views share a box
    assert not torch.allclose(out[0], out[1])  # a box per image
    spans = out[:, 0].amax((1, 2)) - out[:, 0].amin((1, 2))
    assert bool((spans < 63).all())  # every box leaves part of the frame out
    assert torch.allclose(random_resized_crop(x[:2], 1.0), x[:2], atol=1e-4)  # area 1 is the identity


def test_shadows_are_a_libero_recording_setting():
    from heisd.runtime.recording import DemoConfig

    with pytest.raises(UsageError, match="--shadows is a LIBERO setting"):
        DemoConfig(("reach-v3",), 1, shadows=True)
    assert DemoConfig(("pick_up_the_milk_and_place_it_in_the_basket",), 1, benchmark="libero_object",
                      shadows=True).shadows


def test_fine_tuning_keeps_the_checkpoints_statistics_and_tokenizer(tmp_path):
    paths = _demos(tmp_path)
    train_openvla(paths, tmp_path / "base", _cfg(2), TINY)
    train_openvla(paths[:1], tmp_path / "tuned", _cfg(2), TINY, init_from=tmp_path / "base")
    base, tuned = (json.loads((tmp_path / d / "config.json").read_text()) for d in ("base", "tuned"))
    assert tuned == base  # the action bins stay the ones the weights learned, though the data changed
    assert (tmp_path / "tuned" / "tokenizer.json").read_bytes() == (tmp_path / "base" / "tokenizer.json").read_bytes()
    info = json.loads((tmp_path / "tuned" / "train_info.json").read_text())
    assert info["init_from"].endswith("base") and info["fingerprint"] == load_target(tmp_path / "tuned").fingerprint()


def test_a_resampled_patch_embedding_sees_a_patch_as_the_old_one_saw_it_resized():
    import torch.nn.functional as F

    from heisd.targets.openvla.resample import resample_patch_weight, resample_pos_embed

    g = torch.Generator().manual_seed(0)
    w = torch.randn(8, 3, 28, 28, generator=g, dtype=torch.float64)
    x = torch.randn(5, 3, 14, 14, generator=g, dtype=torch.float64)
    new = F.conv2d(x, resample_patch_weight(w, 14), stride=14)
    old = F.conv2d(F.interpolate(x, size=(28, 28), mode="bilinear", align_corners=False), w, stride=28)
    torch.testing.assert_close(new, old)
    pos = torch.randn(1, 4 + 64, 8, generator=g, dtype=torch.float64)  # 4 prefix rows, an 8 x 8 grid
    assert torch.equal(resample_pos_embed(pos, 4, 8), pos)  # the same grid: unchanged
    big = resample_pos_embed(pos, 4, 16)
    assert big.shape == (1, 4 + 256, 8) and torch.equal(big[:, :4], pos[:, :4])
    with pytest.raises(UsageError, match="square grid"):
        resample_pos_embed(pos[:, :-1], 4, 16)


def test_init_from_at_another_patch_size_keeps_every_other_weight(tmp_path):
    from heisd.targets.openvla.load import load_openvla
    from heisd.targets.openvla.resample import resample_patch_weight
    from heisd.targets.openvla.train import STATIC_FILES, _repatched, patch_size

    paths = _demos(tmp_path)
    train_openvla(paths, tmp_path / "base", _cfg(2), OpenVLAShape(base="tiny", patch_size=28))
    base = load_openvla(tmp_path / "base")
    assert patch_size(base) == 28 and base.vision_backbone.featurizer.spec.num_patches == 64
    out = tmp_path / "copy"
    out.mkdir()
    for name in STATIC_FILES:
        (out / name).write_bytes((tmp_path / "base" / name).read_bytes())
    fine = _repatched(base, out, OpenVLAShape(base="tiny", patch_size=14), None)
    assert patch_size(fine) == 14 and fine.vision_backbone.featurizer.spec.num_patches == 256
    old, new = base.state_dict(), fine.state_dict()
    assert set(old) == set(new)
    for key, value in new.items():
        if key.endswith("patch_embed.proj.weight"):
            torch.testing.assert_close(value, resample_patch_weight(old[key], 14))
        elif not key.endswith("pos_embed"):
            assert torch.equal(value, old[key]), key
    train_openvla(paths, tmp_path / "tuned", _cfg(2), OpenVLAShape(base="tiny", patch_size=14),
                  init_from=tmp_path / "base")
    tuned = load_target(tmp_path / "tuned")  # the native loader reads the rewritten config.json
    assert patch_size(tuned) == 14
    assert all(k["patch_size"] == 14 for k in json.loads((tmp_path / "tuned" / "config.json").read_text())[
        "timm_model_kwargs"])


def test_a_patch_size_must_divide_the_frame():
    with pytest.raises(UsageError, match="--patch-size must divide"):
        OpenVLAShape(patch_size=15)


def test_the_auxiliary_state_loss_trains_the_towers_and_is_never_saved(tmp_path):
    """--aux-state-weight: the image tokens also regress the recorded end-effector and finger positions.
    The towers then train differently from a run without it (same seed), the checkpoint holds exactly
    the target's keys (the head lives in train_state.pt only), and a resume must keep the setting."""
    import dataclasses

    paths = _demos(tmp_path)
    train_openvla(paths, tmp_path / "plain", _cfg(3), TINY)
    train_openvla(paths, tmp_path / "aux", _cfg(3), dataclasses.replace(TINY, aux_state_weight=1.0))
    plain = torch.load(tmp_path / "plain" / "train_state.pt", weights_only=True)
    aux = torch.load(tmp_path / "aux" / "train_state.pt", weights_only=True)
    assert set(aux["model"]) == set(plain["model"]) and "aux" in aux and "aux" not in plain
    assert aux["aux"]["head.weight"].shape[0] == 3 + 2  # end-effector xyz, two fingers
    tower = next(k for k in aux["model"] if k.startswith("vision_backbone") and k.endswith("weight"))
    assert not torch.equal(aux["model"][tower], plain["model"][tower])
    target = load_target(tmp_path / "aux")
    assert set(target.state_dict()) == set(aux["model"])
    info = json.loads((tmp_path / "aux" / "train_info.json").read_text())
    assert info["model_config"]["aux_state_weight"] == 1.0
    logged = [json.loads(line) for line in (tmp_path / "aux" / "train_log.jsonl").read_text().splitlines()]
    assert all(m["train_aux_loss"] > 0 for m in logged)  # logged apart from the action loss
    with pytest.raises(UsageError, match="--resume with a different --aux-state-weight"):
        train_openvla(paths, tmp_path / "aux", _cfg(5), TINY, resume=True)
    with pytest.raises(UsageError, match="--aux-state-weight must be >= 0"):
        OpenVLAShape(aux_state_weight=-1.0)
