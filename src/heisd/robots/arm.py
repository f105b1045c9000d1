"""The arm boundary of the robot loops: what a loop reads from an arm and what it commands, in SI
units and one frame, whatever the arm's SDK speaks. `PiperArm` (piper.py) is the AgileX PIPER;
`SimulatedArm` stands in for it in tests and dry runs (`heisd robot piper --dry-run`).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Callable, Protocol

import numpy as np


@dataclass(frozen=True)
class ArmState:
    position_m: np.ndarray  # [3] end-effector position in the arm's base frame, metres
    rotation_deg: np.ndarray  # [3] end-effector orientation as RX, RY, RZ Euler angles, degrees (PIPER's)
    gripper_m: float  # gripper opening, metres
    age_s: float  # how old the reading is (seconds since the arm reported it)

    @property
    def finite(self) -> bool:
        return bool(np.isfinite(self.position_m).all() and np.isfinite(self.rotation_deg).all()
                    and np.isfinite(self.gripper_m))


class Arm(Protocol):
    def connect(self) -> None:
        """Open the link and make the arm ready to take pose commands (enabled, end-pose mode)."""

    def read(self) -> ArmState:
        """The latest end-effector pose and gripper opening the arm reported."""

    def command(self, position_m: np.ndarray, rotation_deg: np.ndarray, gripper_m: float) -> None:
        """Move the end effector to this pose and the gripper to this opening."""

    def stop(self) -> None:
        """Stop moving now (a fault, or the end of the run)."""

    def close(self) -> None:
        """Release the link (the arm stays powered: it holds its pose)."""


class SimulatedArm:
    """An arm that moves toward the commanded pose at a bounded speed, for tests and dry runs.

    Faults can be injected to exercise the loop's stops: `freeze_feedback()` makes readings stale
    (as a dropped CAN link), `poison()` makes them NaN (as a broken encoder)."""

    def __init__(self, position_m=(0.3, 0.0, 0.25), rotation_deg=(0.0, 85.0, 0.0), gripper_m: float = 0.07,
                 speed_mps: float = 0.5, clock: Callable[[], float] = time.monotonic):
        self.position = np.asarray(position_m, dtype=np.float64)
        self.rotation = np.asarray(rotation_deg, dtype=np.float64)
        self.gripper = float(gripper_m)
        self.speed_mps, self.clock = speed_mps, clock
        self.target = (self.position.copy(), self.rotation.copy(), self.gripper)
        self.commands: list[tuple[np.ndarray, np.ndarray, float]] = []  # every command, in order
        self.connected = self.stopped = False
        self._moved_at = self._reported_at = clock()
        self._frozen = self._poisoned = False

    def connect(self) -> None:
        self.connected = True

    def read(self) -> ArmState:
        self._advance()
        if not self._frozen:
            self._reported_at = self.clock()
        pose = (np.full(3, np.nan), np.full(3, np.nan), float("nan")) if self._poisoned else \
            (self.position.copy(), self.rotation.copy(), self.gripper)
        return ArmState(*pose, age_s=self.clock() - self._reported_at)

    def command(self, position_m: np.ndarray, rotation_deg: np.ndarray, gripper_m: float) -> None:
        if not self.connected or self.stopped:
            raise RuntimeError("the simulated arm takes no command: not connected, or stopped")
        self._advance()
        self.target = (np.asarray(position_m, dtype=np.float64).copy(), np.asarray(rotation_deg, np.float64).copy(),
                       float(gripper_m))
        self.commands.append(self.target)

    def stop(self) -> None:
        self._advance()
        self.target = (self.position.copy(), self.rotation.copy(), self.gripper)
        self.stopped = True

    def close(self) -> None:
        self.connected = False

    def freeze_feedback(self) -> None:
        self._frozen = True

    def poison(self) -> None:
        self._poisoned = True

    def _advance(self) -> None:
        now = self.clock()
        step = self.speed_mps * (now - self._moved_at)
        self._moved_at = now
        goal, rotation, gripper = self.target
        gap = goal - self.position
        distance = float(np.linalg.norm(gap))
        self.position = goal.copy() if distance <= step else self.position + gap * (step / distance)
        self.rotation, self.gripper = rotation.copy(), gripper  # orientation and gripper: at once
