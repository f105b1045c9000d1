"""`heisd robot piper`'s loop against a simulated arm (no PIPER here) and a real heisd server on
127.0.0.1: the limits on every command, the fixed rate, what reaches the server, and each stop."""

from __future__ import annotations

import json
import threading
import time

import numpy as np
import pytest
from test_serve import CONFIG, REACH, built, heisd_method  # noqa: F401

from heisd.client import PolicyClient, connect
from heisd.robots.arm import ArmState, SimulatedArm
from heisd.robots.camera import CameraTimeout
from heisd.robots.control import ControlConfig, Workspace, next_command, proprio, run_loop
from heisd.runtime.methods import MethodConfig, build_decoders
from heisd.runtime.policy import VLAPolicy
from heisd.serving.launch import ServerThread, make_service

FAST = ControlConfig(rate_hz=50.0, max_steps=6, request_timeout_s=5.0)
pytestmark = pytest.mark.filterwarnings("ignore:connect\\(\\) must be used as a context manager:DeprecationWarning")


def frame(_max_age_s: float) -> np.ndarray:
    return np.full((16, 16, 3), 120, np.uint8)


class Recording:
    """A real client whose calls are kept (what the loop sent), and whose replies can be corrupted."""

    def __init__(self, client, corrupt=None):
        self.client, self.corrupt, self.sent = client, corrupt, []

    def act(self, image, instruction, **fields):
        self.sent.append((image, fields))
        step = self.client.act(image, instruction, **fields)
        return step if self.corrupt is None else self.corrupt(step)

    def end(self, episode_id, success=None):
        return self.client.end(episode_id, success)


@pytest.fixture(scope="module")
def server(built):
    vla, tmp = built
    with ServerThread(*make_service(vla, MethodConfig("ar"), CONFIG, "vla"), protocols=("rest", "openpi")) as s:
        yield s


def test_commands_respect_speed_workspace_and_gripper_limits():
    cfg = ControlConfig(rate_hz=10.0, max_speed_mps=0.05, max_rotation_dps=30.0, position_scale_m=0.01,
                        rotation_scale_deg=5.0, workspace=Workspace((0.1, -0.3, 0.05), (0.5, 0.3, 0.45)))
    state = ArmState(np.array([0.3, 0.0, 0.2]), np.array([0.0, 85.0, 179.0]), 0.07, age_s=0.0)
    hold = np.array([0.0, 85.0, 0.0])
    pos, rot, grip, cut = next_command(state, np.array([0.2, -0.1, 0.0, -1.0]), hold, cfg)  # 2 mm, 1 mm: under the cap
    np.testing.assert_allclose(pos, [0.302, -0.001, 0.2])
    assert not cut and grip == 0.07 and rot is hold  # 4 values: orientation held, gripper open (-1 <= 0)
    pos, _, grip, cut = next_command(state, np.array([30.0, 40.0, 0.0, 1.0]), hold, cfg)  # 0.5 m asked, 5 mm allowed
    np.testing.assert_allclose(pos - state.position_m, [0.003, 0.004, 0.0])
    assert cut and grip == 0.0
    edge = ArmState(np.array([0.499, 0.0, 0.06]), state.rotation_deg, 0.0, 0.0)
    pos, _, _, cut = next_command(edge, np.array([0.3, 0.0, -0.2, 0.0]), hold, cfg)  # 3 mm out, 2 mm down
    np.testing.assert_allclose(pos, [0.5, 0.0, 0.058])
    assert cut  # x stopped at the box
    _, rot, _, cut = next_command(state, np.array([0, 0, 0, 0.2, -10.0, 1.0, 0]), hold, cfg)  # 7 values
    np.testing.assert_allclose(rot, [1.0, 82.0, -178.0])  # 3 deg/tick caps RY and RZ; RZ wraps past 180
    assert cut
    np.testing.assert_allclose(proprio(state), [0.3, 0.0, 0.2, 0.0, np.deg2rad(85.0), np.deg2rad(179.0), 0.07],
                               rtol=1e-6)


