"""Flags shared by the commands that load a target, run a method (eval, replay, bench) or
calibrate one.

Every default shown here is read from `MethodConfig` (which reads the component configs), so a
default lives in one place.
"""

from __future__ import annotations

import argparse
import logging

log = logging.getLogger(__name__)

DTYPES = ("float32", "bfloat16", "float16")  # --dtype choices (torch dtype names)
# the shipped target each benchmark's closed-loop commands use when --target is not given
SHIPPED_TARGETS = {"mw": "checkpoints/vla", "libero_object": "checkpoints/libero_object/vla",
                   "libero_spatial": "checkpoints/libero_spatial/vla", "libero_goal": "checkpoints/libero_goal/vla",
                   "libero_10": "checkpoints/libero_10/vla"}
SHIPPED = "shipped"  # --target's default where the benchmark's shipped target is: see `shipped_target`

TARGET_HELP = ("target checkpoint directory: a heisd VLA (e.g. checkpoints/vla) or an OpenVLA Hugging Face "
               "checkpoint; the kind is read from its config.json")


TOLERANCE_HELP = (
    "how far group-relaxed acceptance lets a retrieval draft token sit from the target's greedy token: "
    "'paper' (the paper's fixed 15 bins per token, 30 per group), or key=value pairs joined by commas, "
    "which shrink those bounds and compose: scale=S (a token may be off by S times the target's own action "
    "on that dimension, measured from the zero action, in bins), floor=B (the scaled bound is never below B "
    "bins), fine=M with fine-below=F (where the kinematic metric F is below F -- the arm slowing into a fine "
    "phase -- every bound is multiplied by M; 0 = exact; heisd only, which tracks F), margin=L (a token "
    "must match exactly where the target's top logit leads its second by more than L: a confident target), "
    "e.g. scale=0.5,floor=2. Default: the tolerance `bench --persist-tolerance` chose closed loop and stored with "
    "the datastore, else scale=0.5,floor=2")


CUDA_GRAPHS_HELP = ("target on a CUDA device: run its passes on a static KV cache, each pass shape captured once "
                    "as a CUDA graph and replayed (the same tokens; a pass launches at once instead of kernel by "
                    "kernel, which is what bounds a 7B target at batch 1)")


def add_target_arguments(p: argparse.ArgumentParser, default: str | None = None, target: bool = True) -> None:
    """--target (required unless `default`; left out with `target=False`) and how it is loaded:
    the same flags wherever a target is loaded."""
    if target:
        shipped = ", ".join(f"{path} for {b}" for b, path in SHIPPED_TARGETS.items())
        p.add_argument("--target", default=default, required=default is None,
                       help=TARGET_HELP + (f" (default: the shipped one of --benchmark: {shipped})"
                                           if default == SHIPPED else ""))
    p.add_argument("--unnorm-key", default=None,
                   help="OpenVLA: the dataset whose action statistics de-normalize actions (config.json "
                        "norm_stats, or dataset_statistics.json where present; needed when it holds several, "
                        "except for eval and bench on a LIBERO suite, which take the suite's as OpenVLA's eval "
                        "does; KEY falls back to KEY_no_noops)")
    p.add_argument("--device", default="cpu", help="torch device of the target, e.g. cpu or cuda")
    p.add_argument("--dtype", choices=DTYPES, default="float32", help="dtype of the target's weights and activations")


def torch_device(name: str):
    """The torch device of a --device flag; a clear error for a malformed name or a missing GPU."""
    import torch

    from heisd.errors import UsageError

    try:
        device = torch.device(name)
    except RuntimeError as e:
        raise UsageError(f"--device {name}: not a torch device ({e})") from e
    if device.type == "cuda" and not torch.cuda.is_available():
        raise UsageError(f"--device {name}: no CUDA device is visible to torch")
    return device


def target_device(args: argparse.Namespace):
    """(torch device, torch dtype) of --device and --dtype."""
    import torch

    return torch_device(args.device), getattr(torch, args.dtype)


