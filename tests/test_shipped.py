"""Smoke test of the shipped checkpoints (checkpoints/README.md says how they were made)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from heisd.benchmarks.mw import MetaWorldEnv
from heisd.drafter import Drafter, DrafterTarget
from heisd.runtime.methods import MethodConfig, build_decoders
from heisd.runtime.policy import VLAPolicy
from heisd.vla import VLA

CHECKPOINTS = Path(__file__).resolve().parents[1] / "checkpoints"


def test_shipped_target_and_drafter_act():
    vla = VLA.from_pretrained(CHECKPOINTS / "vla")
    Drafter.from_pretrained(CHECKPOINTS / "drafter", DrafterTarget.from_vla(vla))  # same target fingerprint
    size = sum(f.stat().st_size for f in (CHECKPOINTS / "vla").iterdir()) / 2**20
    assert size <= 25, f"shipped target is {size:.1f} MB"
    env = MetaWorldEnv("reach-v3")
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
    assert results["specvla"].tokens == results["ar"].tokens  # exact acceptance is lossless
