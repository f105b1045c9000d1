"""`heisd calibrate`: set the verify-skip theta and the hybrid threshold on held-out frames.

Frames are control steps as a run meets them: whole held-out episodes from their start, every
`chunk`-th step (the control cadence), tasks interleaved, `--frames` steps in all. Each step is
decoded as the policy decodes it: its own vision pass (prefix and retrieval key) and, per mode,
the action that mode decoded the step before (Jacobi's warm start, the skips' gripper guard).
Per frame: the target's greedy tokens and prefill hidden state, the datastore's Top-K;
s = cosine(hidden, top-1 stored hidden); whether the top-1 draft passes the group-relaxed
check against the greedy tokens; whether the gripper guard lets it skip; tokens per target
forward of retrieval SD (the real decode loop; after a rejected group the agreeing retrieved
sequences, then the `--retrieval-fallback` (by default the cost rule's pick of AR, Jacobi or the
drafter), as the methods run it; a frame that would skip at the calibrated theta counts n); the
same for drafter SD (`--drafter`; without one the drafter mode is taken as AR, 1 token per
forward); and the kinematic metric F over the episode's last w positions.
theta = `calibrate_theta` over frames where the free first-token guard and the gripper guard
hold (others never skip): the smallest theta that skips at least `--min-support` frames whose
Wilson lower bound on precision (`--confidence`) reaches `--precision`, else never skip (a
warning says why); the prefill-skip theta the same over the top-1 key similarity, on frames the
gripper guard allows, with the check on the whole action (no free first token before a
prefill); threshold = `calibrate_threshold` over frames with F (the switch uses the drafter
before w positions exist). Both, the support behind each theta and the per-frame numbers go
into the manifest's extras.
Held-out frames are an expert's successful episodes, or the target's own closed-loop rollouts
(`heisd demos --policy DIR`, every episode): the states the policy really visits (ours).
The decoders are the method's own (`runtime.methods.mode_decoders`, from the same flags as
eval): retrieval mode with its acceptance rule, drafter mode with exact acceptance.
"""

from __future__ import annotations

import argparse
import logging
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from heisd.errors import InputError

HELP = "Calibrate verify-skip theta and the hybrid kinematic threshold on held-out demonstrations."
HYBRID_KEY = "hybrid"  # extras: the calibrated F threshold and its numbers
FRAMES_KEY = "calibration_frames"  # extras: per-frame numbers behind both
ENCODE_BATCH = 16  # frames per greedy-rollout batch

log = logging.getLogger(__name__)


def add_arguments(p: argparse.ArgumentParser) -> None:
    from heisd.commands.common import add_decoding_arguments, add_target_arguments

    add_target_arguments(p)
    p.add_argument("--datastore", type=Path, required=True, help="datastore built for this target")
    p.add_argument("--demos", type=Path, nargs="+", required=True, help="held-out HDF5 demonstrations")
    p.add_argument("--precision", type=float, default=0.95,
                   help="required precision of skipped drafts: a lower confidence bound on it must reach this")
    p.add_argument("--min-support", type=int, default=20,
                   help="fewest held-out frames a skip threshold must skip (fewer: never skip)")
    p.add_argument("--confidence", type=float, default=0.95,
                   help="one-sided level of the Wilson lower bound on the skipped frames' precision, in [0.5, 1) "
                        "(0.5: the plain observed precision)")
    p.add_argument("--frames", type=int, default=512,
                   help="control steps decoded: whole held-out episodes from their start at the control cadence, "
                        "tasks interleaved (all if fewer)")
    # the decoders are built from these exactly as eval builds them: set them as the method will run
    add_decoding_arguments(p)
    p.add_argument("--no-gripper-guard", action="store_true",
                   help="calibrate for runs with --no-gripper-guard: skips may open or close the gripper (by "
                        "default the frames where the guard refuses a skip never skip)")
    p.add_argument("--threads", type=int, default=2, help="torch CPU threads")
    p.add_argument("--seed", type=int, default=0, help="the order of each task's episodes")


def run(args: argparse.Namespace) -> int:
    """Checks first; then the whole calibration holds the datastore's lock (the one writer)."""
    from heisd.commands.common import check_demos_camera
    from heisd.retrieval.build import check_held_out
    from heisd.storage import directory_lock

    if args.min_support < 1:
        raise InputError(f"--min-support must be >= 1, got {args.min_support}")
    if not 0.5 <= args.confidence < 1.0:
        raise InputError(f"--confidence must be in [0.5, 1), got {args.confidence}")
    if not 0.0 < args.precision <= 1.0:
        raise InputError(f"--precision must be in (0, 1], got {args.precision}")
    check_demos_camera(args.target, args.demos)
    check_held_out(args.datastore, args.demos)
    with directory_lock(args.datastore, "heisd calibrate", create=False):
        return _run(args)


