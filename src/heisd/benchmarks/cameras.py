"""Meta-World camera names heisd records and evaluates with, importable without MuJoCo (the
command line shows them as defaults)."""

# `corner` sees the puck apart from the arm; in `corner3` the arm can hide it in the first frames
# when it lies left of the gripper (BENCHMARKS 1.1)
DEFAULT_CAMERA = "corner"
UNRECORDED_CAMERA = "corner3"  # what heisd recorded with before checkpoints recorded their camera
