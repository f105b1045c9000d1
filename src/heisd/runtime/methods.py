"""Methods are configurations of the one decode loop (docs/design.md §2.14): a proposer + an acceptance rule
per decoding mode, and how a control step picks its mode.

| method           | retrieval mode                         | drafter mode               | mode per step       |
|------------------|----------------------------------------|----------------------------|---------------------|
| ar               | -                                      | no proposer, exact         | drafter             |
| jacobi           | -                                      | (jacobi mode) chain, exact | jacobi              |
| specvla          | -                                      | drafter tree, exact        | drafter             |
| specvla-relaxed  | -                                      | drafter tree, token-relaxed| drafter             |
| retrieval        | group tree (+ skips), group-relaxed    | -                          | retrieval           |
| heisd            | group tree (+ skips), group-relaxed    | drafter tree, exact        | kinematic switch    |

Skips: verify-skip (paper) and prefill skip (ours), both calibrated by `heisd calibrate`.
Fused prefill (ours, opt-in): retrieval mode's first tree (and Jacobi's warm start) is verified inside
the prefill pass, so it needs no pass of its own and the verify-skip has none to skip.
`lossless`: exact acceptance and no skips in retrieval mode too (AR's tokens).
`tolerance`: how group-relaxed acceptance bounds a token (`retrieval.config.Tolerance`; "paper": fixed).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from heisd.drafter.config import TreeConfig
from heisd.retrieval.config import RetrievalConfig, Tolerance

if TYPE_CHECKING:
    from heisd.decoding import SpeculativeDecoder
    from heisd.drafter import Drafter
    from heisd.kinematics import Switch
    from heisd.retrieval.proposer import RetrievalProposer

METHODS = ("ar", "jacobi", "specvla", "specvla-relaxed", "retrieval", "heisd")
FALLBACKS = ("ar", "drafter", "jacobi", "cost")


def default_of(config: type, name: str):
    """The default of dataclass field `name`: each default is written once, in its own config."""
    field = next(f for f in dataclasses.fields(config) if f.name == name)
    return field.default


@dataclass(frozen=True)
class MethodConfig:
    method: str  # one of METHODS
    drafter: str | None = None  # drafter checkpoint dir (specvla*, heisd; optional fallback for retrieval)
    datastore: str | None = None  # datastore dir (retrieval, heisd)
    relaxed_r: int = 9  # token-relaxed bound in bins (SpecVLA's default)
    tree_topk: int = default_of(TreeConfig, "topk")  # drafter tree: children per node
    tree_depth: int = default_of(TreeConfig, "depth")  # drafter tree: depth (one drafter pass per level)
    tree_budget: int = default_of(TreeConfig, "budget")  # drafter tree: total nodes
    retrieval_k: int = default_of(RetrievalConfig, "k")  # Top-K results per query
    retrieval_budget: int = default_of(RetrievalConfig, "node_budget")  # retrieval tree: total nodes
    payload: str = default_of(RetrievalConfig, "payload")  # drafts from the target's own tokens, demo tokens, or both
    # after a rejected retrieval group: plain "ar", "drafter" SD as in the paper, "jacobi" (ours:
    # Jacobi iterations, no draft model; lossless under exact acceptance), or "cost" (ours, the
    # default: per rejected step, whichever of those is expected to finish it fastest, measured
    # online; BENCHMARKS 6.7: it picks Jacobi on this CPU, 3.2 target passes per step instead of
    # AR's 5.25 where retrieval fails)
    retrieval_fallback: str = "cost"
    # drafter tree per proposal: the configured one ("fixed"), or "cost" (ours: the configured one
    # or a one-pass depth-1 tree, whichever is expected to cost fewer ms per token, measured online)
    drafter_tree: str = "fixed"
    continuation: bool = default_of(RetrievalConfig, "continue_drafts")  # after a rejection, draft the rest
    fused_prefill: bool = default_of(RetrievalConfig, "fused_prefill")  # the first retrieval tree verified in the prefill
    gripper_guard: bool = default_of(RetrievalConfig, "gripper_guard")  # skips never move the gripper
    verify_skip: bool = True  # adaptive verify-skip (retrieval mode)
    prefill_skip: bool = True  # ours: skip the target altogether on a close image key (retrieval mode)
    group_acceptance: bool = True  # group-relaxed acceptance (retrieval mode); off = exact
    # how group-relaxed acceptance bounds a token (`Tolerance.parse`): "paper" is the paper's fixed
    # 15 bins per token, 30 per group; ours (BENCHMARKS 11) scales it with the target's own action
    tolerance: str = "scale=0.5,floor=2"
    # heisd: "cost" picks the mode with the lower expected latency from measured costs (ours);
    # "threshold" is the paper's fixed boundary on the kinematic metric F
    switch: str = "cost"
    switch_threshold: float | None = None  # heisd threshold switch: override the calibrated F threshold
    # exact acceptance and no skips in every mode: the tokens are AR's, bit for bit. For heisd it is
    # also the paper's first ablation rung ("metric only": the switch with plain retrieval drafts)
    lossless: bool = False
    # how the target's passes run, not what they compute: a static KV cache and each pass shape
    # replayed as a CUDA graph (the target on a CUDA device); the tokens are the same
    cuda_graphs: bool = False

    def __post_init__(self) -> None:
        if self.method not in METHODS:
            raise ValueError(f"unknown method {self.method!r}; choose from {', '.join(METHODS)}")
        if self.method in ("specvla", "specvla-relaxed", "heisd") and not self.drafter:
            raise ValueError(f"method {self.method} needs a drafter (--drafter DIR)")
        if self.method in ("retrieval", "heisd") and not self.datastore:
            raise ValueError(f"method {self.method} needs a datastore (--datastore DIR)")
        if self.retrieval_fallback not in FALLBACKS:
            raise ValueError(f"retrieval_fallback must be one of {', '.join(FALLBACKS)}, got {self.retrieval_fallback!r}")
        if self.drafter_tree not in ("fixed", "cost"):
            raise ValueError(f"drafter_tree must be 'fixed' or 'cost', got {self.drafter_tree!r}")
        if self.retrieval_fallback == "drafter" and self.method in ("retrieval", "heisd") and not self.drafter:
            raise ValueError("--retrieval-fallback drafter needs a drafter (--drafter DIR)")
        if self.switch not in ("cost", "threshold"):
            raise ValueError(f"switch must be 'cost' or 'threshold', got {self.switch!r}")
        if self.lossless and self.method == "specvla-relaxed":
            raise ValueError("--lossless contradicts specvla-relaxed (use specvla: exact acceptance)")
        if self.relaxed_r < 0:
            raise ValueError(f"relaxed_r must be >= 0, got {self.relaxed_r}")
        object.__setattr__(self, "tolerance", Tolerance.parse(self.tolerance).spec())  # canonical: one label
        if self.switch_threshold is not None and self.switch_threshold < 0:
            raise ValueError(f"switch_threshold must be >= 0, got {self.switch_threshold}")

    @property
    def label(self) -> str:
        """Name in reports, with the ablation switches that differ from the method's default."""
        parts = [self.method]
        if self.method in ("retrieval", "heisd"):
            if self.lossless:
                parts.append("lossless")
            else:
                if not self.verify_skip:
                    parts.append("no-skip")
                if not self.group_acceptance:
                    parts.append("no-group")
                if not self.prefill_skip:
                    parts.append("no-prefill-skip")
                if not self.gripper_guard:
                    parts.append("no-gripper-guard")
                if self.group_acceptance and self.tolerance != default_of(MethodConfig, "tolerance"):
                    parts.append(f"tol:{self.tolerance}")
            if not self.continuation:
                parts.append("no-continuation")
            if self.fused_prefill:
                parts.append("fuse")
            if self.retrieval_fallback != default_of(MethodConfig, "retrieval_fallback"):
                parts.append(f"{self.retrieval_fallback}-fallback")
        if self.method == "heisd" and self.switch == "threshold":
            parts.append("threshold")
        if self.drafter_tree != default_of(MethodConfig, "drafter_tree") and self.drafter:
            parts.append(f"{self.drafter_tree}-tree")
        label = "+".join(parts)
        if self.method == "heisd" and self.switch == "threshold" and self.switch_threshold is not None:
            return f"{label}@{self.switch_threshold:g}"
        return label


