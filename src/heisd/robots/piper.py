"""The AgileX PIPER arm through `piper_sdk` (installed with `pip install 'heisd[robot]'`, imported
only when a `PiperArm` connects).

The SDK speaks integers: positions in 0.001 mm, angles in 0.001 degree, the gripper's stroke in
0.001 mm and its effort in 0.001 N·m. Pose control is the SDK's end-pose mode: `MotionCtrl_2(0x01
CAN control, 0x00 MOVE P, speed %)` before each `EndPoseCtrl` (as the SDK's own end-pose demo
does), `GripperCtrl(stroke, effort, 0x01 enable, 0)`. Feedback comes from the SDK's reader thread:
`GetArmEndPoseMsgs()` and `GetArmGripperMsgs()`, each with the CAN frame's time stamp.

Not run on hardware: no PIPER was at hand (README, "Robots").
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np

from heisd.errors import HeisdError
from heisd.robots.arm import ArmState

MM = 1e-6  # metres per SDK length unit (0.001 mm)
DEG = 1e-3  # degrees per SDK angle unit (0.001 degree)
HOLD_MAX_AGE_S = 1.0  # stop() holds at the reported pose only if the report is fresher than this


class ArmError(HeisdError):
    """The arm cannot be reached or made ready; the message says what to check."""


@dataclass(frozen=True)
class PiperConfig:
    can: str = "can0"  # the CAN interface the arm is on (piper_sdk's can_activate.sh brings it up)
    # python-can's interface type: "socketcan" (the SDK's default), "slcan" (USB-serial adapters), or
    # "virtual" (python-can's in-process bus: a CAN-level stand-in for the arm, as the tests use)
    bus: str = "socketcan"
    speed_percent: int = 30  # MotionCtrl_2's move speed, % of the arm's maximum
    gripper_effort: int = 1000  # GripperCtrl's effort, 0.001 N·m (the SDK's range is 0-5000)
    enable_timeout_s: float = 5.0  # every motor must report enabled, and feedback flow, within this

    def __post_init__(self) -> None:
        if not 1 <= self.speed_percent <= 100 or not 0 <= self.gripper_effort <= 5000 or not self.enable_timeout_s > 0:
            raise ValueError("need 1 <= speed_percent <= 100, 0 <= gripper_effort <= 5000 and enable_timeout_s > 0; "
                             f"got {self}")


class PiperArm:
    def __init__(self, config: PiperConfig | None = None):
        self.config = config or PiperConfig()
        self.sdk = None

    def connect(self) -> None:
        try:
            from piper_sdk import C_PiperInterface_V2
        except ImportError as err:
            raise ArmError(f"piper_sdk is not installed ({err}): pip install 'heisd[robot]'") from None
        cfg = self.config
        try:
            if cfg.bus == "socketcan":
                sdk = C_PiperInterface_V2(cfg.can)
            else:  # another python-can interface: the SDK opens it through CreateCanBus
                sdk = C_PiperInterface_V2(cfg.can, judge_flag=False, can_auto_init=False)
                sdk.CreateCanBus(cfg.can, bustype=cfg.bus, judge_flag=False)
            sdk.ConnectPort()
        except Exception as err:  # the SDK raises bare exceptions for a missing or down CAN interface
            raise ArmError(f"PIPER on {cfg.can}: cannot open the CAN port ({type(err).__name__}: {err}); "
                           "is the interface up (piper_sdk's can_activate.sh)?") from None
        self.sdk = sdk  # from here on, close() disconnects even if the arm is not made ready
        deadline = time.monotonic() + cfg.enable_timeout_s
        while not sdk.EnablePiper():  # sends EnableArm(7) and reports whether every motor says enabled
            if time.monotonic() > deadline:
                raise ArmError(f"PIPER on {cfg.can}: the motors did not report enabled within "
                               f"{cfg.enable_timeout_s:g} s (emergency stop pressed? arm powered?)")
            time.sleep(0.01)
        while self.read().age_s > 0.5:  # feedback flowing: the gripper is enabled where it reports to be
            if time.monotonic() > deadline:
                raise ArmError(f"PIPER on {cfg.can}: no end-pose or gripper feedback within "
                               f"{cfg.enable_timeout_s:g} s")
            time.sleep(0.01)
        # (the SDK's demos enable it with a stroke of 0, which closes it: not here)
        sdk.GripperCtrl(int(round(max(self.read().gripper_m, 0.0) / MM)), cfg.gripper_effort, 0x01, 0)
        sdk.MotionCtrl_2(0x01, 0x00, cfg.speed_percent, 0x00)  # CAN control, MOVE P (end pose)

    def read(self) -> ArmState:
        pose_msg, grip_msg = self.sdk.GetArmEndPoseMsgs(), self.sdk.GetArmGripperMsgs()
        p = pose_msg.end_pose
        position = np.array([p.X_axis, p.Y_axis, p.Z_axis], dtype=np.float64) * MM
        rotation = np.array([p.RX_axis, p.RY_axis, p.RZ_axis], dtype=np.float64) * DEG
        gripper = grip_msg.gripper_state.grippers_angle * MM
        stamp = min(pose_msg.time_stamp, grip_msg.time_stamp)  # 0 until the first frame: infinitely old
        return ArmState(position, rotation, gripper, age_s=time.time() - stamp if stamp > 0 else float("inf"))

    def command(self, position_m: np.ndarray, rotation_deg: np.ndarray, gripper_m: float) -> None:
        x, y, z = (int(round(v / MM)) for v in position_m)
        rx, ry, rz = (int(round(v / DEG)) for v in rotation_deg)
        self.sdk.MotionCtrl_2(0x01, 0x00, self.config.speed_percent, 0x00)
        self.sdk.EndPoseCtrl(x, y, z, rx, ry, rz)
        self.sdk.GripperCtrl(int(round(max(gripper_m, 0.0) / MM)), self.config.gripper_effort, 0x01, 0)

    def stop(self) -> None:
        """Hold where the arm is (its last reported pose as the target); if that pose cannot be
        trusted (stale or NaN feedback), the SDK's emergency stop (MotionCtrl_1 0x01) instead."""
        if self.sdk is None:
            return
        state = self.read()
        if state.finite and state.age_s < HOLD_MAX_AGE_S:
            self.command(state.position_m, state.rotation_deg, state.gripper_m)
        else:
            self.sdk.EmergencyStop(0x01)

    def close(self) -> None:
        if self.sdk is not None:
            self.sdk.DisconnectPort()  # the motors stay enabled: disabling would drop the arm
            self.sdk = None
