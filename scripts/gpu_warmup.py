"""What a served policy's first step costs under CUDA graphs, and what `serve --warmup-steps` saves:
an AR policy on OpenVLA-7B's shapes (random bf16 weights built on the GPU), eager and then with
--cuda-graphs. For each: the first step (`heisd.serving.warmup.warm_up` with one step: the CUDA
graphs of its pass shapes are captured in it), then 8 more steps of an episode, each timed.

    PYTHONPATH=src python3 scripts/gpu_warmup.py OUT.json
"""

from __future__ import annotations

import argparse
import json
import time

import numpy as np
import torch

from heisd.runtime.methods import MethodConfig, build_decoders
from heisd.runtime.policy import VLAPolicy
from heisd.serving.warmup import warm_up
from heisd.targets.openvla.synthetic import random_openvla

INSTRUCTION = "put the bowl on the stove"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("out", help="JSON file to write")
    p.add_argument("--steps", type=int, default=8, help="timed steps after the first")
    args = p.parse_args()
    target = random_openvla("7b", "cuda", torch.bfloat16)
    result = {}
    for graphs in (False, True):
        policy = VLAPolicy(target, build_decoders(MethodConfig("ar", cuda_graphs=graphs), target))
        first = warm_up(policy, 1, INSTRUCTION)
        rng = np.random.default_rng(1)
        policy.reset(INSTRUCTION)
        ms = []
        for _ in range(args.steps):
            frame = rng.integers(0, 256, (256, 256, 3), dtype=np.uint8)
            torch.cuda.synchronize()
            start = time.perf_counter()
            policy.act(frame, np.zeros(0, np.float32), np.zeros(3))
            torch.cuda.synchronize()
            ms.append((time.perf_counter() - start) * 1e3)
        result["graphs" if graphs else "eager"] = {
            "first_step_ms": first["seconds"] * 1e3, "graphs_captured": first["graphs_captured"],
            "later_steps_median_ms": float(np.median(ms)), "later_steps_ms": ms}
    print(json.dumps(result, indent=1))
    with open(args.out, "w") as f:
        json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
