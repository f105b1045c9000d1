"""Per-step cost of the kinematic metric F as a policy pays it: one new end-effector position and
one F per control step, on a random smooth path. Times, in the same process and interleaved, the
`TrajectoryTracker` (running sums) and recomputing the window with `fused_metric` each step.

    PYTHONPATH=src python scripts/time_kinematic_metric.py [--steps 5000]
"""

from __future__ import annotations

import argparse
import time
from collections import deque

import numpy as np

from heisd.kinematics import KinematicConfig, KinematicStats, TrajectoryTracker, fused_metric


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=5000, help="control steps per timed pass")
    p.add_argument("--repeats", type=int, default=5, help="timed passes of each (the median is reported)")
    args = p.parse_args()
    config = KinematicConfig()
    stats = KinematicStats(r_min=0.0, r_p95=0.2, d_min=0.0, d_p95=0.1, window=config.window, r_cap=config.r_cap,
                           n_windows=1)
    rng = np.random.default_rng(0)
    steps = rng.normal(0.0, 0.004, size=(args.steps, 3))
    for t in range(1, args.steps):  # curling motion: windows with a circle to fit
        steps[t] = 0.8 * steps[t - 1] + 0.2 * steps[t]
    path = np.cumsum(steps, axis=0).tolist()

    def tracker_pass() -> float:
        tracker = TrajectoryTracker(config, stats)
        t0 = time.perf_counter()
        for point in path:
            tracker.update(ee_pos=point)
            tracker.fused()
        return (time.perf_counter() - t0) / len(path) * 1e6

    def window_pass() -> float:
        window: deque = deque(maxlen=config.window)
        t0 = time.perf_counter()
        for point in path:
            window.append(point)
            if len(window) == config.window:
                fused_metric(np.array(window), stats, config)
        return (time.perf_counter() - t0) / len(path) * 1e6

    times: dict[str, list[float]] = {"tracker": [], "window": []}
    for _ in range(args.repeats):
        times["tracker"].append(tracker_pass())
        times["window"].append(window_pass())
    tracker, window = (float(np.median(times[k])) for k in ("tracker", "window"))
    print(f"per step, median of {args.repeats} passes of {args.steps} steps (window {config.window}, "
          f"refine_iters {config.refine_iters}): tracker {tracker:.1f} us, recomputed window {window:.1f} us "
          f"({window / tracker:.2f}x)")


if __name__ == "__main__":
    main()
