"""`heisd robot piper`: the robot side of `heisd serve` on an AgileX PIPER arm (or a simulated one)."""

from __future__ import annotations

import argparse
import json

HELP = "Drive a robot arm with a policy served by `heisd serve` (robots: piper, the AgileX PIPER)."


def add_arguments(p: argparse.ArgumentParser) -> None:
    from heisd.robots.control import ControlConfig, Workspace
    from heisd.robots.piper import PiperConfig

    sub = p.add_subparsers(dest="robot", metavar="ROBOT", required=True)
    piper = sub.add_parser("piper", formatter_class=argparse.ArgumentDefaultsHelpFormatter,
                           help="AgileX PIPER through piper_sdk (pip install 'heisd[robot]')",
                           description="Run one episode on an AgileX PIPER: camera frames (OpenCV) and the arm's "
                                       "end-effector pose go to the server, its delta actions come back as end-pose "
                                       "and gripper commands, limited in speed and workspace, at a fixed rate. Stops "
                                       "the arm on a server error or timeout, a non-finite action, stale or "
                                       "non-finite arm feedback, a camera timeout, or Ctrl-C.")
    piper.add_argument("--debug", action="store_true", default=argparse.SUPPRESS,
                       help="print the full traceback of an error (also: HEISD_DEBUG=1)")
    piper.add_argument("--server", required=True, metavar="URL",
                       help="the policy: http://HOST:PORT (REST) or ws://HOST:PORT (openpi's websocket)")
    piper.add_argument("--instruction", required=True, help="the task, in words (the prompt)")
    piper.add_argument("--task", default=None, help="the server benchmark's task name (its datastore collection); "
                                                     "default: found from the instruction")
    piper.add_argument("--camera", default="0", help="OpenCV camera: a device index, or a video file (played in a loop)")
    piper.add_argument("--image-size", type=int, default=224,
                       help="frames are resized to this square size before they are sent (0: as captured)")
    piper.add_argument("--can", default=PiperConfig.can, help="the CAN interface of the arm (slcan: its serial port)")
    piper.add_argument("--can-bus", default=PiperConfig.bus, choices=["socketcan", "slcan"],
                       help="python-can interface type: socketcan (Linux CAN, as piper_sdk's scripts set up) or "
                            "slcan (a USB-serial CAN adapter)")
    piper.add_argument("--speed-percent", type=int, default=PiperConfig.speed_percent,
                       help="the arm's move speed (MotionCtrl_2), %% of its maximum")
    piper.add_argument("--gripper-effort", type=int, default=PiperConfig.gripper_effort,
                       help="gripper effort in 0.001 N·m (0-5000)")
    piper.add_argument("--dry-run", action="store_true",
                       help="a simulated arm instead of the PIPER (no CAN, no piper_sdk); the camera and server are real")
    c = ControlConfig()
    piper.add_argument("--rate-hz", type=float, default=c.rate_hz, help="control ticks per second (one action each)")
    piper.add_argument("--execute", type=int, default=c.execute,
                       help="actions executed per inference (0: the whole chunk)")
    piper.add_argument("--ticks", type=int, default=c.max_steps, help="ticks to run (0: until Ctrl-C or a stop)")
    piper.add_argument("--position-scale", type=float, default=c.position_scale_m,
                       help="metres per unit of a position action")
    piper.add_argument("--rotation-scale", type=float, default=c.rotation_scale_deg,
                       help="degrees per unit of a rotation action (7-value actions)")
    piper.add_argument("--max-speed", type=float, default=c.max_speed_mps,
                       help="end-effector speed limit, m/s (each tick's move is cut to it)")
    piper.add_argument("--max-rotation-speed", type=float, default=c.max_rotation_dps,
                       help="rotation speed limit per axis, degrees/s")
    piper.add_argument("--workspace", type=float, nargs=6, default=[*Workspace.low_m, *Workspace.high_m],
                       metavar=("XMIN", "YMIN", "ZMIN", "XMAX", "YMAX", "ZMAX"),
                       help="box (metres, arm base frame) the commanded position is kept in")
    piper.add_argument("--gripper-open", type=float, default=c.gripper_open_m, help="gripper opening for 'open', m")
    piper.add_argument("--gripper-closed", type=float, default=c.gripper_closed_m, help="gripper opening for 'closed', m")
    piper.add_argument("--gripper-close-above", type=float, default=c.gripper_close_above,
                       help="an action's gripper value above this closes the gripper (OpenVLA LIBERO: 0)")
    piper.add_argument("--request-timeout", type=float, default=c.request_timeout_s,
                       help="seconds the server has to answer an inference before the arm stops")
    piper.add_argument("--feedback-timeout", type=float, default=c.feedback_timeout_s,
                       help="arm readings older than this many seconds stop the arm")
    piper.add_argument("--camera-timeout", type=float, default=c.camera_timeout_s,
                       help="no camera frame newer than this many seconds stops the arm")


