"""Non-finite models must not act: NaN/inf weights are refused at load (small VLA, drafter,
OpenVLA shards), and a model poisoned after loading stops the episode instead of emitting an action."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
import torch
from helpers import save_tiny_drafter, tiny_vla
from safetensors import safe_open
from safetensors.torch import load_file, save_file

from heisd.benchmarks.mw import TASKS
from heisd.cli import main
from heisd.drafter import Drafter, DrafterTarget
from heisd.drafter.model import DrafterError
from heisd.errors import NonFiniteError
from heisd.runtime.methods import MethodConfig, build_decoders
from heisd.runtime.policy import VLAPolicy
from heisd.targets.openvla import load_openvla
from heisd.targets.vla import VLA
from heisd.targets.vla.checkpoint import CheckpointError

REACH = TASKS["reach-v3"].instruction
UP_PROJ = "llm.model.layers.0.mlp.up_proj.weight"


def poison(path, key: str, values: list[float]) -> None:
    """Write `values` into the first entries of tensor `key` of a safetensors file, keeping its metadata."""
    with safe_open(str(path), "pt") as f:
        metadata = f.metadata()
    tensors = load_file(str(path))
    flat = tensors[key].view(-1)
    flat[: len(values)] = torch.tensor(values, dtype=flat.dtype)
    save_file(tensors, str(path), metadata=metadata)


# ----- at load -----

def test_vla_with_a_nan_weight_is_refused_naming_the_tensor(tmp_path, capsys):
    tiny_vla().save_pretrained(tmp_path / "vla")
    weights = tmp_path / "vla" / "model.safetensors"
    poison(weights, UP_PROJ, [float("nan"), float("inf"), -float("inf")])
    message = f"{weights}: tensor '{UP_PROJ}' holds 3 non-finite values (NaN/inf); the checkpoint is corrupt"
    with pytest.raises(CheckpointError) as err:
        VLA.from_pretrained(tmp_path / "vla")
    assert str(err.value) == message
    # the command line: one line, exit 1, before any work
    assert main(["eval", "--target", str(tmp_path / "vla"), "--tasks", "reach-v3", "--out", str(tmp_path / "e")]) == 1
    assert capsys.readouterr().err.strip() == f"heisd eval: error: {message}"
    assert not (tmp_path / "e" / "episodes.jsonl").exists()


def test_drafter_with_a_nan_weight_is_refused_naming_the_tensor(tmp_path):
    vla = tiny_vla()
    save_tiny_drafter(vla, tmp_path / "drafter")
    weights = tmp_path / "drafter" / "model.safetensors"
    key = sorted(load_file(str(weights)))[-1]
    poison(weights, key, [float("nan")])
    with pytest.raises(DrafterError, match=f"{weights}: tensor '{key}' holds 1 non-finite values"):
        Drafter.from_pretrained(tmp_path / "drafter", DrafterTarget.from_target(vla))


@pytest.fixture
def openvla_copy(tiny_openvla_dir, tmp_path):
    path = tmp_path / "ckpt"
    shutil.copytree(tiny_openvla_dir, path)
    key = "language_model.model.layers.0.mlp.up_proj.weight"
    shard = path / json.loads((path / "model.safetensors.index.json").read_text())["weight_map"][key]
    return path, shard, key


def test_openvla_shard_with_nan_is_refused_naming_shard_and_tensor(openvla_copy):
    path, shard, key = openvla_copy
    poison(shard, key, [float("nan")] * 3)
    with pytest.raises(CheckpointError) as err:
        load_openvla(path, unnorm_key="bridge_orig")
    assert str(err.value) == f"{shard}: tensor '{key}' holds 3 non-finite values (NaN/inf); the checkpoint is corrupt"


def test_openvla_weight_beyond_float16_is_refused_in_float16_only(openvla_copy):
    """A finite bfloat16 weight that float16 cannot hold: not corrupt, but that dtype cannot run it."""
    path, shard, key = openvla_copy
    poison(shard, key, [1e6, -1e6])
    with pytest.raises(CheckpointError, match=f"{shard}: tensor '{key}' has 2 values beyond the range of "
                                              r"float16; load the checkpoint in bfloat16 or float32 \(--dtype\)"):
        load_openvla(path, dtype=torch.float16, unnorm_key="bridge_orig")
    load_openvla(path, dtype=torch.float32, unnorm_key="bridge_orig")


# ----- at run time: weights poisoned after loading -----

def policy_after_one_step(method: str = "ar") -> tuple[VLAPolicy, VLA, tuple]:
    vla = tiny_vla()
    policy = VLAPolicy(vla, build_decoders(MethodConfig(method), vla))
    rng = np.random.default_rng(0)
    obs = (rng.integers(0, 256, (16, 16, 3), dtype=np.uint8), np.zeros(7, np.float32))
    policy.reset(REACH, "reach-v3")
    actions, _ = policy.act(*obs)  # control step 0 is fine
    assert np.isfinite(actions).all()
    return policy, vla, obs


def test_nan_layer_weight_stops_the_step_at_the_prefill():
    policy, vla, obs = policy_after_one_step()
    with torch.no_grad():
        vla.llm.model.layers[0].mlp.up_proj.weight[0, 0] = float("nan")
    with pytest.raises(NonFiniteError, match=r"control step 1 of the episode \(drafter mode\): the target produced "
                                             r"non-finite logits \(NaN/inf\) in target pass 1 \(prefill\)"):
        policy.act(*obs)


@pytest.mark.parametrize("method", ["ar", "jacobi"])
def test_nan_action_embeddings_stop_the_step_at_a_verify_pass(method):
    """The prefill reads image and prompt only; the first pass that feeds an action token fails."""
    policy, vla, obs = policy_after_one_step(method)
    with torch.no_grad():
        vla.llm.get_input_embeddings().weight[vla.config.vocab_size - vla.config.n_bins:] = float("inf")
    with pytest.raises(NonFiniteError, match=r"control step 1 .* non-finite logits \(NaN/inf\) in target pass 2 "
                                             r"\(verify\)"):
        policy.act(*obs)


def test_nan_vision_weight_stops_the_step_before_decoding():
    policy, vla, obs = policy_after_one_step()
    with torch.no_grad():
        vla.vision.net[0].weight.fill_(float("nan"))
    with pytest.raises(NonFiniteError, match="control step 1 .* vision pass produced a non-finite retrieval key"):
        policy.act(*obs)
