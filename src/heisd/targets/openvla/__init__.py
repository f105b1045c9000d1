"""OpenVLA checkpoints as heisd targets: a native loader (current `transformers`, no remote code)."""

from heisd.targets.openvla.load import load_openvla
from heisd.targets.openvla.model import OpenVLA
from heisd.targets.openvla.synthetic import random_openvla
from heisd.targets.openvla.tiny import write_tiny_openvla

__all__ = ["OpenVLA", "load_openvla", "random_openvla", "write_tiny_openvla"]
