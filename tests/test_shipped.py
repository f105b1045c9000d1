"""Smoke test of the shipped checkpoints (checkpoints/README.md says how they were made)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from heisd.benchmarks.mw import MetaWorldEnv, MWConfig
from heisd.drafter import Drafter, DrafterTarget
from heisd.runtime.methods import MethodConfig, build_decoders
from heisd.runtime.policy import VLAPolicy
from heisd.targets.vla import VLA
from heisd.targets.vla.train import trained_camera

CHECKPOINTS = Path(__file__).resolve().parents[1] / "checkpoints"


def test_shipped_target_and_drafter_act():
    vla = VLA.from_pretrained(CHECKPOINTS / "vla")
    Drafter.from_pretrained(CHECKPOINTS / "drafter", DrafterTarget.from_target(vla))  # same target fingerprint
    size = sum(f.stat().st_size for f in (CHECKPOINTS / "vla").iterdir()) / 2**20
    assert size <= 25, f"shipped target is {size:.1f} MB"
    env = MetaWorldEnv("reach-v3", MWConfig(camera=trained_camera(CHECKPOINTS / "vla")))
    obs, info = env.reset(seed=0)
    results = {}
    for method in ("ar", "specvla"):
        cfg = MethodConfig(method, drafter=str(CHECKPOINTS / "drafter"))
        policy = VLAPolicy(vla, build_decoders(cfg, vla))
        policy.reset(env.instruction, env.task)
        actions, record = policy.act(obs["image"], obs["state"], info["ee_pos"])
        assert actions.shape == (2, 4) and np.isfinite(actions).all()
        results[method] = record
    assert results["ar"].target_forwards == 8
    # recorded when this target was shipped: a change that moves its tokens shows here
    assert results["ar"].tokens == [538, 367, 433, 494, 537, 367, 433, 494]
    assert results["specvla"].tokens == results["ar"].tokens  # exact acceptance is lossless


@pytest.mark.slow
def test_shipped_target_solves_a_contact_task(tmp_path):
    """Closed loop on held-out layouts: the shipped target picks and places the puck (AR: 20/20 in BENCHMARKS.md)."""
    from heisd.runtime.evaluation import EvalConfig, evaluate

    vla = VLA.from_pretrained(CHECKPOINTS / "vla")
    policy = VLAPolicy(vla, build_decoders(MethodConfig("ar"), vla))
    config = EvalConfig(("pick-place-v3",), episodes=3, seed=5, camera=trained_camera(CHECKPOINTS / "vla"))
    summary = evaluate(policy, "ar", config, tmp_path, progress=False)
    assert summary["sr"] >= 2 / 3
