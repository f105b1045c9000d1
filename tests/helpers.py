"""Builders shared by the tests: tiny random targets, small demonstration files."""

from __future__ import annotations

import json
from pathlib import Path

import h5py
import numpy as np
import torch

from heisd.benchmarks.mw import STATE_DIM, TASKS
from heisd.targets.vla import VLA, NormStats, TextTokenizer, VLAConfig

TINY = {"hidden_size": 32, "n_layers": 1, "n_heads": 4, "intermediate_size": 64, "image_size": 16,
        "vision_channels": (8, 16), "max_positions": 64}


def tiny_vla(seed: int = 0, instructions: list[str] | None = None, state_dim: int = STATE_DIM, views: int = 1) -> VLA:
    """A random tiny VLA whose greedy tokens are always action tokens, with wide logit margins
    (so batched and single-row greedy decoding agree); `views` 2 reads a wrist camera too."""
    torch.manual_seed(seed)
    text = TextTokenizer.train(instructions or [t.instruction for t in TASKS.values()])
    norm = NormStats(q01=-np.ones(4), q99=np.ones(4), state_mean=np.zeros(state_dim), state_std=np.ones(state_dim))
    vla = VLA(VLAConfig(text_vocab_size=text.vocab_size, state_dim=state_dim, views=views, **TINY), norm, text).eval()
    with torch.no_grad():
        w = vla.llm.lm_head.weight
        w.normal_(0.0, 3.0)
        w[: vla.config.vocab_size - vla.config.n_bins] = 0.0  # text ids never win
        w[vla.config.vocab_size :] = 0.0  # nor the padding rows
    return vla


def save_tiny_drafter(vla, path: Path, seed: int | None = None) -> Path:
    """A random drafter of `vla`'s EAGLE shape saved at `path` (what loading and timing need, not good drafts)."""
    from heisd.drafter import Drafter, DrafterConfig, DrafterTarget

    target = DrafterTarget.from_target(vla)
    if seed is not None:
        torch.manual_seed(seed)
    Drafter(DrafterConfig.for_target(target), target).save_pretrained(path)
    return path


def write_demo_file(path: Path, tasks: list[str], episodes: int = 2, steps: int = 20, size: int = 16) -> None:
    """Random frames and a smooth end-effector path, in the LIBERO/robomimic layout."""
    rng = np.random.default_rng(0)
    with h5py.File(path, "w") as f:
        data = f.create_group("data")
        data.attrs["benchmark"] = "mw"
        data.attrs["env_args"] = "{}"
        i = 0
        for task in tasks:
            for _ in range(episodes):
                g = data.create_group(f"demo_{i}")
                g.attrs.update(task=task, instruction=TASKS[task].instruction, success=True)
                g["actions"] = rng.uniform(-1, 1, (steps, 4)).astype(np.float32)
                g["obs/agentview_rgb"] = rng.integers(0, 256, (steps, size, size, 3), dtype=np.uint8)
                t = np.linspace(0, 1, steps)[:, None]
                g["obs/ee_pos"] = (np.array([0.0, 0.6, 0.2]) + t * rng.normal(0, 0.1, 3)).astype(np.float32)
                g["obs/gripper_states"] = np.ones((steps, 1), np.float32)
                g["obs/goal_pos"] = np.repeat(rng.normal(0, 0.1, (1, 3)), steps, 0).astype(np.float32)
                i += 1


LIBERO_INSTRUCTIONS = ("put the black bowl on the plate", "open the top drawer of the cabinet")


def write_libero_demo_file(path: Path, episodes: int = 2, steps: int = 20, size: int = 64, seed: int = 0) -> None:
    """Random frames, 7-D actions (6 deltas in [-1, 1], gripper -1/+1) and a smooth end-effector
    path in the LIBERO layout: 2-D gripper states, no goal position, two instructions."""
    rng = np.random.default_rng(seed)
    with h5py.File(path, "w") as f:
        data = f.create_group("data")
        data.attrs["benchmark"] = "libero_spatial"
        data.attrs["env_args"] = "{}"
        for i in range(episodes):
            g = data.create_group(f"demo_{i}")
            instruction = LIBERO_INSTRUCTIONS[i % len(LIBERO_INSTRUCTIONS)]
            g.attrs.update(task=instruction.replace(" ", "_"), instruction=instruction, success=True)
            grip = np.where(np.arange(steps) < steps // 2, -1.0, 1.0)[:, None]
            g["actions"] = np.concatenate([rng.uniform(-1, 1, (steps, 6)), grip], 1).astype(np.float32)
            g["obs/agentview_rgb"] = rng.integers(0, 256, (steps, size, size, 3), dtype=np.uint8)
            t = np.linspace(0, 1, steps)[:, None]
            g["obs/ee_pos"] = (np.array([0.0, 0.2, 1.0]) + t * rng.normal(0, 0.1, 3)).astype(np.float32)
            g["obs/gripper_states"] = np.repeat(np.array([[0.04, -0.04]]), steps, 0).astype(np.float32)


def write_libero_layout_file(path: Path, task: str, suite: str, instruction: str, episodes: int = 2,
                             steps: int = 6, size: int = 256, seed: int = 0, wrist: bool = False) -> None:
    """A `<task>_demo.hdf5` in LIBERO's own layout (as `heisd demos` records LIBERO): random frames stored
    upside down, 7-D actions with the gripper at -1 (open) then +1 (closed); `wrist`: the wrist camera's
    frames too (`heisd demos --wrist`)."""
    rng = np.random.default_rng(seed)
    with h5py.File(path, "w") as f:
        data = f.create_group("data")
        data.attrs["problem_info"] = json.dumps({"problem_name": "libero_tabletop_manipulation",
                                                 "language_instruction": instruction})
        data.attrs["bddl_file_name"] = f"libero/libero/bddl_files/{suite}/{task}.bddl"
        data.attrs["env_args"] = json.dumps({"type": 1})
        data.attrs["num_demos"] = episodes
        for i in range(episodes):
            g = data.create_group(f"demo_{i}")
            grip = np.where(np.arange(steps) < steps // 2, -1.0, 1.0)[:, None]
            g["actions"] = np.concatenate([rng.uniform(-0.9, 0.9, (steps, 6)), grip], 1).astype(np.float32)
            g["obs/agentview_rgb"] = rng.integers(0, 256, (steps, size, size, 3), dtype=np.uint8)
            if wrist:
                g["obs/eye_in_hand_rgb"] = rng.integers(0, 256, (steps, size, size, 3), dtype=np.uint8)
            g["obs/ee_pos"] = rng.normal(0, 0.1, (steps, 3)).astype(np.float32)
            g["obs/gripper_states"] = np.repeat(np.array([[0.04, -0.04]]), steps, 0).astype(np.float32)
            g["states"] = rng.normal(size=(steps, 10))
            g.attrs["success"] = True
