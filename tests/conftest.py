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


LIBERO_TASK = "pick_up_the_cream_cheese_and_place_it_in_the_basket"  # the task every LIBERO test shares


@pytest.fixture(scope="session")
def libero_env():
    """One LIBERO-Object simulator for the whole session (building one takes seconds): the shared
    task at 64 px, fast rendering, as `heisd eval` builds it for the small targets."""
    pytest.importorskip("libero", reason="the libero extra is not installed (pip install -e '.[libero]')")
    from heisd.benchmarks.libero import LiberoConfig, LiberoEnv

    return LiberoEnv("libero_object", LIBERO_TASK, LiberoConfig(image_size=64, fast_render=True))
