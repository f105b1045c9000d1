import os

os.environ.setdefault("MUJOCO_GL", "egl")  # headless rendering, before anything imports mujoco

import pytest
import torch

torch.set_num_threads(1)  # deterministic and fair on the shared 2-core machine


@pytest.fixture(scope="session")
def tiny_openvla_dir(tmp_path_factory):
    """A tiny random OpenVLA checkpoint in the real layout (2 shards, seed 0), written once per session."""
    from heisd.targets.openvla import write_tiny_openvla

    path = tmp_path_factory.mktemp("openvla") / "tiny-openvla"
    write_tiny_openvla(path, seed=0, shards=2)
    return path


@pytest.fixture(scope="session")
def tiny_openvla(tiny_openvla_dir):
    """That checkpoint loaded on the CPU in float32 with the LIBERO-spatial statistics."""
    from heisd.targets.openvla import load_openvla

    return load_openvla(tiny_openvla_dir, unnorm_key="libero_spatial")