@dataclass
class Decoders:
    """What a policy needs: one configured decoder per mode and the mode chooser."""

    by_mode: dict[str, SpeculativeDecoder]  # mode name -> its decoder
    switch: Switch | None  # heisd's mode chooser, else None (single mode)
    retrieval: RetrievalProposer | None  # for skip-threshold updates
    drafter: Drafter | None = None  # the Drafter module the proposers run (shareable: it keeps no state)
    # metres per unit of an action's first three values, fitted on the datastore's demonstrations:
    # the switch integrates the emitted actions where no end-effector position arrives (None: it cannot)
    delta_scale: float | None = None

    @property
    def fixed_mode(self) -> str | None:
        return next(iter(self.by_mode)) if self.switch is None else None


def build_decoders(cfg: MethodConfig, target, datastore=None, drafter=None) -> Decoders:
    """The method's decoders and, for heisd, its kinematic switch. `datastore`: an opened
    `cfg.datastore` (else it is opened here); `drafter`: a loaded `cfg.drafter` (else it is loaded
    here). Both may be shared by many policies: neither keeps per-episode state."""
    if cfg.drafter and drafter is None:
        drafter = load_drafter(cfg, target)
    by_mode, retrieval = mode_decoders(cfg, target, datastore, drafter)
    switch = _switch(cfg, retrieval.datastore, target.spec.n_action_tokens) if cfg.method == "heisd" else None
    delta_scale = retrieval.datastore.extras.get("delta_scale") if switch is not None else None
    return Decoders(by_mode, switch, retrieval, drafter, delta_scale)