def _run(args: argparse.Namespace) -> int:
    import faiss

    from heisd.commands.common import load_target, method_config
    from heisd.retrieval.build import open_datastore

    # heisd's decoders when a drafter is given (drafter mode as the method runs it), else
    # retrieval's (drafter mode taken as AR); skips off: calibration measures verified decoding
    method = method_config(args, "heisd" if args.drafter else "retrieval", verify_skip=False, prefill_skip=False)
    faiss.omp_set_num_threads(1)  # one query per control step, as at run time
    target = load_target(args)
    datastore = open_datastore(args.datastore, target)
    report = calibrate(target, datastore, args.demos, method, args.precision, args.frames, args.seed,
                       min_support=args.min_support, confidence=args.confidence)
    skip, hybrid = report["verify_skip"], report["hybrid"]
    print(f"{'held-out frames':<22}{skip['frames_total']} ({skip['frames']} with the first-token guard)")
    print(f"{'top-1 hidden cos':<22}median {skip['similarity_median']:.4f}   draft passes {skip['pass_rate']:.2f}")
    pre = report["prefill_skip"]
    for name, record in (("verify-skip theta", skip), ("prefill-skip theta", pre)):
        print(f"{name:<22}{_theta_line(record)}")
    print(f"{'':<22}(key cos median {pre['similarity_median']:.4f})")
    print(f"{'hybrid threshold F':<22}{hybrid['threshold']:.4f}   retrieval fraction "
          f"{hybrid['retrieval_fraction']:.2f}   tokens/forward {hybrid['expected_tokens_per_forward']:.2f} "
          f"(retrieval {hybrid['tokens_per_forward_retrieval_mean']:.2f}, drafter={hybrid['drafter']} "
          f"{hybrid['tokens_per_forward_drafter_mean']:.2f})")
    print(f"stored in {args.datastore}/manifest.json extras")
    return 0


def _theta_line(record: dict) -> str:
    support = record["support"]
    if record["theta"] > 1.0:
        return f"never skip ({record['unsupported']})"
    return (f"{record['theta']:.4f}   skip rate {record['skip_rate']:.2f}   "
            f"precision {record['achieved_precision']:.3f} on {support['skipped']} frames, {support['confidence']:.0%} lower bound {support['lower_bound']:.3f}"
            f" (target {record['precision_target']})")


