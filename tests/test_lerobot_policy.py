"""The LeRobot policy adapter on LeRobot's batch layout ("observation.images.<cam>" float [B, 3, H, W]
in [0, 1], "observation.state" [B, S], "task"), in process and through a heisd server (REST and
openpi's websocket). The `lerobot` package itself is not installed: no release imports beside
torch 2.13 on Python 3.11 (README, "LeRobot")."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from dataclasses import replace

from test_serve import CONFIG, DRAWER, REACH, built, fresh_policy  # noqa: F401
from test_serve import heisd_method as threshold_method

from heisd.robots.lerobot_policy import HeiSDPolicy, LeRobotAdapterConfig
from heisd.serving.launch import ServerThread, make_service

pytestmark = pytest.mark.filterwarnings("ignore:connect\\(\\) must be used as a context manager:DeprecationWarning")
TASKS = {REACH: "reach-v3", DRAWER: "drawer-close-v3"}


def heisd_method(tmp):
    """HeiSD with no timing-driven choice: the threshold switch, and plain AR after a rejected group
    (the cost fallback picks by measured time, so a policy's second episode could choose otherwise)."""
    return replace(threshold_method(tmp), retrieval_fallback="ar")


def batches(seed: int, n: int, rows: list[str]) -> list[dict]:
    """n LeRobot batches: uint8 frames as floats in [0, 1] (exact on the way back), a moving state."""
    rng = np.random.default_rng(seed)
    out = []
    for i in range(n):
        frames = rng.integers(0, 256, (len(rows), 3, 16, 16), dtype=np.uint8)
        state = np.zeros((len(rows), 7), np.float32)
        state[:, 0] = 0.01 * i
        state[:, 1] = 0.6 + 0.05 * np.sin(0.4 * i + np.arange(len(rows)))
        state[:, 2], state[:, 3] = 0.2, 1.0
        out.append({"observation.images.corner": torch.from_numpy(frames).float() / 255,
                    "observation.state": torch.from_numpy(state), "task": list(rows)})
    return out


def expected_actions(vla, method, calls: list[dict], n_steps: int) -> list[np.ndarray]:
    """What each select_action call must return, from one VLAPolicy per row fed by hand: an inference
    every n_steps calls, with the end-effector positions of the calls since the last one as ee_path."""
    rows = calls[0]["task"]
    policies = [fresh_policy(vla, method) for _ in rows]
    for policy, instruction in zip(policies, rows):
        policy.reset(instruction, TASKS[instruction])
    out, queue, path = [], [], [[] for _ in rows]
    for batch in calls:
        state = batch["observation.state"].numpy()
        for r in range(len(rows)):
            path[r].append(state[r, :3].astype(np.float64))
        if not queue:
            chunks = []
            for r, policy in enumerate(policies):
                image = (batch["observation.images.corner"][r].numpy().transpose(1, 2, 0) * 255).round().astype(np.uint8)
                chunks.append(policy.act(image, state[r], np.stack(path[r]))[0][:n_steps])
                path[r] = []
            queue = [np.stack([c[k] for c in chunks]) for k in range(n_steps)]
        out.append(queue.pop(0))
    return out


@pytest.mark.parametrize("n_steps", [2, 1])
def test_in_process_rows_are_independent_episodes(built, n_steps):
    vla, tmp = built
    method = heisd_method(tmp)
    calls = batches(0, 16, [REACH, DRAWER])  # 16 positions: the kinematic window (15) fills
    policy = HeiSDPolicy.in_process(vla, method, LeRobotAdapterConfig(n_action_steps=n_steps))
    policy.reset()
    got = [policy.select_action(batch) for batch in calls]
    assert all(a.shape == (2, 4) and a.dtype == torch.float32 for a in got)
    for a, e in zip(got, expected_actions(vla, method, calls, n_steps)):
        np.testing.assert_allclose(a.numpy(), e, rtol=0, atol=1e-6)  # float32 of the float64 action
    assert policy.last_records[0].metric is not None  # the ee positions reached the kinematic switch
    assert {r.mode for r in policy.last_records} <= {"drafter", "retrieval"}
    rows = policy._rows
    assert rows[0].policy.decoders.drafter is rows[1].policy.decoders.drafter  # one drafter for all rows
    policy.reset()  # a new episode restarts every row: the same calls give the same actions
    again = [policy.select_action(batch) for batch in calls]
    for a, b in zip(got, again):
        torch.testing.assert_close(a, b, rtol=0, atol=0)


@pytest.mark.parametrize("protocols", [("rest",), ("openpi",)])
def test_served_rows_equal_in_process(built, protocols):
    vla, tmp = built
    method = heisd_method(tmp)
    calls = batches(1, 4, [DRAWER, REACH])
    local = HeiSDPolicy.in_process(vla, method)
    with ServerThread(*make_service(vla, method, CONFIG, "vla"), protocols=protocols) as s:
        served = HeiSDPolicy.from_server(s.url if protocols == ("rest",) else s.ws_url)
        for policy in (local, served):
            policy.reset()
        for batch in calls:
            torch.testing.assert_close(served.select_action(batch), local.select_action(batch), rtol=0, atol=0)
        chunk = served.predict_action_chunk(calls[0])
        assert chunk.shape == (2, 2, 4)
        served.end_episode([True, None])  # closes both server episodes
        assert not s.service.sessions.open


def test_batches_it_cannot_read_are_refused_by_name(built):
    vla, tmp = built
    policy = HeiSDPolicy.in_process(vla, heisd_method(tmp))
    good = batches(2, 1, [REACH])[0]
    with pytest.raises(ValueError, match="needs 'task'"):
        policy.select_action({k: v for k, v in good.items() if k != "task"})
    with pytest.raises(KeyError, match="has no image"):
        policy.select_action({k: v for k, v in good.items() if not k.startswith("observation.images")})
    with pytest.raises(ValueError, match="observation.state: 6 values, the target takes 7"):
        policy.select_action({**good, "observation.state": good["observation.state"][:, :6]})
    with pytest.raises(ValueError, match="n_action_steps 3 exceeds"):
        HeiSDPolicy.in_process(vla, heisd_method(tmp), LeRobotAdapterConfig(n_action_steps=3))
    uint8 = {**good, "observation.images.corner": (good["observation.images.corner"] * 255).round().byte()
             .permute(0, 2, 3, 1)}  # raw env frames, [B, H, W, 3] uint8, work too
    policy.reset()
    a = policy.select_action(uint8)
    policy.reset()
    torch.testing.assert_close(policy.select_action(good), a)
