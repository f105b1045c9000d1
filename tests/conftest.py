import os

os.environ.setdefault("MUJOCO_GL", "egl")  # headless rendering, before anything imports mujoco

import torch

torch.set_num_threads(1)  # deterministic and fair on the shared 2-core machine