def calibrate(target, datastore, demos: Sequence[str | Path], method, precision: float = 0.95, n_frames: int = 512,
              seed: int = 0, *, min_support: int = 20, confidence: float = 0.95) -> dict[str, Any]:
    """Measure the held-out frames with `method`'s decoders (a retrieval or heisd `MethodConfig`,
    skips off), set theta and the threshold, persist them; returns what was stored. A skip the
    frames cannot support is stored as never-skip, with a warning saying why."""
    from heisd.kinematics import calibrate_threshold
    from heisd.retrieval.verify_skip import EXTRAS_KEY, PREFILL_SKIP_KEY, calibrate_theta

    m, where = _measure(target, datastore, demos, method, n_frames, seed)
    rule = {"min_support": min_support, "confidence": confidence}
    fit = calibrate_theta(m["similarity"][m["guard"]], m["passes"][m["guard"]], precision, **rule)
    theta = fit.theta
    skipped = m["guard"] & (m["similarity"] >= theta)
    kept = m["gripper_kept"]  # the guard refuses a prefill skip elsewhere
    fit_pre = calibrate_theta(m["key_similarity"][kept], m["passes_full"][kept], precision, **rule)
    theta_pre = fit_pre.theta
    pre_skipped = kept & (m["key_similarity"] >= theta_pre)
    for key, f in ((EXTRAS_KEY, fit), (PREFILL_SKIP_KEY, fit_pre)):
        if f.reason is not None:
            log.warning("%s: never skipping: %s", key, f.reason)
    n = target.spec.n_action_tokens
    tpf_r = np.where(skipped | pre_skipped, float(n), m["tokens_per_forward_verified"])
    tpf_d = m["tokens_per_forward_drafter"]
    has_f = np.isfinite(m["F"])
    if not has_f.any():
        raise InputError("no held-out frame has the kinematic window; use longer episodes")
    threshold = calibrate_threshold(m["F"][has_f], tpf_r[has_f], tpf_d[has_f])
    use_r = m["F"][has_f] >= threshold
    skip = {
        "theta": theta, "calibrated_theta": theta, "precision_target": precision, "online_updates": 0,
        "frames": int(m["guard"].sum()), "frames_total": len(tpf_r), "payload": method.payload,
        "gripper_guard": method.gripper_guard,
        "k": method.retrieval_k,
        "skip_rate": float(skipped.mean()), "pass_rate": float(m["passes"].mean()),
        "achieved_precision": float(m["passes"][skipped].mean()) if skipped.any() else float("nan"),
        "similarity_median": float(np.median(m["similarity"])),
        "support": fit.support(), **({"unsupported": fit.reason} if fit.reason else {}),
    }
    prefill = {
        "theta": theta_pre, "calibrated_theta": theta_pre, "precision_target": precision, "online_updates": 0,
        "frames": len(pre_skipped), "skip_rate": float(pre_skipped.mean()), "gripper_guard": method.gripper_guard,
        "pass_rate": float(m["passes_full"].mean()),
        "achieved_precision": float(m["passes_full"][pre_skipped].mean()) if pre_skipped.any() else float("nan"),
        "similarity_median": float(np.median(m["key_similarity"])),
        "support": fit_pre.support(), **({"unsupported": fit_pre.reason} if fit_pre.reason else {}),
    }
    hybrid = {
        "threshold": threshold, "frames": int(has_f.sum()), "drafter": "drafter" if method.drafter else "ar",
        "retrieval_fallback": method.retrieval_fallback,
        "retrieval_fraction": float(use_r.mean()),
        "expected_tokens_per_forward": float(np.where(use_r, tpf_r[has_f], tpf_d[has_f]).mean()),
        "tokens_per_forward_retrieval_mean": float(tpf_r[has_f].mean()), "tokens_per_forward_drafter_mean": float(tpf_d[has_f].mean()),
    }
    frames = {key: np.round(values.astype(np.float64), 5).tolist() for key, values in
              {**m, "tokens_per_forward_retrieval": tpf_r}.items()}
    frames["prefill_skipped"] = pre_skipped.tolist()  # no target pass at all on these frames
    frames["F"] = [None if not np.isfinite(f) else f for f in frames["F"]]  # JSON has no NaN
    frames["frame"] = where  # [demo file, episode, step] of each row: the numbers can be re-measured
    datastore.update_extras({EXTRAS_KEY: skip, PREFILL_SKIP_KEY: prefill, HYBRID_KEY: hybrid, FRAMES_KEY: frames})
    return {"verify_skip": skip, "prefill_skip": prefill, "hybrid": hybrid}


def control_steps(lengths: Sequence[int], tasks: Sequence[str], n_frames: int, chunk: int,
                  seed: int) -> list[tuple[int, list[int]]]:
    """(episode, its control steps 0, chunk, 2 chunk, ...) in decode order, `n_frames` steps in all:
    whole episodes from their start, as a run meets them (each step's previous action is the one
    decoded before it); episodes in a seeded order within each task, tasks interleaved, the
    last one cut short when the frames run out."""
    rng = np.random.default_rng(seed)
    by_task: dict[str, list[int]] = {}
    for e, task in enumerate(tasks):
        by_task.setdefault(task, []).append(e)
    queues = [list(rng.permutation(episodes)) for episodes in by_task.values()]
    order = [int(q[i]) for i in range(max(map(len, queues), default=0)) for q in queues if i < len(q)]
    picked, left = [], n_frames
    for e in order:
        if left <= 0:
            break
        steps = list(range(0, lengths[e], chunk))[:left]
        picked.append((e, steps))
        left -= len(steps)
    return picked


