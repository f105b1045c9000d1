"""The shipped OpenVLA-architecture LIBERO-Object target (checkpoints/README.md says how it was made):
OpenVLA's file layout, loaded through the native loader, its drafter bound to it, and a step on a
frame as OpenVLA's LIBERO protocol feeds it, the same tokens with every lossless method."""

from __future__ import annotations

import warnings
from pathlib import Path

import numpy as np
import pytest
import torch

from heisd.drafter import Drafter, DrafterTarget
from heisd.runtime.methods import MethodConfig, build_decoders
from heisd.runtime.policy import VLAPolicy
from heisd.targets.load import load_target

SHIPPED = Path(__file__).resolve().parents[1] / "checkpoints" / "libero_object_openvla"
INSTRUCTION = "pick up the cream cheese and place it in the basket"


@pytest.fixture(scope="module")
def target():
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the native loader takes the real layout without a warning
        return load_target(SHIPPED / "vla")


def test_shipped_openvla_target_is_openvlas_layout_and_its_drafter_belongs(target):
    size = sum(f.stat().st_size for f in (SHIPPED / "vla").iterdir()) / 2**20
    assert size <= 25, f"shipped OpenVLA-architecture target is {size:.1f} MB"
    assert target.spec.protocol == "openvla" and target.spec.n_action_tokens == 7 and target.spec.state_dim == 0
    assert target.unnorm_keys == ("libero_object",)
    Drafter.from_pretrained(SHIPPED / "drafter", DrafterTarget.from_target(target))  # refuses another target's


def test_shipped_openvla_target_steps_the_same_with_every_lossless_method(target):
    frame = np.random.default_rng(0).integers(0, 256, (256, 256, 3), dtype=np.uint8)
    tokens = {}
    torch.set_num_threads(1)
    for method in ("ar", "specvla", "jacobi"):
        cfg = MethodConfig(method, drafter=str(SHIPPED / "drafter") if method == "specvla" else None)
        policy = VLAPolicy(target, build_decoders(cfg, target))
        policy.reset(INSTRUCTION)
        actions, record = policy.act(frame, np.zeros(0, np.float32))
        assert actions.shape == (1, 7) and np.isfinite(actions).all()
        tokens[method] = record.tokens
    assert tokens["specvla"] == tokens["ar"] == tokens["jacobi"]
    # recorded when this target was shipped: a change that moves its tokens shows here
    assert tokens["ar"] == [31915] * 7