def add_decoding_arguments(p: argparse.ArgumentParser) -> None:
    """What shapes the decoders a method runs (also what `calibrate` must decode with)."""
    from heisd.runtime.methods import FALLBACKS, MethodConfig, default_of

    d = lambda name: default_of(MethodConfig, name)  # noqa: E731
    p.add_argument("--drafter", default=None, help="drafter checkpoint directory (specvla*, heisd)")
    p.add_argument("--tree-topk", type=int, default=d("tree_topk"), help="drafter tree: children per node")
    p.add_argument("--tree-depth", type=int, default=d("tree_depth"),
                   help="drafter tree: depth (drafter passes per proposal)")
    p.add_argument("--tree-budget", type=int, default=d("tree_budget"), help="drafter tree: total nodes")
    p.add_argument("--retrieval-k", type=int, default=d("retrieval_k"), help="retrieval Top-K")
    p.add_argument("--retrieval-budget", type=int, default=d("retrieval_budget"), help="retrieval tree: total nodes")
    p.add_argument("--payload", default=d("payload"), choices=["own", "demo", "both"],
                   help="retrieval drafts from the target's own tokens, the demonstrator's, or both")
    p.add_argument("--retrieval-fallback", default=d("retrieval_fallback"), choices=FALLBACKS,
                   help="how a step continues after a rejected retrieval group (and no agreeing retrieved "
                        "sequence): plain AR, drafter SD as in the paper, Jacobi iterations (no draft model), "
                        "or cost: per rejected step, whichever of those (the drafter if given) is expected to "
                        "finish it fastest, from what each costs in this run")
    p.add_argument("--drafter-tree", default=d("drafter_tree"), choices=["fixed", "cost"],
                   help="drafter proposals: always the configured tree (fixed), or per proposal the configured "
                        "tree or a one-pass depth-1 tree, whichever costs fewer ms per token in this run (cost)")
    p.add_argument("--no-continuation", action="store_true",
                   help="ablation: after a rejected retrieval group, go straight to the fallback instead of "
                        "drafting the rest from the retrieved sequences that agree with what was emitted")
    p.add_argument("--fused-prefill", action="store_true",
                   help="verify the first retrieval draft (and Jacobi's warm start) inside the prefill pass instead "
                        "of in a pass of its own after it (ours; the verify-skip then has no pass to skip); pays "
                        "where a pass costs about the same whatever its tokens (a GPU), not on a small CPU target")
    p.add_argument("--no-group-acceptance", action="store_true", help="ablation: exact instead of group-relaxed")
    p.add_argument("--tolerance", default=None, metavar="SPEC", help=TOLERANCE_HELP)
    p.add_argument("--cuda-graphs", action="store_true", help=CUDA_GRAPHS_HELP)


def add_method_arguments(p: argparse.ArgumentParser, method: bool = True, benchmark: str | None = "mw",
                         benchmark_help: str = "") -> None:
    """`benchmark`: --benchmark's default (None: the command finds it, `benchmark_help` says how)."""
    from heisd.benchmarks.registry import BENCHMARKS
    from heisd.runtime.methods import METHODS, MethodConfig, default_of

    if method:
        p.add_argument("--method", default="ar", choices=METHODS, help="decoding method")
    p.add_argument("--benchmark", default=benchmark, choices=BENCHMARKS,
                   help="benchmark: mw (embedded) or a LIBERO suite (needs the libero extra)" + benchmark_help)
    add_target_arguments(p, default=SHIPPED)
    p.add_argument("--datastore", default=None, help="datastore directory (retrieval, heisd)")
    p.add_argument("--relaxed-r", type=int, default=default_of(MethodConfig, "relaxed_r"),
                   help="token-relaxed acceptance bound in bins (specvla-relaxed)")
    add_decoding_arguments(p)
    p.add_argument("--no-verify-skip", action="store_true", help="ablation: never skip verification")
    p.add_argument("--no-prefill-skip", action="store_true",
                   help="ablation: never skip the target on a close image key (ours; verify-skip still applies)")
    p.add_argument("--no-gripper-guard", action="store_true",
                   help="ablation: let a skip accept a draft that opens or closes the gripper unverified")
    p.add_argument("--lossless", "--metric-only", dest="lossless", action="store_true",
                   help="exact acceptance and no skips in every mode: the same tokens as AR (retrieval, heisd); "
                        "for heisd also the paper's first ablation rung, 'metric only'")
    p.add_argument("--switch", default=default_of(MethodConfig, "switch"), choices=["cost", "threshold"],
                   help="heisd: per step, the mode with the lower expected latency from measured per-piece costs "
                        "(cost) or the paper's fixed boundary on the kinematic metric F (threshold)")
    p.add_argument("--switch-threshold", type=float, default=None,
                   help="heisd --switch threshold: F boundary (default: the calibrated one stored with the datastore)")
    p.add_argument("--threads", type=int, default=1, help="torch CPU threads")


def method_config(args: argparse.Namespace, method: str | None = None, **overrides):
    """The MethodConfig the flags describe (`overrides` for what a command fixes itself)."""
    from heisd.errors import UsageError

    try:
        return _method_config(args, method, **overrides)
    except ValueError as err:  # a method without its resources: the messages name the flags
        raise UsageError(str(err)) from err


