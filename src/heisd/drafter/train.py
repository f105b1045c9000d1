"""Training the drafter on the target's own greedy outputs (EAGLE recipe).

Data: the target runs over demonstration frames (prefill + greedy AR over the action
tokens) and keeps its greedy tokens and the lm_head inputs that predicted them. The
drafter learns, from pair i = (feature_i, token_i), the next feature (smooth-L1) and the
target's next greedy token through the frozen lm_head (cross-entropy). Generated features
are cached in the output directory, keyed by target fingerprint and data selection.
"""

from __future__ import annotations

import json
import logging
import math
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from itertools import groupby
from pathlib import Path

import numpy as np
import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file
from torch.nn import functional as F
from tqdm import tqdm

from heisd.data.views import target_frames
from heisd.data.dataset import DemoFile, DemoFormatError
from heisd.decoding.rollout import Features
from heisd.drafter.model import CONFIG_FILE, WEIGHTS_FILE, Drafter, DrafterConfig, DrafterTarget, additive_mask
from heisd.errors import InputError
from heisd.storage import (
    OutputKind,
    append_text,
    atomic_file,
    check_output,
    clear_output,
    directory_lock,
    recorded_command,
    recorded_path,
    strict_json,
    write_json,
)
from heisd.storage.guard import json_with
from heisd.targets.base import Target
from heisd.targets.rollout import rollout_frames

log = logging.getLogger(__name__)

FEATURES_FILE = "features.safetensors"
LOG_FILE = "train_log.jsonl"
INFO_FILE = "train_info.json"
DRAFTER_RUN = OutputKind(  # the log and the feature cache alone are what an unfinished run leaves
    "drafter", lambda p: json_with(CONFIG_FILE, "target_fingerprint")(p) or json_with(INFO_FILE, "drafter_config")(p),
    files=(CONFIG_FILE, WEIGHTS_FILE, LOG_FILE, INFO_FILE), reusable=(FEATURES_FILE, LOG_FILE))


@dataclass(frozen=True)
class DrafterTrainConfig:
    steps: int = 3000  # optimizer steps
    batch_size: int = 128  # frames per step; each gives n_action_tokens - 1 predictions
    lr: float = 1e-3  # peak AdamW learning rate (linear warmup, then cosine decay to 5%)
    warmup_steps: int = 100  # linear warmup steps
    grad_clip: float = 0.5  # global gradient-norm clip
    feature_weight: float = 1.0  # smooth-L1 on the next feature (EAGLE's v_w)
    token_weight: float = 0.1  # cross-entropy of the target's greedy next token (EAGLE's p_w)
    seed: int = 0  # episode split, frame subset, init, batches
    val_fraction: float = 0.05  # episodes held out for the reported accuracy
    max_frames: int | None = None  # random subset of training frames: bounds generation time
    max_val_frames: int = 2048  # held-out frames (evenly spaced subset)
    rollout_batch_size: int = 64  # frames per target pass while generating features (one episode's at most)
    eval_every: int = 500  # steps between held-out evaluations (train_log.jsonl)


@dataclass(frozen=True)
class EpisodeRef:
    """A successful demonstration episode, read when its frames are encoded."""

    path: Path
    name: str
    length: int  # frames


def successful_episodes(demos: Sequence[Path], skip_invalid: bool = False) -> list[EpisodeRef]:
    """Failed demonstrations are left out: the drafter learns the target on the task's real states.
    `skip_invalid`: episodes with unusable data are left out too (listed on stderr), else refused."""
    refs = []
    for path in demos:
        with DemoFile(path, skip_invalid) as f:
            if f.skipped:
                log.warning("%s: left out %d invalid episodes: %s", path, len(f.skipped),
                            "; ".join(f"{k} {v}" for k, v in f.skipped.items()))
            refs += [EpisodeRef(Path(path), ep.name, len(ep)) for ep in f if ep.success]
    if not refs:
        raise DemoFormatError(f"no successful episodes in {[str(p) for p in demos]}")
    return refs