@pytest.mark.parametrize("url", ["url", "ws_url"])
def test_loop_runs_the_served_policy_at_its_rate(built, server, url):
    """6 ticks, chunk 2: 3 inferences, each action a limited command; what the server saw equals an
    in-process policy fed the same frames, states and end-effector paths."""
    vla, _ = built
    arm = SimulatedArm(clock=time.monotonic)
    arm.connect()
    client = Recording(connect(getattr(server, url), timeout=5.0))
    report = run_loop(arm, frame, client, REACH, FAST, takes_state=True, action_dim=4)
    assert report.stopped is None and report.ticks == 6 and report.inferences == 3
    assert len(arm.commands) == 6 and arm.stopped
    for position, _, _ in arm.commands:
        assert np.all(position >= FAST.workspace.low_m) and np.all(position <= FAST.workspace.high_m)
    policy = VLAPolicy(vla, build_decoders(MethodConfig("ar"), vla))
    policy.reset(REACH, "reach-v3")
    for i, (image, fields) in enumerate(client.sent):
        assert fields["reset"] == (i == 0) and fields["proprio"].shape == (7,)
        assert len(fields["ee_pos"]) == (1 if i == 0 else 2)  # one position per executed action
        actions, _ = policy.act(image, fields["proprio"], fields["ee_pos"])
        if i < 2:
            executed = arm.commands[2 * i: 2 * i + 2]
            for action, (position, _, gripper) in zip(actions, executed):
                assert gripper == (FAST.gripper_closed_m if action[-1] > 0 else FAST.gripper_open_m)
    assert not server.service.sessions.open  # the episode was ended


def _stopped(client, arm, cfg=FAST, camera=frame, **kwargs):
    arm.connect()
    report = run_loop(arm, camera, client, REACH, cfg, takes_state=True, action_dim=4, **kwargs)
    assert arm.stopped  # every way out stops the arm
    return report


class FaultAfter(SimulatedArm):
    def __init__(self, commands: int, fault: str):
        super().__init__()
        self.after, self.fault = commands, fault

    def command(self, *args):
        super().command(*args)
        if len(self.commands) == self.after:
            getattr(self, self.fault)()


def test_faults_stop_the_arm(built, server):
    client = PolicyClient(server.url, timeout=5.0)
    report = _stopped(client, FaultAfter(3, "poison"))
    assert "not finite" in report.stopped and report.ticks == 3
    report = _stopped(client, FaultAfter(2, "freeze_feedback"), ControlConfig(rate_hz=50.0, feedback_timeout_s=0.05))
    assert "s old (limit 0.05 s)" in report.stopped and 2 <= report.ticks < 6  # within the timeout of the freeze

    def nan(step):
        step.actions[1, 0] = np.nan
        return step

    report = _stopped(Recording(client, nan), SimulatedArm())
    assert "non-finite action" in report.stopped and report.ticks == 0

    def camera_dies(_max_age_s, calls=[]):  # noqa: B006 (counts calls)
        calls.append(1)
        if len(calls) > 1:
            raise CameraTimeout("camera 0: no frame yet (limit 0.5 s)")
        return frame(0)

    report = _stopped(client, SimulatedArm(), camera=camera_dies)
    assert report.stopped.startswith("camera:") and report.ticks == 2
    assert not server.service.sessions.open


def test_a_slow_or_failing_server_stops_the_arm(built, server):
    started, release = threading.Event(), threading.Event()
    server.service.worker.submit(lambda: (started.set(), release.wait(30)))  # the model is busy
    assert started.wait(10)
    try:
        report = _stopped(PolicyClient(server.url, timeout=0.3), SimulatedArm())
    finally:
        release.set()
    assert report.stopped.startswith("server: no answer") and report.ticks == 0
    report = _stopped(PolicyClient(server.url, timeout=5.0), SimulatedArm(), task="fly-v3")
    assert report.stopped == "server: HTTP 422: task: unknown 'fly-v3'; known: " + ", ".join(
        server.service.facts.tasks)


def test_the_command_drives_a_simulated_arm_from_a_video_file(built, server, tmp_path, capsys):
    """`heisd robot piper --dry-run`: OpenCV reads a real video file (written here by OpenCV), the
    simulated arm stands in for the PIPER, the policy is the served one."""
    import cv2

    from heisd.cli import main

    video = tmp_path / "camera.avi"
    writer = cv2.VideoWriter(str(video), cv2.VideoWriter_fourcc(*"MJPG"), 30.0, (32, 24))
    rng = np.random.default_rng(0)
    for _ in range(10):
        writer.write(rng.integers(0, 256, (24, 32, 3), dtype=np.uint8))
    writer.release()
    assert main(["robot", "piper", "--dry-run", "--server", server.ws_url, "--instruction", REACH,
                 "--camera", str(video), "--image-size", "16", "--ticks", "4", "--rate-hz", "40"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["robot"] == "simulated" and report["ticks"] == 4 and report["inferences"] == 2
    assert report["stopped"] is None and report["request_ms"]["p50"] > 0
    assert main(["robot", "piper", "--dry-run", "--server", server.url, "--instruction", REACH,
                 "--camera", str(tmp_path / "missing.avi"), "--ticks", "1"]) == 1
    assert "OpenCV cannot open it" in capsys.readouterr().err
    assert main(["robot", "piper", "--dry-run", "--server", server.url, "--instruction", REACH,
                 "--execute", "3"]) == 2
    assert "--execute 3 exceeds the target's action chunk (2)" in capsys.readouterr().err
