"""Flags shared by the commands that run a method (eval, replay, bench) or calibrate one.

Every default shown here is read from `MethodConfig` (which reads the component configs), so a
default lives in one place.
"""

from __future__ import annotations

import argparse


def add_decoding_arguments(p: argparse.ArgumentParser) -> None:
    """What shapes the decoders a method runs (also what `calibrate` must decode with)."""
    from heisd.runtime.methods import MethodConfig, default_of

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
    p.add_argument("--retrieval-fallback", default=d("retrieval_fallback"), choices=["drafter", "ar"],
                   help="how a step continues after a rejected retrieval group (and no agreeing retrieved "
                        "sequence): plain AR (cheaper on CPU) or drafter SD as in the paper")
    p.add_argument("--no-continuation", action="store_true",
                   help="ablation: after a rejected retrieval group, go straight to the fallback instead of "
                        "drafting the rest from the retrieved sequences that agree with what was emitted")
    p.add_argument("--no-group-acceptance", action="store_true", help="ablation: exact instead of group-relaxed")


def add_method_arguments(p: argparse.ArgumentParser, method: bool = True) -> None:
    from heisd.runtime.methods import METHODS, MethodConfig, default_of

    if method:
        p.add_argument("--method", default="ar", choices=METHODS, help="decoding method")
    from heisd.benchmarks.registry import BENCHMARKS

    p.add_argument("--benchmark", default="mw", choices=BENCHMARKS,
                   help="benchmark: mw (embedded) or a LIBERO suite (needs the libero extra)")
    p.add_argument("--target", default="checkpoints/vla", help="target VLA checkpoint directory")
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
        retrieval_fallback=args.retrieval_fallback, continuation=not args.no_continuation,
        group_acceptance=not args.no_group_acceptance,
    )
    optional = dict(relaxed_r="relaxed_r", verify_skip="no_verify_skip", prefill_skip="no_prefill_skip",
                    gripper_guard="no_gripper_guard",
                    switch="switch", switch_threshold="switch_threshold", lossless="lossless")
    for field, flag in optional.items():  # flags only the method-running commands have
        if hasattr(args, flag):
            value = getattr(args, flag)
            given[field] = not value if flag.startswith("no_") else value
    return MethodConfig(**{**given, **overrides})


def _str(path) -> str | None:
    return None if path is None else str(path)


def load_target(args: argparse.Namespace):
    """The target VLA in eval mode, on `--threads` CPU threads; errors name the file that is wrong."""
    import torch

    from heisd.vla.model import VLA

    torch.set_num_threads(args.threads)
    vla = VLA.from_pretrained(args.target)
    vla.eval()
    return vla


def load_policy(args: argparse.Namespace, cfg):
    """Target + decoders for one method."""
    from heisd.runtime.methods import build_decoders
    from heisd.runtime.policy import VLAPolicy

    vla = load_target(args)
    return VLAPolicy(vla, build_decoders(cfg, vla))
