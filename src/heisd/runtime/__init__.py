"""Running a VLA: method configuration, the per-step policy, closed-loop eval and offline replay."""
