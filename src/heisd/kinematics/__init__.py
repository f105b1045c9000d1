"""Kinematic fused metric and the retrieval/drafter hybrid switch (docs/design.md §2.9, §2.10)."""

from heisd.kinematics.cost import CostAwareSwitch, CostSwitchConfig
from heisd.kinematics.metric import (
    KinematicConfig,
    KinematicStats,
    TrajectoryTracker,
    curvature_radius,
    fit_delta_scale,
    fused_metric,
    path_length,
)
from heisd.kinematics.switch import Decision, KinematicSwitch, Mode, Switch, calibrate_threshold

__all__ = [
    "CostAwareSwitch",
    "CostSwitchConfig",
    "Decision",
    "KinematicConfig",
    "KinematicStats",
    "KinematicSwitch",
    "Mode",
    "Switch",
    "TrajectoryTracker",
    "calibrate_threshold",
    "curvature_radius",
    "fit_delta_scale",
    "fused_metric",
    "path_length",
]
