"""The EAGLE-style draft model of the SpecVLA baseline, its tree proposer and its training."""

from heisd.drafter.model import Drafter, DrafterConfig, DrafterError, DrafterTarget
from heisd.drafter.proposer import DrafterProposer, TreeConfig

__all__ = ["Drafter", "DrafterConfig", "DrafterError", "DrafterProposer", "DrafterTarget", "TreeConfig"]