def _measure(target, datastore, demos, method, n_frames: int, seed: int) -> tuple[dict[str, np.ndarray], list]:
    """Per control step: the skips' numbers and each mode's decode, with the context a run gives
    it: the policy's own vision pass (prefix and key) and that mode's previous action (Jacobi's
    warm start, the skips' gripper guard)."""
    import torch
    from tqdm import tqdm

    from heisd.data.views import target_frames
    from heisd.data.dataset import DemoFile
    from heisd.kinematics import KinematicConfig, KinematicStats, fused_metric
    from heisd.retrieval.build import KINEMATIC_STATS_KEY
    from heisd.retrieval.verify_skip import cosine, draft_passes
    from heisd.runtime.methods import mode_decoders
    from heisd.storage import recorded_path
    from heisd.targets.rollout import rollout_frames

    kin_config = KinematicConfig(**datastore.extras.get("kinematic_config", {}))
    kin_stats = KinematicStats.from_dict(datastore.extras[KINEMATIC_STATS_KEY])
    decoders, proposer = mode_decoders(method, target, datastore)
    retrieval, drafting = decoders["retrieval"], decoders.get("drafter")
    cfg, vocab = proposer.config, retrieval.vocab
    rule = retrieval.acceptance  # skipped drafts must pass the rule the method accepts with
    k = cfg.k
    episodes = []
    for path in demos:  # pass 1: which episodes count: an expert's successful ones, every target rollout
        with DemoFile(path) as f:
            rollouts = f.attrs.get("source") == "target"  # closed-loop calibration on the target's own states
            episodes += [(path, ep.name, len(ep), ep.task) for ep in f if ep.success or rollouts]
    if not episodes:
        raise InputError(f"no successful held-out episodes in {[str(p) for p in demos]}")
    spec = target.spec
    picked = control_steps([e[2] for e in episodes], [str(e[3]) for e in episodes], n_frames, spec.chunk, seed)
    rows: dict[str, list[float]] = {key: [] for key in (
        "similarity", "guard", "passes", "key_similarity", "passes_full", "gripper_kept",
        "tokens_per_forward_verified", "tokens_per_forward_drafter", "F")}
    where: list[list] = []
    w = kin_config.window
    with tqdm(total=sum(len(steps) for _, steps in picked), unit="frame", desc="calibrate") as bar:
        for e, steps in picked:
            path, name, _, _ = episodes[e]
            with DemoFile(path, views=spec.views) as f:
                ep = f.episode(name)
            # one vision pass per frame, a few frames per batch (episodes can be long): the prefix and key
            # each mode decodes from, the greedy tokens and the prefill hidden state
            images = target_frames(spec, ep, steps)  # row i: control step steps[i]
            rolled = [rollout_frames(target, images[j : j + ENCODE_BATCH], ep.instruction,
                                     ep.state[steps[j : j + ENCODE_BATCH]])
                      for j in range(0, len(steps), ENCODE_BATCH)]
            own_tokens = np.concatenate([r.features.tokens.numpy() for r in rolled])
            hidden = np.concatenate([r.features.hidden[:, 0].numpy() for r in rolled])
            for decoder in decoders.values():  # a new episode, as VLAPolicy.reset
                decoder.reset()
            previous: dict[str, list[int] | None] = {mode: None for mode in decoders}
            for i, t in enumerate(steps):
                batch, row = rolled[i // ENCODE_BATCH], i % ENCODE_BATCH
                prefix, key = batch.prefix[row : row + 1], batch.keys[row].numpy()
                with torch.inference_mode():  # as VLAPolicy.act: the decodes
                    result = datastore.query(key, ep.task, k)
                    top = cfg.sequences(result)[0]
                    own = own_tokens[i]
                    # one check serves both skips: verify-skip also needs the free first token to agree;
                    # either is refused where the guard would (a gripper change, or no previous action)
                    actions = all(vocab.is_action(int(x)) for x in top)
                    passes_full = actions and draft_passes(top, own, rule, vocab)
                    kept = proposer.keeps_gripper(top, previous["retrieval"])
                    guard = bool(top[0] == own[0]) and actions and kept
                    rows["similarity"].append(cosine(hidden[i], result.hidden[0]))
                    rows["guard"].append(guard)
                    rows["passes"].append(guard and passes_full)
                    rows["key_similarity"].append(float(result.similarities[0]))
                    rows["passes_full"].append(passes_full)
                    rows["gripper_kept"].append(kept)
                    for mode, decoder in decoders.items():  # each mode as a run of it decodes this step
                        context = {"key": key, "task": ep.task, "previous_action": previous[mode]}
                        decoded = decoder.decode(prefix, context)
                        previous[mode] = list(decoded.tokens)
                        column = "tokens_per_forward_verified" if mode == "retrieval" else "tokens_per_forward_drafter"
                        rows[column].append(decoded.tokens_per_forward)
                    if drafting is None:
                        rows["tokens_per_forward_drafter"].append(1.0)
                    window = ep.ee_pos[t - w + 1 : t + 1] if t + 1 >= w else None
                    rows["F"].append(np.nan if window is None else fused_metric(window, kin_stats, kin_config))
                    where.append([recorded_path(path), name, int(t)])
                    bar.update(1)
    flags = ("guard", "passes", "passes_full", "gripper_kept")
    return {key: np.asarray(values, dtype=bool if key in flags else np.float64)
            for key, values in rows.items()}, where