def mode_decoders(cfg: MethodConfig, target, datastore=None, drafter=None) -> tuple[dict, object | None]:
    """({mode: SpeculativeDecoder}, the RetrievalProposer or None): every decoder a method runs,
    built one way for eval, replay, bench and calibrate, so what is calibrated is what runs.
    `drafter`: the loaded Drafter module of `cfg.drafter` (None: loaded here)."""
    from heisd.decoding import DecodeConfig, ExactAcceptance, JacobiProposer, SpeculativeDecoder, TokenRelaxedAcceptance
    from heisd.decoding.fallback import CostFallback
    from heisd.decoding.graphs import make_verifier

    verifier = make_verifier(target, cfg.cuda_graphs)
    spec = target.spec
    dcfg = DecodeConfig(n_tokens=spec.n_action_tokens, vocab_size=spec.vocab_size, n_bins=spec.n_bins)
    drafter = _drafter_proposer(cfg, drafter or load_drafter(cfg, target), spec.n_action_tokens) if cfg.drafter else None
    if cfg.method == "ar":
        return {"drafter": SpeculativeDecoder(verifier, dcfg)}, None
    if cfg.method == "jacobi":
        jacobi = JacobiProposer(fused=cfg.fused_prefill)
        return {"jacobi": SpeculativeDecoder(verifier, dcfg, jacobi, ExactAcceptance())}, None
    if cfg.method in ("specvla", "specvla-relaxed"):
        rule = TokenRelaxedAcceptance(cfg.relaxed_r) if cfg.method == "specvla-relaxed" else ExactAcceptance()
        return {"drafter": SpeculativeDecoder(verifier, dcfg, drafter, rule)}, None
    if cfg.retrieval_fallback == "cost":  # the options in the order they are first tried
        options = {"ar": None, "jacobi": JacobiProposer(), **({"drafter": drafter} if drafter else {})}
        fallback = CostFallback(options)
    else:
        fallback = {"drafter": drafter, "jacobi": JacobiProposer(), "ar": None}[cfg.retrieval_fallback]
    retrieval, rule = _retrieval_proposer(cfg, target, datastore, fallback, SpeculativeDecoder(verifier, dcfg).vocab)
    by_mode = {"retrieval": SpeculativeDecoder(verifier, dcfg, retrieval, rule)}
    if cfg.method == "heisd":
        # a fallback and the drafter mode share one proposer: its per-step state is bracketed
        # by begin_step, and one control step runs one mode
        by_mode["drafter"] = SpeculativeDecoder(verifier, dcfg, drafter, ExactAcceptance())
    return by_mode, retrieval


