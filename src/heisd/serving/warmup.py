"""A server's warm-up: control steps on a synthetic observation before it listens (`serve --warmup-steps`)."""

from __future__ import annotations

import time

import numpy as np

from heisd.cuda_graphs import captures


def warm_up(policy, steps: int, instruction: str) -> dict:
    """Run `steps` control steps of `policy` on a synthetic observation (a fixed random frame, the
    end-effector moving in a line): under --cuda-graphs each pass shape they meet is captured now, not
    in a robot's first steps (an instruction whose prompt has another length is a new prefill shape,
    captured at its first step). The next episode resets the policy. The cost rules learned nothing
    from steps that captured (`heisd.cuda_graphs.captures`), and from the later ones what passes
    cost, as they would from any step. Warms `policy` only: another episode open at the same time
    gets a policy of its own, whose passes capture at its first steps (the vision's are shared).
    -> what /info reports."""
    if not steps:
        return {"steps": 0, "seconds": 0.0, "graphs_captured": 0}
    spec = policy.target.spec
    rng = np.random.default_rng(0)
    image = rng.integers(0, 256, spec.frame_shape, dtype=np.uint8)
    state = np.zeros(spec.state_dim, np.float32)
    before, start = captures(), time.perf_counter()
    policy.reset(instruction)
    for i in range(steps):
        policy.act(image, state, np.array([0.01 * i, 0.0, 0.0]))
    return {"steps": steps, "seconds": round(time.perf_counter() - start, 3), "graphs_captured": captures() - before}
