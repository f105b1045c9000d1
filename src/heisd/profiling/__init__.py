"""Per-piece cost of a target on the current device (`heisd profile`)."""

from heisd.profiling.pieces import ProfileConfig, profile_target, random_drafter
from heisd.profiling.report import format_table
from heisd.profiling.timer import Timing, measure

__all__ = ["ProfileConfig", "Timing", "format_table", "measure", "profile_target", "random_drafter"]
