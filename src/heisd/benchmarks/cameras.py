"""Camera names heisd records and evaluates with, importable without MuJoCo (the command line shows
them as defaults; demonstration files name them)."""

# `corner` sees the puck apart from the arm; in `corner3` the arm can hide it in the first frames
# when it lies left of the gripper (BENCHMARKS 1.1)
DEFAULT_CAMERA = "corner"
UNRECORDED_CAMERA = "corner3"  # what heisd recorded with before checkpoints recorded their camera

LIBERO_CAMERA = "agentview"  # what every LIBERO target reads
LIBERO_WRIST_CAMERA = "robot0_eye_in_hand"  # robosuite's wrist camera, LIBERO datasets' `eye_in_hand_rgb`
WRIST_KEY = "wrist_image"  # the observation's wrist frame (`LiberoConfig.wrist`)
