"""Simulated benchmarks the VLA acts in. `mw` (Meta-World v3, MuJoCo) is the embedded default."""