def _method_config(args: argparse.Namespace, method: str | None = None, **overrides):
    from heisd.runtime.methods import MethodConfig

    given = dict(
        method=method or args.method, drafter=_str(args.drafter), datastore=_str(args.datastore),
        tree_topk=args.tree_topk, tree_depth=args.tree_depth, tree_budget=args.tree_budget,
        retrieval_k=args.retrieval_k, retrieval_budget=args.retrieval_budget, payload=args.payload,
        retrieval_fallback=args.retrieval_fallback, drafter_tree=args.drafter_tree,
        continuation=not args.no_continuation, fused_prefill=args.fused_prefill,
        group_acceptance=not args.no_group_acceptance, tolerance=_tolerance(args), cuda_graphs=args.cuda_graphs,
    )
    optional = dict(relaxed_r="relaxed_r", verify_skip="no_verify_skip", prefill_skip="no_prefill_skip",
                    gripper_guard="no_gripper_guard",
                    switch="switch", switch_threshold="switch_threshold", lossless="lossless")
    for field, flag in optional.items():  # flags only the method-running commands have
        if hasattr(args, flag):
            value = getattr(args, flag)
            given[field] = not value if flag.startswith("no_") else value
    return MethodConfig(**{**given, **overrides})


def _tolerance(args: argparse.Namespace) -> str:
    """--tolerance, else the one stored with the datastore (`runtime.tolerance`), else MethodConfig's."""
    from heisd.runtime import tolerance
    from heisd.runtime.methods import MethodConfig, default_of

    if args.tolerance is not None:
        return args.tolerance
    spec = tolerance.stored(args.datastore)
    if spec is not None:
        log.info("acceptance tolerance %s: chosen closed loop and stored with %s", spec, args.datastore)
        return spec
    return default_of(MethodConfig, "tolerance")


def shipped_target(args: argparse.Namespace) -> None:
    """Replace --target's `SHIPPED` default by the shipped target of --benchmark (before any command
    reads it); every benchmark has one."""
    if getattr(args, "target", None) != SHIPPED:
        return
    benchmark = getattr(args, "benchmark", None) or "mw"  # None: a command that reads it from the target
    args.target = SHIPPED_TARGETS[benchmark]


def _str(path) -> str | None:
    return None if path is None else str(path)


def load_target(args: argparse.Namespace):
    """The target of --target (either kind) in eval mode on --device/--dtype, on --threads CPU
    threads; errors name the file that is wrong."""
    import torch

    from heisd.targets import load_target as load

    torch.set_num_threads(args.threads)
    device, dtype = target_device(args)
    return load(args.target, device, dtype, unnorm_key=args.unnorm_key)


def add_episode_arguments(p: argparse.ArgumentParser) -> None:
    """How a closed-loop episode runs (eval, bench): its length, and OpenVLA's center crop on LIBERO."""
    p.add_argument("--max-steps", type=int, default=None,
                   help="steps per episode: mw environment steps (default 300); LIBERO policy steps after the 10 wait "
                        "steps (default the protocol's 220/280/300/520 per suite; fewer truncate the episode)")
    p.add_argument("--no-center-crop", action="store_true",
                   help="OpenVLA target on LIBERO: skip the 0.9-area center crop of the frames (OpenVLA's eval "
                        "crops by default, for checkpoints fine-tuned with crop augmentation)")
    p.add_argument("--sampled-layouts", action="store_true",
                   help="LIBERO: start episode i from a fresh layout drawn by LIBERO's own samplers from its seed "
                        "(--seed; no demonstration seed draws it) instead of the suite's init state i: closed-loop "
                        "calibration, e.g. bench --persist-tolerance, on layouts the evaluation never uses")


def max_steps_of(args: argparse.Namespace) -> int:
    """--max-steps, or the benchmark's own episode length (`registry.default_max_steps`)."""
    from heisd.benchmarks.registry import default_max_steps

    return default_max_steps(args.benchmark) if args.max_steps is None else args.max_steps


def add_camera_argument(p: argparse.ArgumentParser) -> None:
    p.add_argument("--camera", default=None,
                   help="mw camera; default: the one the target's demonstrations were recorded with (the "
                        "`camera` of its train_info.json), else corner3 (what heisd recorded with before checkpoints "
                        "recorded their camera)")


def camera_of(args: argparse.Namespace) -> str:
    """The mw camera a closed-loop run shows the target: a target sees the camera it was trained on."""
    from heisd.benchmarks.cameras import UNRECORDED_CAMERA
    from heisd.errors import UsageError
    from heisd.targets.vla.train import trained_camera

    trained = trained_camera(args.target) if args.target else None
    if args.camera is not None and trained is not None and args.camera != trained:
        raise UsageError(f"--camera {args.camera}: the target was trained on frames of camera {trained!r} "
                         f"({args.target}/train_info.json)")
    return args.camera or trained or UNRECORDED_CAMERA