def load_drafter(cfg: MethodConfig, target):
    """The Drafter module of `cfg.drafter`, read-only (eval mode, no gradients): one copy can serve
    every policy of a process, each with its own `DrafterProposer` (the per-step state)."""
    from heisd.drafter import Drafter, DrafterTarget

    drafter = Drafter.from_pretrained(Path(cfg.drafter), DrafterTarget.from_target(target))
    return drafter.eval().requires_grad_(False)


def _drafter_proposer(cfg: MethodConfig, drafter, n_tokens: int):
    from heisd.drafter import DrafterProposer

    return DrafterProposer(drafter, TreeConfig(cfg.tree_topk, cfg.tree_depth, cfg.tree_budget),
                           choose_tree=cfg.drafter_tree == "cost", cuda_graphs=cfg.cuda_graphs, n_tokens=n_tokens)


def retrieval_config(cfg: MethodConfig, target) -> RetrievalConfig:
    """The retrieval settings of `cfg` for this target's action layout."""
    spec = target.spec
    return RetrievalConfig.for_action(spec.action_dim, spec.chunk, k=cfg.retrieval_k,
                                      node_budget=cfg.retrieval_budget, payload=cfg.payload,
                                      continue_drafts=cfg.continuation, gripper_guard=cfg.gripper_guard,
                                      fused_prefill=cfg.fused_prefill,
                                      tolerance=Tolerance.parse(cfg.tolerance))


def _retrieval_proposer(cfg: MethodConfig, target, datastore, fallback, vocab):
    import numpy as np

    from heisd.decoding import ExactAcceptance
    from heisd.retrieval import PrefillSkip, RetrievalProposer, VerifySkip, open_datastore

    if datastore is None:
        datastore = open_datastore(cfg.datastore, target)
    rcfg = retrieval_config(cfg, target)
    plain = cfg.lossless  # retrieval drafts checked exactly, never skipped
    skip = VerifySkip.from_datastore(datastore) if cfg.verify_skip and not plain else None
    early = PrefillSkip.from_datastore(datastore) if cfg.prefill_skip and not plain else None
    zero_bins = np.tile(target.action_tokenizer.zero_bins(), target.spec.chunk).tolist()
    rule = rcfg.acceptance(zero_bins) if cfg.group_acceptance and not plain else ExactAcceptance()
    return RetrievalProposer(datastore, rcfg, fallback, vocab=vocab, verify_skip=skip, prefill_skip=early), rule


def _switch(cfg: MethodConfig, datastore, n_tokens: int):
    from heisd.kinematics import CostAwareSwitch, KinematicConfig, KinematicStats, KinematicSwitch
    from heisd.retrieval import DatastoreError

    extras = datastore.extras
    if "kinematic_stats" not in extras:
        raise DatastoreError(cfg.datastore, "has no kinematic statistics (rebuild it with build-datastore)")
    kcfg = KinematicConfig(**extras.get("kinematic_config", {}))
    stats = KinematicStats.from_dict(extras["kinematic_stats"])
    if cfg.switch == "cost":
        if "calibration_frames" not in extras:
            raise DatastoreError(cfg.datastore, "is not calibrated: run `heisd calibrate` "
                                 "(or use --switch threshold with --switch-threshold)")
        if "tokens_per_forward_retrieval" not in extras["calibration_frames"]:
            raise DatastoreError(cfg.datastore, "was calibrated by an older heisd (its figures are named tpf_*): "
                                 "run `heisd calibrate` again")
        return CostAwareSwitch(kcfg, stats, extras["calibration_frames"], n_tokens)
    threshold = cfg.switch_threshold
    if threshold is None:
        if "hybrid" not in extras:
            raise DatastoreError(cfg.datastore, "has no calibrated switch threshold: run `heisd calibrate` "
                                 "or pass --switch-threshold")
        threshold = float(extras["hybrid"]["threshold"])
    return KinematicSwitch(dataclasses.replace(kcfg, threshold=threshold), stats)
