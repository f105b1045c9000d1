"""The native OpenVLA loader on tiny checkpoints in the real layout: layout, prompt, preprocessing,
action mapping, and one-line errors for broken checkpoints."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file

from heisd.targets import checkpoint_kind, load_target
from heisd.targets.openvla import OpenVLA, load_openvla, write_tiny_openvla
from heisd.targets.openvla.actions import OpenVLAActionTokenizer
from heisd.targets.openvla.load import build_on_meta, read_parts
from heisd.targets.openvla.preprocess import ImagePreprocessor
from heisd.targets.openvla.prompt import PromptEncoder
from heisd.targets.openvla.standin_tokenizer import save_standin_tokenizer
from heisd.targets.openvla.synthetic import config_dict, preprocessor_dict
from heisd.targets.vla import VLA, CheckpointError


def frames(n: int, h: int = 224, w: int = 224, seed: int = 0) -> torch.Tensor:
    return torch.from_numpy(np.random.default_rng(seed).integers(0, 256, (n, h, w, 3), dtype=np.uint8))


def all_keys(directory) -> dict[str, tuple[str, torch.dtype]]:
    keys = {}
    for path in sorted(directory.glob("*.safetensors")):
        with safe_open(str(path), framework="pt") as f:
            for k in f.keys():
                keys[k] = (path.name, f.get_tensor(k).dtype)
    return keys


# ----- the file layout -----
def test_tiny_checkpoint_has_the_real_layout(tiny_openvla_dir):
    names = {p.name for p in tiny_openvla_dir.iterdir()}
    assert {"config.json", "preprocessor_config.json", "tokenizer.json", "tokenizer_config.json",
            "model.safetensors.index.json", "model-00001-of-00002.safetensors",
            "model-00002-of-00002.safetensors"} <= names
    config = json.loads((tiny_openvla_dir / "config.json").read_text())
    assert config["model_type"] == "openvla" and config["n_action_bins"] == 256
    assert config["timm_model_ids"] == ["vit_large_patch14_reg4_dinov2.lvd142m", "vit_so400m_patch14_siglip_224"]
    assert config["text_config"]["vocab_size"] == 32064 and config["pad_to_multiple_of"] == 64
    keys = all_keys(tiny_openvla_dir)
    index = json.loads((tiny_openvla_dir / "model.safetensors.index.json").read_text())["weight_map"]
    assert index == {k: f for k, (f, _) in keys.items()}
    for key in ("vision_backbone.featurizer.blocks.0.ls1.scale_factor", "vision_backbone.featurizer.reg_token",
                "vision_backbone.featurizer.blocks.2.attn.qkv.weight", "vision_backbone.featurizer.norm.weight",
                "vision_backbone.fused_featurizer.attn_pool.latent", "vision_backbone.fused_featurizer.pos_embed",
                "projector.fc1.weight", "projector.fc3.bias", "language_model.model.embed_tokens.weight",
                "language_model.model.layers.1.self_attn.q_proj.weight", "language_model.lm_head.weight"):
        assert key in keys, key
    assert not any(k.endswith(".gamma") for k in keys)
    assert not any("fused_featurizer" in k and "scale_factor" in k for k in keys)  # SigLIP has no LayerScale
    assert {dtype for _, dtype in keys.values()} == {torch.bfloat16}


def test_stand_in_tokenizer_is_a_llama_tokenizer_with_openvla_ids(tiny_openvla):
    tok = tiny_openvla.parts.prompt.tokenizer
    assert type(tok).__name__ == "LlamaTokenizer"
    assert len(tok) == 32001 and tok.pad_token_id == 32000 and tok.bos_token_id == 1
    assert tok.convert_tokens_to_ids("\u2581") == 29871 and tok.convert_tokens_to_ids("<0x0A>") == 13
    assert tiny_openvla.spec.vocab_size == 32000
    first_action = tiny_openvla.spec.vocab_size - tiny_openvla.spec.n_bins
    assert first_action == 31744


def test_openvla_7b_shapes_on_the_meta_device(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps(config_dict("7b")))
    (tmp_path / "preprocessor_config.json").write_text(json.dumps(preprocessor_dict()))
    save_standin_tokenizer(tmp_path)
    model = build_on_meta(read_parts(tmp_path, "bridge_orig"))
    shapes = {k: tuple(v.shape) for k, v in model.state_dict().items()}
    assert all(p.is_meta for p in model.parameters())  # nothing allocated, nothing initialized
    assert shapes["projector.fc1.weight"] == (8704, 2176)
    assert shapes["projector.fc2.weight"] == (4096, 8704) and shapes["projector.fc3.weight"] == (4096, 4096)
    assert shapes["vision_backbone.featurizer.pos_embed"] == (1, 256, 1024)
    assert shapes["vision_backbone.featurizer.reg_token"] == (1, 4, 1024)
    assert shapes["vision_backbone.fused_featurizer.pos_embed"] == (1, 256, 1152)
    assert shapes["vision_backbone.fused_featurizer.blocks.0.mlp.fc1.weight"] == (4304, 1152)
    assert "vision_backbone.featurizer.blocks.22.ls2.gamma" in shapes  # 24 blocks, the last one never runs
    assert "vision_backbone.featurizer.blocks.23.norm1.weight" not in shapes
    assert shapes["language_model.model.embed_tokens.weight"] == (32064, 4096)
    llm = sum(p.numel() for p in model.language_model.parameters())
    assert llm == 6_738_415_616 + 2 * 64 * 4096  # Llama-2-7B + the 64 padded embedding and lm_head rows


# ----- prompt -----
def test_prompt_is_openvlas_with_bos_and_empty_piece(tiny_openvla):
    prompt = tiny_openvla.parts.prompt
    ids = tiny_openvla.encode_prompt("Put the Bowl on the stove")[0].tolist()
    assert ids[0] == 1 and ids[-1] == 29871
    text = prompt.tokenizer.decode(ids[1:-1])
    assert text == "In: What action should the robot take to put the bowl on the stove?\nOut:"


def test_prompt_ids_come_from_the_checkpoints_tokenizer(tiny_openvla_dir, tmp_path):
    save_standin_tokenizer(tmp_path, empty_piece_id=30500)  # the empty piece elsewhere than Llama's 29871
    ids = PromptEncoder.from_dir(tmp_path).encode("open the drawer")
    assert ids[-1] == 30500 and 29871 not in ids


# ----- preprocessing -----
def test_preprocessing_resizes_and_normalizes_each_view(tiny_openvla):
    image = np.zeros((1, 90, 160, 3), dtype=np.uint8)
    image[..., :] = (51, 102, 204)  # a flat color survives any resize filter unchanged
    pixels = tiny_openvla.parts.preprocess(image)
    assert pixels.shape == (1, 6, 224, 224) and pixels.dtype == torch.float32
    rgb = torch.tensor([51, 102, 204]) / 255
    dino = (rgb - torch.tensor([0.485, 0.456, 0.406])) / torch.tensor([0.229, 0.224, 0.225])
    siglip = (rgb - 0.5) / 0.5
    expected = torch.cat([dino, siglip])[:, None, None].expand(6, 224, 224)
    torch.testing.assert_close(pixels[0], expected.float(), atol=1e-6, rtol=0)


def test_preprocessing_from_tvf_params_equals_the_derived_one():
    saved = preprocessor_dict()
    derived = {k: v for k, v in saved.items() if not k.startswith("tvf_")}
    a, b = ImagePreprocessor.from_dict(saved, "saved"), ImagePreprocessor.from_dict(derived, "derived")
    assert a == b
    image = np.random.default_rng(0).integers(0, 256, (2, 256, 200, 3), dtype=np.uint8)
    torch.testing.assert_close(a(image), b(image), atol=0, rtol=0)
    letterbox = ImagePreprocessor.from_dict({**derived, "image_resize_strategy": "letterbox"}, "x")
    assert letterbox.letterbox_fill == (127, 127, 127)  # SigLIP's mean, as the processor keeps the last
    assert letterbox(image).shape == (2, 6, 224, 224)


def test_frames_at_the_input_size_take_the_batched_path_with_the_same_values(tiny_openvla):
    """224 px frames (the LIBERO protocol's) skip PIL: resize and crop are the identity there."""
    from PIL import Image

    pre = tiny_openvla.parts.preprocess
    image = np.random.default_rng(0).integers(0, 256, (3, 224, 224, 3), dtype=np.uint8)
    per_image = torch.stack([pre._one(Image.fromarray(f)) for f in image])  # PIL's resize and crop, then normalize
    torch.testing.assert_close(pre(image), per_image, atol=0, rtol=0)
    assert all(view.keeps(224, 224) for view in pre.views) and not pre.views[0].keeps(256, 256)


# ----- prefix, key, teacher forcing -----
def test_prefix_is_bos_patches_then_prompt_and_key_is_pooled_patches(tiny_openvla):
    images, prompt = frames(2), tiny_openvla.encode_prompt("pick up the black bowl")
    with torch.no_grad():
        prefix, key = tiny_openvla.encode_observation(images, prompt, None)
        patches = tiny_openvla.image_features(images)
        embeds = tiny_openvla.llm.get_input_embeddings()(prompt)[0]
    assert patches.shape == (2, 256, 64)
    assert prefix.shape == (2, 1 + 256 + prompt.shape[1] - 1, 64)
    torch.testing.assert_close(prefix[:, 0], embeds[0].expand(2, -1))
    torch.testing.assert_close(prefix[:, 1:257], patches)
    torch.testing.assert_close(prefix[:, 257:], embeds[1:].expand(2, -1, -1))
    torch.testing.assert_close(key, patches.mean(1))
    with torch.no_grad():
        torch.testing.assert_close(tiny_openvla.retrieval_key(images), key)
        torch.testing.assert_close(tiny_openvla.prefix_embeds(images, prompt), prefix)


def test_teacher_forced_with_left_padded_prompts_matches_each_row_alone(tiny_openvla):
    images = frames(2, seed=3)
    prompts = [tiny_openvla.encode_prompt(t)[0] for t in ("open the drawer", "put the cream cheese in the bowl")]
    width = max(len(p) for p in prompts)
    pad = tiny_openvla.spec.pad_id
    ids = torch.stack([torch.cat([torch.full((width - len(p),), pad), p]) for p in prompts])
    mask = torch.stack([torch.cat([torch.zeros(width - len(p)), torch.ones(len(p))]) for p in prompts]).long()
    actions = torch.randint(31744, 32000, (2, 7), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        batch = tiny_openvla.teacher_forced(images, ids, None, actions, prompt_mask=mask)
        for i, p in enumerate(prompts):
            alone = tiny_openvla.teacher_forced(images[i : i + 1], p[None], None, actions[i : i + 1])
            torch.testing.assert_close(batch.hidden[i], alone.hidden[0], atol=1e-4, rtol=1e-4)
    assert batch.logits.shape == (2, 7, 32064)


# ----- token -> action -----
def test_denormalization_matches_openvlas_formula_on_hand_checked_values():
    q01, q99 = np.array([-1.0, 0.0, 2.0]), np.array([1.0, 4.0, 3.0])
    tok = OpenVLAActionTokenizer(32000, q01, q99, mask=np.array([True, True, False]), n_bins=256)
    # 31872: bin index 127, the center of linspace(-1, 1, 256)'s middle cell: normalized 0.0
    np.testing.assert_allclose(tok.decode(np.array([31872] * 3)), [0.0, 2.0, 0.0], atol=1e-7)
    # 31999: bin index 0, center -1 + 1/255 = -0.99608 (unmasked dims pass it through)
    v = -1 + 1 / 255
    np.testing.assert_allclose(tok.decode(np.array([31999] * 3)),
                               [0.5 * (v + 1) * 2 - 1, 0.5 * (v + 1) * 4, -0.99608], atol=1e-5)
    # 31744 would be bin 255, which OpenVLA clips to 254 (the last of 255 centers)
    np.testing.assert_allclose(tok.decode(np.array([31744, 31745, 31744])), [0.99608, 4 - 4 / 510, 0.99608],
                               atol=1e-5)
    actions = np.array([[0.3, 1.0, 0.9]])
    np.testing.assert_allclose(tok.decode(tok.encode(actions)), actions, atol=4 / 255)


def test_loaded_target_decodes_with_the_chosen_statistics(tiny_openvla):
    stats = tiny_openvla.parts.stats
    assert stats.key == "libero_spatial_no_noops" and stats.mask.tolist() == [True] * 6 + [False]
    out = tiny_openvla.action_tokenizer.decode(np.full(7, 31872))
    np.testing.assert_allclose(out[:6], (stats.q01[:6] + stats.q99[:6]) / 2, atol=1e-6)
    assert out[6] == 0.0  # the gripper stays normalized


# ----- device, dtype, memory -----
def test_single_file_and_bfloat16_loads(tiny_openvla, tmp_path):
    write_tiny_openvla(tmp_path / "one", seed=0, shards=1)
    assert not (tmp_path / "one" / "model.safetensors.index.json").exists()
    single = load_openvla(tmp_path / "one", unnorm_key="bridge_orig")
    for (name, a), (_, b) in zip(single.state_dict().items(), tiny_openvla.state_dict().items()):
        assert torch.equal(a, b), name
    half = load_openvla(tmp_path / "one", dtype=torch.bfloat16, unnorm_key="bridge_orig")
    assert {p.dtype for p in half.parameters()} == {torch.bfloat16}
    with torch.no_grad():
        prefix, key = half.encode_observation(frames(1), half.encode_prompt("open the drawer"), None)
    assert prefix.dtype == torch.bfloat16 and key.dtype == torch.float32


def test_load_target_recognizes_the_checkpoint_kind(tiny_openvla_dir, tmp_path):
    assert checkpoint_kind(tiny_openvla_dir) == "openvla" and checkpoint_kind("checkpoints/vla") == "heisd-vla"
    assert isinstance(load_target(tiny_openvla_dir, unnorm_key="bridge_orig"), OpenVLA)
    assert isinstance(load_target("checkpoints/vla"), VLA)
    with pytest.raises(CheckpointError, match="--unnorm-key applies to OpenVLA"):
        load_target("checkpoints/vla", unnorm_key="bridge_orig")
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "llama"}))
    with pytest.raises(CheckpointError, match="model_type 'llama' is not a supported target"):
        load_target(tmp_path)
    with pytest.raises(CheckpointError, match="nowhere: no such checkpoint directory"):
        load_target(tmp_path / "nowhere")