def target_features(target: Target, episodes: Sequence[EpisodeRef], idx: torch.Tensor, batch_size: int,
                    desc: str) -> Features:
    """The target's greedy rollout on frames `idx` (sorted, counted over `episodes` in order), in
    batches of one episode's frames: one instruction per batch, so no prompt is ever padded."""
    starts = np.cumsum([0] + [e.length for e in episodes])
    parts = []
    with tqdm(total=len(idx), desc=desc, unit="frame", dynamic_ncols=True) as bar:
        for path, group in groupby(range(len(episodes)), key=lambda e: episodes[e].path):
            # skip_invalid: `episodes` holds only valid ones (successful_episodes refused or left out the rest)
            with DemoFile(path, skip_invalid=True, views=target.spec.views) as f:
                for e in group:
                    steps = (idx[(idx >= starts[e]) & (idx < starts[e + 1])] - starts[e]).numpy()
                    if not len(steps):
                        continue
                    ep = f.episode(episodes[e].name)
                    for chunk in np.array_split(steps, -(-len(steps) // batch_size)):
                        frames = target_frames(target.spec, ep, chunk)
                        out = rollout_frames(target, frames, ep.instruction, ep.state[chunk])
                        parts.append(out.features)
                        bar.update(len(chunk))
    return Features(torch.cat([p.hidden for p in parts]), torch.cat([p.tokens for p in parts]))


def rows(drafter: Drafter, feats: Features, idx: torch.Tensor) -> Features:
    """Rows `idx` of the generated (CPU, float32) features on the drafter's device, in its dtype."""
    w = drafter.fc.weight
    return Features(feats.hidden[idx].to(w.device, w.dtype), feats.tokens[idx].to(w.device))


def drafter_outputs(drafter: Drafter, feats: Features) -> torch.Tensor:
    """Teacher-forced drafter outputs [B, n-1, d] for pairs 0..n-2 (pair i predicts feature i+1)."""
    b, n = feats.tokens.shape
    device = feats.tokens.device
    positions = torch.arange(n - 1, device=device).expand(b, -1)
    causal = additive_mask(torch.ones(n - 1, n - 1, dtype=torch.bool).tril()).to(device)
    return drafter(feats.hidden[:, :-1], feats.tokens[:, :-1], positions, causal)


def drafter_loss(drafter: Drafter, feats: Features, cfg: DrafterTrainConfig) -> tuple[torch.Tensor, dict[str, float]]:
    out = drafter_outputs(drafter, feats)
    feature_loss = F.smooth_l1_loss(out, feats.hidden[:, 1:])
    token_loss = F.cross_entropy(drafter.logits(out).flatten(0, 1), feats.tokens[:, 1:].flatten())
    loss = cfg.feature_weight * feature_loss + cfg.token_weight * token_loss
    return loss, {"loss": loss.item(), "feature_loss": feature_loss.item(), "token_loss": token_loss.item()}


@torch.no_grad()
def top1_accuracy(drafter: Drafter, feats: Features, batch_size: int = 512) -> tuple[float, list[float]]:
    """How often the drafter's best action token equals the target's greedy token (overall, per position 1..n-1)."""
    hits = []
    for idx in torch.arange(len(feats)).split(batch_size):
        part = rows(drafter, feats, idx)
        best = drafter.action_logits(drafter_outputs(drafter, part)).argmax(-1) + drafter.first_action_id
        hits.append(best == part.tokens[:, 1:])
    ok = torch.cat(hits).float().cpu()
    return ok.mean().item(), [round(v, 4) for v in ok.mean(0).tolist()]


def fit(drafter: Drafter, train: Features, cfg: DrafterTrainConfig, val: Features | None = None,
        log_path: Path | None = None) -> dict[str, float]:
    """Optimize the drafter in place; returns the last training metrics (averaged since the last eval)."""
    gen = torch.Generator().manual_seed(cfg.seed)
    opt = torch.optim.AdamW(drafter.parameters(), lr=cfg.lr, betas=(0.9, 0.95), weight_decay=0.0)

    def schedule(step: int) -> float:
        if step < cfg.warmup_steps:
            return (step + 1) / cfg.warmup_steps
        t = (step - cfg.warmup_steps) / max(1, cfg.steps - cfg.warmup_steps)
        return 0.05 + 0.95 * 0.5 * (1 + math.cos(math.pi * min(1.0, t)))

    sched = torch.optim.lr_scheduler.LambdaLR(opt, schedule)
    drafter.train()
    sums: dict[str, float] = {}
    metrics: dict[str, float] = {}
    bar = tqdm(range(1, cfg.steps + 1), desc="train-drafter", dynamic_ncols=True)
    for step in bar:
        idx = torch.randint(len(train), (min(cfg.batch_size, len(train)),), generator=gen)
        loss, parts = drafter_loss(drafter, rows(drafter, train, idx), cfg)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(drafter.parameters(), cfg.grad_clip)
        opt.step()
        sched.step()
        sums = {k: sums.get(k, 0.0) + v for k, v in parts.items()}
        bar.set_postfix(loss=f"{parts['loss']:.4f}")
        if step % cfg.eval_every == 0 or step == cfg.steps:
            n = (step - 1) % cfg.eval_every + 1
            metrics = {"step": step, **{f"train_{k}": v / n for k, v in sums.items()}}
            if val is not None:
                drafter.eval()
                metrics["val_top1"], metrics["val_top1_by_position"] = top1_accuracy(drafter, val)
                drafter.train()
            if log_path is not None:
                append_text(log_path, strict_json(metrics) + "\n")
            bar.write(" ".join(f"{k}={v:.4g}" for k, v in metrics.items() if isinstance(v, float)))
            sums = {}
    drafter.eval()
    return metrics


def split_frames(episodes: list[EpisodeRef], cfg: DrafterTrainConfig
                 ) -> tuple[list[EpisodeRef], torch.Tensor, list[EpisodeRef], torch.Tensor]:
    """Held-out whole episodes (unseen trajectories), then frame subsets of both sides:
    (train episodes, their frames used, held-out episodes, their frames used)."""
    if len(episodes) < 2:
        raise InputError("need at least 2 successful episodes: one is held out for the accuracy")
    perm = torch.randperm(len(episodes), generator=torch.Generator().manual_seed(cfg.seed)).tolist()
    n_val = min(len(episodes) - 1, max(1, round(cfg.val_fraction * len(episodes))))
    train, val = ([episodes[i] for i in sorted(ids)] for ids in (perm[n_val:], perm[:n_val]))
    n_train_all, n_val_all = (sum(e.length for e in side) for side in (train, val))
    n_train = n_train_all if cfg.max_frames is None else min(cfg.max_frames, n_train_all)
    train_idx = torch.randperm(n_train_all, generator=torch.Generator().manual_seed(cfg.seed))[:n_train].sort().values
    val_idx = torch.linspace(0, n_val_all - 1, min(cfg.max_val_frames, n_val_all)).round().long().unique()
    return train, train_idx, val, val_idx


def _features(target: Target, fingerprint: str, demos: Sequence[Path], out: Path,
              cfg: DrafterTrainConfig, skip_invalid: bool) -> tuple[Features, Features, dict]:
    """Generated target features, from the cache in ``out`` when it was made the same way."""
    key = json.dumps({"target": fingerprint, "seed": cfg.seed, "val_fraction": cfg.val_fraction,
                      "max_frames": cfg.max_frames, "max_val_frames": cfg.max_val_frames,
                      "demos": [[str(p.resolve()), p.stat().st_size, p.stat().st_mtime_ns] for p in demos]})
    path = out / FEATURES_FILE
    if path.is_file():
        with safe_open(str(path), "pt") as f:
            same = (f.metadata() or {}).get("key") == key
        if same:
            t = load_file(str(path))
            log.info("using cached target features %s", path)
            return (Features(t["train_hidden"].float(), t["train_tokens"]),
                    Features(t["val_hidden"].float(), t["val_tokens"]), {"features_cached": True})
        log.info("%s was made from other data or another target: regenerating", path)
    start = time.perf_counter()
    train_eps, train_idx, val_eps, val_idx = split_frames(successful_episodes(demos, skip_invalid), cfg)
    train = target_features(target, train_eps, train_idx, cfg.rollout_batch_size, "target rollout (train)")
    val = target_features(target, val_eps, val_idx, cfg.rollout_batch_size, "target rollout (held out)")
    tensors = {"train_hidden": train.hidden.half(), "train_tokens": train.tokens,  # fp16: half the disk
               "val_hidden": val.hidden.half(), "val_tokens": val.tokens}
    with atomic_file(path) as tmp:
        save_file({k: v.contiguous() for k, v in tensors.items()}, str(tmp), metadata={"key": key})
    return train, val, {"features_cached": False, "generation_time_s": round(time.perf_counter() - start, 1)}


def train_drafter(target: Target, target_dir: str | Path, demos: Sequence[Path], out: Path,
                  cfg: DrafterTrainConfig, overwrite: bool = False, skip_invalid: bool = False) -> dict:
    """Generate (or reuse) `target`'s features, train a drafter, save it to ``out``; returns train_info.
    The drafter's layer copies the target LLM's shape (`DrafterConfig.for_target`): a 4096-wide
    target gets a 4096-wide drafter.

    A drafter already in ``out`` needs ``overwrite`` (the feature cache is kept and reused);
    ``out`` holds the lock meanwhile. ``skip_invalid``: leave out episodes with unusable data.
    """
    out = Path(out)
    replace = check_output(out, DRAFTER_RUN, overwrite)
    with directory_lock(out):
        if replace:
            clear_output(out, DRAFTER_RUN)
        return _train_drafter(target, target_dir, demos, out, cfg, skip_invalid)


def _train_drafter(target: Target, target_dir: str | Path, demos: Sequence[Path], out: Path,
                   cfg: DrafterTrainConfig, skip_invalid: bool) -> dict:
    wall0 = time.perf_counter()
    bound = DrafterTarget.from_target(target)
    train, val, gen_info = _features(target, bound.fingerprint, [Path(p) for p in demos], out, cfg, skip_invalid)
    torch.manual_seed(cfg.seed)
    drafter = Drafter(DrafterConfig.for_target(bound, max_positions=target.spec.n_action_tokens), bound)
    (out / LOG_FILE).unlink(missing_ok=True)
    t0 = time.perf_counter()
    metrics = fit(drafter, train, cfg, val, out / LOG_FILE)
    drafter.save_pretrained(out)
    info = {"command": recorded_command(), "seed": cfg.seed, "target": recorded_path(target_dir),
            "target_fingerprint": bound.fingerprint, "demos": [recorded_path(p) for p in demos],
            "train_frames": len(train), "val_frames": len(val), "val_top1": metrics["val_top1"], **gen_info,
            "threads": torch.get_num_threads(), "drafter_params": sum(p.numel() for p in drafter.parameters()),
            "train_time_s": round(time.perf_counter() - t0, 1), "wall_time_s": round(time.perf_counter() - wall0, 1),
            "train_config": asdict(cfg), "drafter_config": asdict(drafter.config), "final": metrics}
    write_json(out / INFO_FILE, info)
    return info
