"""Flags shared by the commands that run a method (eval, replay, bench)."""

from __future__ import annotations

import argparse


def add_method_arguments(p: argparse.ArgumentParser, method: bool = True) -> None:
    from heisd.runtime.methods import METHODS

    if method:
        p.add_argument("--method", default="ar", choices=METHODS, help="decoding method")
    p.add_argument("--benchmark", default="mw", choices=["mw"], help="benchmark")
    p.add_argument("--target", default="checkpoints/vla", help="target VLA checkpoint directory")
    p.add_argument("--drafter", default=None, help="drafter checkpoint directory (specvla*, heisd)")
    p.add_argument("--datastore", default=None, help="datastore directory (retrieval, heisd)")
    p.add_argument("--relaxed-r", type=int, default=9, help="token-relaxed acceptance bound in bins")
    p.add_argument("--tree-topk", type=int, default=4, help="drafter tree: children per node")
    p.add_argument("--tree-depth", type=int, default=3, help="drafter tree: depth (drafter passes per proposal)")
    p.add_argument("--tree-budget", type=int, default=8, help="drafter tree: total nodes")
    p.add_argument("--retrieval-k", type=int, default=8, help="retrieval Top-K")
    p.add_argument("--retrieval-budget", type=int, default=32, help="retrieval tree: total nodes")
    p.add_argument("--payload", default="own", choices=["own", "demo", "both"],
                   help="retrieval drafts from the target's own tokens, the demonstrator's, or both")
    p.add_argument("--retrieval-fallback", default="ar", choices=["drafter", "ar"],
                   help="how a step continues after a rejected retrieval group (and no agreeing retrieved "
                        "sequence): plain AR (default; cheaper on CPU) or drafter SD as in the paper")
    p.add_argument("--no-continuation", action="store_true",
                   help="ablation: after a rejected retrieval group, go straight to the fallback instead of "
                        "drafting the rest from the retrieved sequences that agree with what was emitted")
    p.add_argument("--no-verify-skip", action="store_true", help="ablation: never skip verification")
    p.add_argument("--no-prefill-skip", action="store_true",
                   help="ablation: never skip the target on a close image key (ours; verify-skip still applies)")
    p.add_argument("--no-group-acceptance", action="store_true", help="ablation: exact instead of group-relaxed")
    p.add_argument("--metric-only", action="store_true",
                   help="ablation (heisd): kinematic switch with exact, never-skipped retrieval drafts")
    p.add_argument("--switch-threshold", type=float, default=None,
                   help="heisd: kinematic F threshold (default: the calibrated one stored with the datastore)")
    p.add_argument("--threads", type=int, default=1, help="torch CPU threads")


def method_config(args: argparse.Namespace, method: str | None = None):
    from heisd.runtime.methods import MethodConfig

    return MethodConfig(
        method=method or args.method, drafter=args.drafter, datastore=args.datastore, relaxed_r=args.relaxed_r,
        tree_topk=args.tree_topk, tree_depth=args.tree_depth, tree_budget=args.tree_budget,
        retrieval_k=args.retrieval_k, retrieval_budget=args.retrieval_budget, payload=args.payload,
        retrieval_fallback=args.retrieval_fallback, continuation=not args.no_continuation,
        verify_skip=not args.no_verify_skip, prefill_skip=not args.no_prefill_skip, group_acceptance=not args.no_group_acceptance,
        switch_threshold=args.switch_threshold, metric_only=args.metric_only,
    )


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