# ----- broken checkpoints: one line naming the file and the key -----
@pytest.fixture
def broken(tiny_openvla_dir, tmp_path):
    """A fresh copy of the tiny checkpoint to break."""
    path = tmp_path / "ckpt"
    shutil.copytree(tiny_openvla_dir, path)
    return path


def one_line_error(directory, **kwargs) -> str:
    with pytest.raises(CheckpointError) as info:
        load_openvla(directory, **{"unnorm_key": "bridge_orig", **kwargs})
    message = str(info.value)
    assert "\n" not in message
    return message


def test_missing_shard_is_named_with_a_key_it_holds(broken):
    (broken / "model-00002-of-00002.safetensors").unlink()
    message = one_line_error(broken)
    assert "shard model-00002-of-00002.safetensors listed in model.safetensors.index.json is missing" in message
    index = json.loads((broken / "model.safetensors.index.json").read_text())["weight_map"]
    held = sorted(k for k, f in index.items() if f == "model-00002-of-00002.safetensors")
    assert held[0] in message


def test_wrong_shape_and_missing_and_unexpected_keys_are_each_named(broken):
    name = "model-00001-of-00002.safetensors"
    tensors = load_file(str(broken / name))
    shaped, dropped = sorted(tensors)[:2]
    tensors[shaped] = torch.zeros(3, 5, dtype=torch.bfloat16)
    del tensors[dropped]
    tensors["projector.fc4.weight"] = torch.zeros(2, 2)
    save_file(tensors, str(broken / name))
    message = one_line_error(broken)
    assert f"{shaped} in {name}: shape (3, 5), config.json expects" in message
    assert f"missing {dropped}" in message
    assert f"unexpected projector.fc4.weight in {name}" in message