def run(args: argparse.Namespace) -> int:
    import sys

    from heisd.client import ServerUnreachable, connect
    from heisd.errors import InputError, UsageError
    from heisd.robots.arm import SimulatedArm
    from heisd.robots.camera import OpenCVCamera
    from heisd.robots.control import STATE_DIM, ControlConfig, Workspace, run_loop
    from heisd.robots.piper import PiperArm, PiperConfig

    try:
        cfg = ControlConfig(rate_hz=args.rate_hz, execute=args.execute, max_steps=args.ticks,
                            position_scale_m=args.position_scale, rotation_scale_deg=args.rotation_scale,
                            max_speed_mps=args.max_speed, max_rotation_dps=args.max_rotation_speed,
                            workspace=Workspace(tuple(args.workspace[:3]), tuple(args.workspace[3:])),
                            gripper_open_m=args.gripper_open, gripper_closed_m=args.gripper_closed,
                            gripper_close_above=args.gripper_close_above, request_timeout_s=args.request_timeout,
                            feedback_timeout_s=args.feedback_timeout, camera_timeout_s=args.camera_timeout)
        piper_cfg = PiperConfig(can=args.can, bus=args.can_bus, speed_percent=args.speed_percent,
                                gripper_effort=args.gripper_effort)
        client = connect(args.server, timeout=args.request_timeout, connect_retries=0)
    except ValueError as err:
        raise UsageError(str(err)) from None
    try:
        info = client.info()
    except ServerUnreachable as err:
        raise InputError(f"--server: {err}") from None
    chunk, action_dim = info["target"]["action_shape"]
    state_dim = info["target"]["state_dim"]
    if state_dim not in (0, STATE_DIM):
        raise UsageError(f"--server's target takes a {state_dim}-value state; this loop sends the arm's {STATE_DIM} "
                         "(position m, rotation rad, gripper m)")
    if info["target"].get("views", 1) != 1:
        raise UsageError("--server's target reads a wrist camera beside the scene camera; this loop drives one camera")
    if args.execute > chunk:
        raise UsageError(f"--execute {args.execute} exceeds the target's action chunk ({chunk})")
    if action_dim not in (4, 7):
        raise UsageError(f"--server's target acts in {action_dim} dims; this loop drives 4 (xyz + gripper) or 7")
    source = int(args.camera) if args.camera.isdigit() else args.camera
    arm = SimulatedArm() if args.dry_run else PiperArm(piper_cfg)
    with OpenCVCamera(source, args.image_size or None) as camera:
        arm.connect()
        try:
            report = run_loop(arm, camera.latest, client, args.instruction, cfg, task=args.task,
                              takes_state=state_dim > 0, action_dim=action_dim)
        finally:
            arm.close()
            client.close()
    summary = {"server": args.server, "robot": "simulated" if args.dry_run else f"piper on {args.can}",
               "instruction": args.instruction, "config": vars(args), **report.summary()}
    print(json.dumps(summary, indent=2, default=str))  # the run's report, on stdout
    if report.stopped is None:
        return 0
    print(f"heisd robot piper: stopped the arm: {report.stopped}", file=sys.stderr)
    return 130 if report.stopped.startswith("interrupted") else 1
