"""`PiperArm` through the real piper_sdk, on python-can's in-process virtual bus, against a CAN-level
stand-in for the PIPER's controller: it reports its pose, gripper and motor states in the frames the
SDK decodes (big-endian int32 pose in 0.001 mm / 0.001 degree on 0x2A2-0x2A4, gripper on 0x2A8,
motor status with the enable bit on 0x261-0x266), and takes the SDK's enable, mode, end-pose and
gripper commands (0x471, 0x151, 0x152-0x154, 0x159, 0x150). No PIPER was at hand: this checks our
use of the SDK (units, calls, stop), not the arm."""

from __future__ import annotations

import struct
import threading
import time
import uuid

import numpy as np
import pytest

can = pytest.importorskip("can")
pytest.importorskip("piper_sdk")
# piper_sdk 0.6.2 opens the bus with python-can's deprecated `bustype` argument
pytestmark = pytest.mark.filterwarnings("ignore:The 'bustype' argument is deprecated:DeprecationWarning")

from heisd.robots.piper import ArmError, PiperArm, PiperConfig  # noqa: E402


class PiperStandIn:
    """The controller's side of the bus: feedback every 5 ms, commands applied at once."""

    def __init__(self, channel: str, enables: bool = True):
        self.bus = can.Bus(interface="virtual", channel=channel, receive_own_messages=False)
        self.pose = [300_000, -20_000, 250_000, 1_000, 85_000, -179_500]  # 0.001 mm / 0.001 deg
        self.gripper = 50_000  # 0.001 mm
        self.enables, self.enabled, self.estop = enables, False, False
        self.modes: list[tuple[int, int, int]] = []  # (ctrl mode, move mode, speed %) of each 0x151
        self.grips: list[tuple[int, int, int]] = []  # (stroke, effort, code) of each 0x159
        self.poses: list[list[int]] = []  # each complete end-pose command
        self.reporting = True
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def close(self) -> None:
        self._stop.set()
        self._thread.join(2)
        self.bus.shutdown()

    def _send(self, arbitration_id: int, data: bytes) -> None:
        self.bus.send(can.Message(arbitration_id=arbitration_id, data=data, is_extended_id=False))

    def _report(self) -> None:
        x, y, z, rx, ry, rz = self.pose
        self._send(0x2A2, struct.pack(">ii", x, y))
        self._send(0x2A3, struct.pack(">ii", z, rx))
        self._send(0x2A4, struct.pack(">ii", ry, rz))
        self._send(0x2A8, struct.pack(">ihBB", self.gripper, 500, 0, 0))
        status = 1 << 6 if self.enabled else 0  # the driver-enabled bit the SDK reads
        for motor in range(6):
            self._send(0x261 + motor, struct.pack(">HhbBH", 240, 30, 30, status, 0))

    def _run(self) -> None:
        pending: dict[int, tuple[int, int]] = {}
        next_report = 0.0
        while not self._stop.is_set():
            if self.reporting and time.monotonic() >= next_report:
                self._report()
                next_report = time.monotonic() + 0.005
            msg = self.bus.recv(0.001)
            if msg is None:
                continue
            data = bytes(msg.data)
            if msg.arbitration_id == 0x471 and data[1] == 0x02 and self.enables:
                self.enabled = True
            elif msg.arbitration_id == 0x151:
                self.modes.append((data[0], data[1], data[2]))
            elif msg.arbitration_id in (0x152, 0x153, 0x154):
                pending[msg.arbitration_id] = struct.unpack(">ii", data)
                if len(pending) == 3:  # a whole end pose: the arm "moves" there at once
                    self.pose = [*pending[0x152], *pending[0x153], *pending[0x154]]
                    self.poses.append(list(self.pose))
                    pending = {}
            elif msg.arbitration_id == 0x159:
                stroke, effort, code, _ = struct.unpack(">ihBB", data)
                self.grips.append((stroke, effort, code))
                self.gripper = stroke
            elif msg.arbitration_id == 0x150 and data[0] == 0x01:
                self.estop = True


@pytest.fixture
def channel():
    return f"heisd-test-{uuid.uuid4().hex[:8]}"  # the SDK keeps one interface object per CAN name


def _wait(condition, timeout: float = 3.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.005)


def test_piper_arm_reads_and_commands_in_sdk_units(channel):
    arm_side = PiperStandIn(channel)
    arm = PiperArm(PiperConfig(can=channel, bus="virtual", speed_percent=25, gripper_effort=800))
    try:
        arm.connect()  # waits for every motor to report enabled
        _wait(lambda: arm_side.modes and arm_side.grips)  # the frames cross the bus on their own thread
        assert arm_side.enabled and arm_side.modes[0] == (0x01, 0x00, 25)  # CAN control, MOVE P, 25 %
        assert arm_side.grips[0] == (50_000, 800, 0x01)  # the gripper enabled where it is (not closed)
        _wait(lambda: arm.read().age_s < 0.1)
        state = arm.read()
        np.testing.assert_allclose(state.position_m, [0.3, -0.02, 0.25])
        np.testing.assert_allclose(state.rotation_deg, [1.0, 85.0, -179.5])
        assert state.gripper_m == pytest.approx(0.05) and state.finite
        arm.command(np.array([0.3125, 0.0104, 0.2]), np.array([0.5, 84.25, 179.999]), 0.0123)
        _wait(lambda: len(arm_side.poses) == 1 and len(arm_side.grips) == 2)
        assert arm_side.poses[0] == [312_500, 10_400, 200_000, 500, 84_250, 179_999]
        assert arm_side.grips[1] == (12_300, 800, 0x01) and arm_side.modes[-1] == (0x01, 0x00, 25)
        _wait(lambda: np.allclose(arm.read().position_m, [0.3125, 0.0104, 0.2]))
        arm.stop()  # fresh feedback: hold at the reported pose, no emergency stop
        _wait(lambda: len(arm_side.poses) == 2)
        assert arm_side.poses[1] == arm_side.poses[0] and not arm_side.estop
        arm_side.reporting = False  # the link goes quiet: the reading ages, and a stop is an emergency stop
        time.sleep(1.1)
        assert arm.read().age_s > 1.0
        arm.stop()
        _wait(lambda: arm_side.estop)
    finally:
        arm.close()
        arm_side.close()


def test_an_arm_that_never_enables_is_refused(channel):
    arm_side = PiperStandIn(channel, enables=False)
    arm = PiperArm(PiperConfig(can=channel, bus="virtual", enable_timeout_s=0.3))
    try:
        with pytest.raises(ArmError, match="did not report enabled within 0.3 s"):
            arm.connect()
    finally:
        arm.close()
        arm_side.close()