def check_demos_camera(target: str, demos) -> None:
    """Demonstrations that a target encodes (datastore keys, drafter features, calibration frames)
    must show the camera it was trained on: another view gives keys it never meets in closed loop."""
    from heisd.data.dataset import recorded_settings
    from heisd.errors import InputError
    from heisd.targets.vla.train import trained_camera

    trained = trained_camera(target)
    if trained is None:
        return
    for path, settings in zip(demos, recorded_settings(demos)):
        if settings.get("camera", trained) != trained:
            raise InputError(f"{path}: recorded with camera {settings['camera']!r}, but the target was trained on "
                             f"camera {trained!r} ({target}/train_info.json): record it with --camera {trained}")


def closed_loop_unnorm_key(args: argparse.Namespace) -> None:
    """An OpenVLA target run on a LIBERO suite without --unnorm-key takes the suite's statistics
    (`heisd.targets.load.closed_loop_unnorm_key`)."""
    from heisd.targets.load import closed_loop_unnorm_key as key

    args.unnorm_key = key(args.target, args.benchmark, args.unnorm_key)


def load_policy(args: argparse.Namespace, cfg):
    """Target + decoders for one method."""
    from heisd.runtime.methods import build_decoders
    from heisd.runtime.policy import VLAPolicy

    target = load_target(args)
    return VLAPolicy(target, build_decoders(cfg, target))


def add_ray_arguments(p: argparse.ArgumentParser, what: str = "episodes") -> None:
    """--ray [ADDRESS] and how many Ray workers, of what size (`heisd.executors`)."""
    p.add_argument("--ray", nargs="?", const=RAY_HERE, default=None, metavar="ADDRESS",
                   help=f"run the {what} on a Ray cluster: ADDRESS as `ray start --head` printed it (host:6379), or "
                        "no ADDRESS for the cluster `ray start` made on this machine, else a new one here; every "
                        "machine needs heisd and the same paths (checkpoints, demos, datastore). The driver writes "
                        "the outputs, as a local run does")
    p.add_argument("--ray-workers", type=int, default=0,
                   help="--ray: workers (0: as many as the cluster's CPUs hold, --threads CPUs each, and GPUs "
                        "with --gpus-per-worker)")
    p.add_argument("--gpus-per-worker", type=float, default=0.0,
                   help="--ray: GPUs each worker reserves (e.g. 1, or 0.5 for two per GPU; with --device cuda)")


RAY_HERE = "here"  # --ray without ADDRESS


def executor_of(args: argparse.Namespace, processes: int = 1, cpus: float | None = None):
    """Where the jobs run: Ray with --ray (workers of `cpus` CPUs, default --threads), else this
    process (or `processes` local processes)."""
    from heisd.errors import UsageError
    from heisd.executors import LocalExecutor, RayExecutor, RayOptions

    if args.ray is None:
        for flag, value in (("--ray-workers", args.ray_workers), ("--gpus-per-worker", args.gpus_per_worker)):
            if value:
                raise UsageError(f"{flag} applies with --ray only")
        return LocalExecutor(processes)
    if processes > 1:
        raise UsageError("--workers counts local processes; with --ray give --ray-workers")
    if getattr(args, "server", None):
        raise UsageError("--ray: with --server the policy runs on the server; run the episodes here")
    if str(getattr(args, "device", "cpu")).startswith("cuda") and not args.gpus_per_worker:
        raise UsageError("--device cuda with --ray: give --gpus-per-worker (a Ray worker sees only its own GPUs)")
    address = None if args.ray == RAY_HERE else args.ray
    cpus = float(getattr(args, "threads", 1)) if cpus is None else cpus
    return RayExecutor(RayOptions(address, args.ray_workers, cpus, args.gpus_per_worker))


def worker_target(args: argparse.Namespace, fingerprint: str):
    """A Ray worker's target (`load_target`), refused when its files are not the driver's (a
    machine whose checkpoint at that path differs)."""
    from heisd.errors import InputError
    from heisd.executors import worker_name

    target = load_target(args)
    if target.fingerprint() != fingerprint:
        raise InputError(f"--target {args.target} on {worker_name()} is another checkpoint than the driver's "
                         "(its fingerprint differs): give every machine the same files")
    return target


def worker_policy(args: argparse.Namespace, cfg, fingerprint: str):
    """A Ray worker's policy for the method config `cfg` (`load_policy`, its target checked)."""
    from heisd.runtime.methods import build_decoders
    from heisd.runtime.policy import VLAPolicy

    target = worker_target(args, fingerprint)
    return VLAPolicy(target, build_decoders(cfg, target))