def test_config_that_does_not_match_the_weights_names_every_key(broken):
    config = json.loads((broken / "config.json").read_text())
    config["text_config"]["num_hidden_layers"] = 3
    (broken / "config.json").write_text(json.dumps(config))
    message = one_line_error(broken)
    assert "missing language_model.model.layers.2.self_attn.q_proj.weight" in message
    assert message.count("missing language_model.model.layers.2.") == 9  # every tensor of the layer


def test_corrupt_safetensors_is_named(broken):
    path = broken / "model-00001-of-00002.safetensors"
    path.write_bytes(path.read_bytes()[:1000])
    message = one_line_error(broken)
    assert f"corrupt safetensors file {path}" in message


def test_unknown_unnorm_key_lists_the_available_ones(broken):
    message = one_line_error(broken, unnorm_key="libero_goal")
    assert "unnorm key 'libero_goal' is not in" in message and "bridge_orig, libero_spatial_no_noops" in message
    message = one_line_error(broken, unnorm_key=None)
    assert "choose one with --unnorm-key: bridge_orig, libero_spatial_no_noops" in message


def test_missing_files_and_config_keys_are_named(broken):
    del_key = json.loads((broken / "config.json").read_text())
    del del_key["n_action_bins"]
    (broken / "config.json").write_text(json.dumps(del_key))
    assert "lacks key 'n_action_bins'" in one_line_error(broken)
    (broken / "preprocessor_config.json").unlink()
    (broken / "config.json").write_text(json.dumps(config_dict("tiny")))
    assert "lacks preprocessor_config.json" in one_line_error(broken)
    for f in broken.glob("model*"):
        f.unlink()
    assert "has neither model.safetensors nor model.safetensors.index.json" in one_line_error(broken)


def test_unknown_timm_model_without_kwargs_is_refused(broken):
    config = config_dict("tiny")
    config["timm_model_ids"][0] = "vit_giant_patch14_dinov2"
    config["timm_model_kwargs"][0] = {}
    (broken / "config.json").write_text(json.dumps(config))
    assert "unknown timm model 'vit_giant_patch14_dinov2'" in one_line_error(broken)
