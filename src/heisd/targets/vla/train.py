"""Behaviour cloning of the VLA: teacher-forced cross-entropy on the action tokens only.

`DIR/` holds the latest checkpoint (VLA files) plus `train_state.pt` (weights, optimizer,
scheduler, sampler and RNG state, so `resume` continues exactly), `train_log.jsonl`
(validation token accuracy over time) and `train_info.json` (what was run, on what data).
"""

from __future__ import annotations

import json
import math
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable, Sequence

import numpy as np
import torch
from tqdm import tqdm

from heisd.data.dataset import EE_DIMS, compute_action_stats
from heisd.errors import InputError, UsageError
from heisd.storage import (OutputKind, append_text, atomic_file, check_output, clear_output, directory_lock,
                           recorded_command, recorded_path, strict_json, write_json, write_text)
from heisd.storage.guard import has_file, json_with
from heisd.targets.base import TeacherForced
from heisd.targets.vla.checkpoint import CHECKPOINT_FILES, CONFIG_FILE
from heisd.targets.vla.frames import EpisodeRecord, EpochSampler, Frames, build_frames, read_episodes
from heisd.targets.vla.model import VLA, NormStats, VLAConfig
from heisd.targets.vla.text_tokenizer import TextTokenizer

TRAIN_STATE_FILE = "train_state.pt"
LOG_FILE = "train_log.jsonl"
INFO_FILE = "train_info.json"
TRAINING_RUN = OutputKind(
    "VLA checkpoint", lambda p: has_file(TRAIN_STATE_FILE)(p) or json_with(CONFIG_FILE, "text_vocab_size")(p)
    or json_with(INFO_FILE, "model_config")(p), files=(*CHECKPOINT_FILES, TRAIN_STATE_FILE, LOG_FILE, INFO_FILE))


@dataclass
class TrainConfig:
    steps: int = 8000  # optimizer steps in total (a resumed run stops here too)
    batch_size: int = 64  # frames per step
    lr: float = 1e-3  # peak learning rate (AdamW); beat 5e-4 in a 300-step comparison
    weight_decay: float = 0.01  # AdamW decay on matrices (not norms, biases)
    warmup_steps: int = 200  # linear warmup, then cosine decay
    min_lr_ratio: float = 0.05  # cosine floor as a fraction of lr
    grad_clip: float = 1.0  # global gradient-norm clip
    seed: int = 0  # data split, init, sampling and augmentation
    val_fraction: float = 0.05  # episodes held out for validation
    eval_every: int = 500  # steps between validation + log lines
    save_every: int = 1000  # steps between checkpoints
    max_val_frames: int = 2048  # validation cost bound
    keyframe_weight: float = 1.0  # loss weight of the frames just after a gripper command change (1: none)
    keyframe_window: int = 8  # frames from each change that get it (the fingers start to follow 2-5 later)


def _lr_lambda(cfg: TrainConfig):
    def f(step: int) -> float:
        if step < cfg.warmup_steps:
            return (step + 1) / cfg.warmup_steps
        t = min(1.0, (step - cfg.warmup_steps) / max(1, cfg.steps - cfg.warmup_steps))
        return cfg.min_lr_ratio + (1 - cfg.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * t))
    return f


def _optimizer(modules: Sequence[torch.nn.Module], cfg: TrainConfig) -> torch.optim.AdamW:
    params = [p for m in modules for p in m.parameters()]
    decay = [p for p in params if p.ndim >= 2]
    rest = [p for p in params if p.ndim < 2]
    return torch.optim.AdamW([{"params": decay, "weight_decay": cfg.weight_decay},
                              {"params": rest, "weight_decay": 0.0}], lr=cfg.lr, betas=(0.9, 0.95))


def action_loss(model: torch.nn.Module, batch: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    """Cross-entropy over the action tokens only, and the logits [B, n, V] that gave it."""
    loss, out = _action_loss(model, batch)
    return loss, out.logits


def _action_loss(model: torch.nn.Module, batch: dict[str, torch.Tensor]) -> tuple[torch.Tensor, TeacherForced]:
    """Mean token cross-entropy; frames that carry a weight (`Frames.weight`) count by it."""
    out = model.teacher_forced(batch["images"], batch["prompt_ids"], batch["state"],
                               batch["action_ids"], batch["prompt_mask"])
    if "weight" not in batch:
        return torch.nn.functional.cross_entropy(out.logits.flatten(0, 1), batch["action_ids"].flatten()), out
    per_frame = torch.nn.functional.cross_entropy(out.logits.transpose(1, 2), batch["action_ids"],
                                                  reduction="none").mean(1)
    return (per_frame * batch["weight"]).sum() / batch["weight"].sum(), out


class AuxiliaryLoss(torch.nn.Module):
    """Privileged supervision in training only: a linear head reads the robot state the frame was
    recorded in (standardized) from the image tokens, and its squared error joins the action loss, so
    that the vision learns to show what a target reading no state must see (the fingers, the hand's
    height). The head is never saved with the target; train_state.pt keeps it for resuming."""

    def __init__(self, n_tokens: int, width: int, targets: int, weight: float):
        super().__init__()
        self.head = torch.nn.Linear(n_tokens * width, targets)
        self.weight = weight

    def forward(self, features: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.mse_loss(self.head(features.flatten(1).float()), targets)


@torch.no_grad()
def evaluate(model: torch.nn.Module, frames: Frames, max_frames: int, batch_size: int = 256) -> dict[str, float]:
    """Teacher-forced greedy metrics on held-out frames (an evenly spaced subset if large)."""
    was_training = model.training
    model.eval()
    tok = model.action_tokenizer
    idx = torch.linspace(0, len(frames) - 1, min(max_frames, len(frames))).round().long().unique()
    loss_sum, correct, bin_err = 0.0, [], []
    for part in idx.split(batch_size):
        batch = frames.batch(part)
        loss, logits = action_loss(model, batch)
        loss_sum += loss.item() * len(part)
        correct.append(logits.argmax(-1) == batch["action_ids"])
        # bin error of the best action token (a non-action argmax has no bin)
        best = logits[..., tok.vocab.first_id:tok.vocab_size].argmax(-1) + tok.vocab.first_id
        bin_err.append((tok.vocab.bin(best) - tok.vocab.bin(batch["action_ids"])).abs().float())
    model.train(was_training)
    ok = torch.cat(correct)
    return {"val_loss": loss_sum / len(idx), "val_acc": ok.float().mean().item(),
            "val_chunk_acc": ok.all(1).float().mean().item(), "val_bin_err": torch.cat(bin_err).mean().item()}


def _split(n_episodes: int, val_fraction: float, seed: int) -> tuple[list[int], list[int]]:
    """Held-out episodes (whole episodes, so validation frames are unseen trajectories)."""
    n_val = min(n_episodes - 1, round(val_fraction * n_episodes)) if val_fraction > 0 else 0
    perm = torch.randperm(n_episodes, generator=torch.Generator().manual_seed(seed)).tolist()
    return sorted(perm[n_val:]), sorted(perm[:n_val])


def _action_bins(paths: Sequence[Path], action_bounds: str, skip_invalid: bool) -> tuple[np.ndarray, np.ndarray, dict]:
    """The demonstrations' action bins (low and high ends, `ActionStats.bounds`) and what norm stats record of them."""
    stats = compute_action_stats(paths, skip_invalid)
    low, high = stats.bounds(action_bounds)
    return low, high, {"action": stats.to_dict(), "action_bounds": action_bounds}


def _new_model(records, paths, chunk: int, overrides: dict, seed: int, instructions: Sequence[str],
               skip_invalid: bool, action_bounds: str) -> VLA:
    low, high, extra = _action_bins(paths, action_bounds, skip_invalid)
    states = np.concatenate([r.states for r in records])
    norm = NormStats(q01=low, q99=high, state_mean=states.mean(0),
                     state_std=np.maximum(states.std(0), 1e-2),  # floor: a near-constant dim must not blow up
                     extra=extra)
    text = TextTokenizer.train([r.instruction for r in records] + list(instructions))
    config = VLAConfig(text_vocab_size=text.vocab_size, action_dim=len(low), chunk=chunk,
                       state_dim=int(states.shape[1]), **overrides)
    _check_settings(config)
    torch.manual_seed(seed)
    return VLA(config, norm, text)


def demo_camera(paths: Sequence[Path]) -> str | None:
    """The camera the demonstrations were recorded with (heisd's mw files say; None if none says):
    closed-loop runs must show the target the same one."""
    from heisd.data.dataset import recorded_settings

    cameras = {s["camera"] for s in recorded_settings(paths) if s.get("camera")}
    if len(cameras) > 1:
        raise InputError(f"the demonstrations were recorded with different cameras ({sorted(cameras)}): "
                         "train on one camera's frames")
    return cameras.pop() if cameras else None


def read_train_info(checkpoint: str | Path) -> dict:
    """A checkpoint's train_info.json ({} when it has none, e.g. a converted checkpoint)."""
    info = Path(checkpoint) / INFO_FILE
    if not info.is_file():
        return {}
    try:
        return json.loads(info.read_text())
    except json.JSONDecodeError as e:
        raise InputError(f"{info}: unreadable training record ({e})") from e


def trained_camera(checkpoint: str | Path) -> str | None:
    """The camera a checkpoint's demonstrations were recorded with (its train_info.json), if known."""
    return read_train_info(checkpoint).get("camera")


def _initial_model(directory: Path, chunk: int) -> VLA:
    """A checkpoint to fine-tune: its tokenizers and action bins carry over. Another chunk re-chunks it:
    the decoder that emitted one action's tokens learns to go on with the next ones."""
    if not (Path(directory) / CONFIG_FILE).is_file():
        raise InputError(f"--init-from {directory}: not a VLA checkpoint (no {CONFIG_FILE})")
    model = VLA.from_pretrained(directory)
    model.config.chunk = chunk
    _check_settings(model.config)
    return model


def bounds_of(model: VLA) -> str:
    """Where the model's action bins end (`ActionStats.bounds`); checkpoints that do not say have OpenVLA's."""
    return model.norm_stats.extra.get("action_bounds", "quantile")


def _check_settings(config: VLAConfig) -> None:
    """Settings the flags ask for that no target can have (a chunk with no room left for the prompt), named."""
    try:
        config.validate()
    except ValueError as e:
        raise UsageError(f"the target's settings are refused: {e}") from e


def _mask_gripper(model: VLA, records: Sequence[EpisodeRecord], resumed: bool) -> None:
    """Stop the model reading the gripper opening (new, fine-tuned: `VLAConfig.masked_state`); a
    resumed run keeps what it was started with."""
    widths = {r.gripper_width for r in records}
    if len(widths) != 1:
        raise InputError(f"the demonstrations record the gripper with different widths ({sorted(widths)})")
    dims = tuple(range(EE_DIMS, EE_DIMS + widths.pop()))
    if resumed:
        if not set(dims) <= set(model.config.masked_state):
            raise UsageError("--no-gripper-state on --resume: the run was started reading the gripper opening "
                             "(resume it without the flag, or start another run)")
        return
    model.mask_state(tuple(sorted(set(model.config.masked_state) | set(dims))))


def _add_film(model: VLA, resumed: bool) -> None:
    """Condition the model's vision on the instruction (new, fine-tuned: `VLAConfig.film`); a resumed run
    keeps what it was started with."""
    if resumed and not model.config.film:
        raise UsageError("--film on --resume: the run was started without FiLM (resume it without the flag, "
                         "or start another run)")
    model.add_film()


@dataclass
class TrainingSetup:
    """What a training run needs besides its config: the model kind's own part (heisd's VLA here,
    OpenVLA's architecture in `heisd.targets.openvla.train`); `fit` runs the loop shared by both."""

    model: torch.nn.Module  # has teacher_forced, action_tokenizer and fingerprint() as a Target
    train_frames: Frames
    val_frames: Frames | None
    data: dict  # episode/frame counts, checked again on resume
    dropped: int  # failed demonstrations left out
    invalid: int  # demonstrations with unusable data left out (skip_invalid)
    state: dict | None  # train_state.pt contents when resuming
    save_model: Callable[[Path], None]  # writes the inference files into the run directory
    model_config: dict  # recorded in train_info.json
    aux: AuxiliaryLoss | None = None  # trained beside the model, never saved with it (frames carry batch["aux"])


def resume_state(out: Path, cfg: TrainConfig) -> tuple[dict, TrainConfig]:
    """`out`'s train_state.pt and the config to continue with: the saved one, with this run's step count
    and cadence (the trajectory-defining settings stay as saved)."""
    if not (out / TRAIN_STATE_FILE).is_file():
        raise UsageError(f"--resume: no {TRAIN_STATE_FILE} in {out} (nothing to continue)")
    state = torch.load(out / TRAIN_STATE_FILE, weights_only=True, map_location="cpu")
    return state, TrainConfig(**{**state["train_config"], "steps": cfg.steps, "eval_every": cfg.eval_every,
                                 "save_every": cfg.save_every})


def check_resumed_data(state: dict | None, data: dict) -> None:
    """A resumed run must see the demonstrations it was started on (the same counts)."""
    if state is not None and state["data"] != data:
        raise InputError(f"--resume with different demonstrations: saved {state['data']}, now {data}")


def _setup(paths: list[Path], out: Path, cfg: TrainConfig, chunk: int | None, overrides: dict, resume: bool,
           benchmark: str | None, instructions: Sequence[str], skip_invalid: bool,
           init_from: Path | None, mask_gripper: bool, film: bool,
           action_bounds: str | None) -> tuple[TrainingSetup, TrainConfig]:
    state, model = None, None
    if resume:
        state, cfg = resume_state(out, cfg)
        model = VLA.from_pretrained(out)
        model.load_state_dict(state["model"])
        if chunk is not None and chunk != model.config.chunk:
            raise UsageError(f"--chunk {chunk} on --resume: the run in {out} predicts {model.config.chunk} "
                             "actions per inference (resume it without --chunk, or start another run)")
        if action_bounds is not None and action_bounds != bounds_of(model):
            raise UsageError(f"--action-bounds {action_bounds} on --resume: the run in {out} has its bins at "
                             f"{bounds_of(model)} (resume it without --action-bounds, or start another run)")
    elif chunk is None:
        raise UsageError("a new training run needs its chunk (actions per inference)")
    elif init_from is not None:
        model = _initial_model(init_from, chunk)
    config = model.config if model else VLAConfig(0, **overrides)
    records, dropped, invalid = read_episodes(paths, config.image_size, benchmark, skip_invalid, config.views)
    if model is None:
        model = _new_model(records, paths, chunk, overrides, cfg.seed, instructions, skip_invalid,
                           action_bounds or "quantile")
    elif state is None and action_bounds is not None:  # a fine-tune onto its own demonstrations' bins, as OpenVLA's
        low, high, extra = _action_bins(paths, action_bounds, skip_invalid)
        model.rebin_actions(low, high, {**model.norm_stats.extra, **extra})
    if mask_gripper:
        _mask_gripper(model, records, resumed=resume)
    if film:
        _add_film(model, resumed=resume)
    train_eps, val_eps = _split(len(records), cfg.val_fraction, cfg.seed)
    # validation stays unweighted: its loss compares with runs trained without keyframe weights
    frames = [build_frames([records[i] for i in eps], model.text_tokenizer, model.action_tokenizer,
                           model.config.chunk, keyframe_window=cfg.keyframe_window,
                           keyframe_weight=cfg.keyframe_weight if train else 1.0)
              if eps else None for eps, train in ((train_eps, True), (val_eps, False))]
    data = {"train_episodes": len(train_eps), "val_episodes": len(val_eps), "train_frames": len(frames[0]),
            "val_frames": len(frames[1]) if frames[1] else 0}
    check_resumed_data(state, data)
    return TrainingSetup(model, frames[0], frames[1], data, dropped, invalid, state, model.save_pretrained,
                         model.config.to_dict()), cfg


def train(paths: list[Path], out: Path, cfg: TrainConfig, chunk: int | None = 2, model_overrides: dict | None = None,
          resume: bool = False, benchmark: str | None = None, instructions: Sequence[str] = (),
          overwrite: bool = False, skip_invalid: bool = False, init_from: Path | None = None,
          device: str = "cpu", mask_gripper: bool = False, film: bool = False,
          action_bounds: str | None = None) -> dict:
    """Train (or resume) and return the last logged metrics.

    `instructions`: extra instructions (the benchmark's task registry) for the text tokenizer,
    besides those found in the demonstrations. `benchmark`: demo files must say the same.
    An existing run in `out` needs `resume` (continue it) or `overwrite` (its files are removed
    when this run starts); `out` holds the lock meanwhile. A run that fails before its first
    checkpoint removes what it wrote, and `out` if it made it. `skip_invalid`: leave out episodes
    with unusable data instead of refusing them. `init_from`: start from that checkpoint (weights,
    tokenizers, normalization: fine-tuning, e.g. a DAgger round) instead of a new model.
    `device`: where the model and all frames live while training (the saved files are the same);
    a run resumed on another device continues the same schedule, not the same random stream.
    `chunk`: actions per inference (None on `resume`: the run's own; an `init_from` model is re-chunked).
    `mask_gripper`: the model stops reading the gripper opening (`VLAConfig.masked_state`). `film`: its
    vision reads the instruction (`VLAConfig.film`; an `init_from` model gets the FiLM layers at zero).
    `action_bounds`: where the action bins end (`ActionStats.bounds`; None: a new model's are `quantile`,
    an `init_from` model keeps its own, given: its bins are recomputed from `paths`; a resumed run's own).
    """
    def body() -> dict:
        started = time.perf_counter()
        setup, run_cfg = _setup(paths, out, cfg, chunk, model_overrides or {}, resume, benchmark, instructions,
                                skip_invalid, init_from, mask_gripper, film, action_bounds)
        return fit(setup, out, run_cfg, paths, init_from, torch.device(device), started)

    return guarded_run(Path(out), TRAINING_RUN, resume, overwrite, body)


def guarded_run(out: Path, kind: OutputKind, resume: bool, overwrite: bool, body: Callable[[], dict]) -> dict:
    """Run `body` holding `out`'s lock: an existing run needs `resume` or `overwrite`, and a run that
    fails before its first resume point leaves nothing behind."""
    replace = not resume and check_output(out, kind, overwrite, resume_flag="--resume")
    with directory_lock(out):
        if replace:
            clear_output(out, kind)
        try:
            return body()
        except Exception:
            # a refused run (bad data, a full disk) before its first resume point leaves nothing: its
            # log alone would make `out` look like no heisd run; the lock removes a folder it made
            if not (out / TRAIN_STATE_FILE).is_file():
                clear_output(out, kind)
            raise


def fit(setup: TrainingSetup, out: Path, cfg: TrainConfig, paths: Sequence[Path], init_from: Path | None,
        device: torch.device, started: float) -> dict:
    """The loop: batches, AdamW with warmup and cosine decay, validation lines, checkpoints with the
    complete resume state. Returns the last logged metrics. `started`: when the run began reading its
    data (`time.perf_counter()`), for the recorded wall time."""
    wall0 = started
    model, data, state = setup.model.to(device), setup.data, setup.state
    train_frames = setup.train_frames.to(device)
    val_frames = setup.val_frames.to(device) if setup.val_frames is not None else None
    model.train()
    aux = setup.aux.to(device) if setup.aux is not None else None
    opt = _optimizer([model] + ([aux] if aux is not None else []), cfg)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, _lr_lambda(cfg))
    sampler = EpochSampler(len(train_frames), cfg.batch_size, cfg.seed)
    step, train_time = 0, 0.0
    if state is not None:
        if aux is not None:
            aux.load_state_dict(state["aux"])
        opt.load_state_dict(state["optimizer"])
        sched.load_state_dict(state["scheduler"])
        sampler.load_state_dict(state["sampler"])
        torch.set_rng_state(state["torch_rng"])
        step, train_time = state["step"], state["train_time_s"]
    _truncate_log(out / LOG_FILE, step)

    info = {"command": recorded_command(), "seed": cfg.seed, "demos": [recorded_path(p) for p in paths], **data,
            "camera": demo_camera(paths),
            "init_from": recorded_path(init_from) if init_from is not None else None,
            "dropped_failed_episodes": setup.dropped, "dropped_invalid_episodes": setup.invalid, "threads": torch.get_num_threads(),
            "device": torch.cuda.get_device_name(device) if device.type == "cuda" else device.type,
            "params": sum(p.numel() for p in model.parameters()), "train_config": asdict(cfg),
            "model_config": setup.model_config}
    metrics: dict = {}
    loss_sum, acc_sum, aux_sum, n_sum = 0.0, 0.0, 0.0, 0  # train_loss is the action loss, without the auxiliary one
    # closed on an error too, before the command line prints it (as the last line)
    with tqdm(total=cfg.steps, initial=step, desc="train-vla", dynamic_ncols=True) as bar:
        t0, step0 = time.perf_counter(), step
        while step < cfg.steps:
            batch = train_frames.batch(sampler.next())
            loss, forced = _action_loss(model, batch)
            logits, total = forced.logits, loss
            if aux is not None:
                assert forced.features is not None, "an auxiliary loss needs the target's image tokens"
                aux_loss = aux(forced.features, batch["aux"])
                total = loss + aux.weight * aux_loss
                aux_sum += aux_loss.item()
            opt.zero_grad(set_to_none=True)
            total.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip)
            opt.step()
            sched.step()
            step += 1
            acc = (logits.argmax(-1) == batch["action_ids"]).float().mean().item()
            loss_sum, acc_sum, n_sum = loss_sum + loss.item(), acc_sum + acc, n_sum + 1
            bar.update(1)
            bar.set_postfix(loss=f"{loss.item():.3f}", acc=f"{acc:.3f}")
            if step % cfg.eval_every == 0 or step == cfg.steps:
                elapsed = train_time + time.perf_counter() - t0
                metrics = {"step": step, "lr": sched.get_last_lr()[0], "train_loss": loss_sum / n_sum,
                           **({"train_aux_loss": aux_sum / n_sum} if aux is not None else {}),
                           "train_acc": acc_sum / n_sum, "train_time_s": round(elapsed, 1),
                           "samples_per_s": round((step - step0) * cfg.batch_size / (time.perf_counter() - t0), 1)}
                if val_frames is not None:
                    metrics.update(evaluate(model, val_frames, cfg.max_val_frames))
                append_text(out / LOG_FILE, strict_json(metrics) + "\n")
                bar.write(" ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in metrics.items()))
                loss_sum, acc_sum, aux_sum, n_sum = 0.0, 0.0, 0.0, 0
            if step % cfg.save_every == 0 or step == cfg.steps:
                now = train_time + time.perf_counter() - t0
                _save(setup.save_model, out, {"step": step, "train_time_s": now, "train_config": asdict(cfg), "data": data,
                                   "model": model.state_dict(), "optimizer": opt.state_dict(),
                                   "scheduler": sched.state_dict(), "sampler": sampler.state_dict(),
                                   "torch_rng": torch.get_rng_state(),
                                   **({"aux": aux.state_dict()} if aux is not None else {})})
                write_json(out / INFO_FILE, {**info, "step": step, "train_time_s": round(now, 1),
                                                     "wall_time_s": round(time.perf_counter() - wall0, 1),
                                                     "fingerprint": model.fingerprint(), "last_metrics": metrics})
    return metrics


def _save(save_model: Callable[[Path], None], out: Path, train_state: dict) -> None:
    """Checkpoint files first, train_state last: resume reads the weights from train_state,
    so a crash in between leaves a consistent (older) resume point."""
    save_model(out)
    with atomic_file(out / TRAIN_STATE_FILE) as tmp, open(tmp, "wb") as f:
        torch.save(train_state, f)  # through Python's file: a full disk is an OSError (to a path: a bare RuntimeError)


def _truncate_log(path: Path, step: int) -> None:
    """Drop log lines past the resume point (written after the last checkpoint of a killed run)."""
    if not path.is_file():
        return
    lines = [ln for ln in path.read_text().splitlines() if ln.strip() and json.loads(ln)["step"] <= step]
    write_text(path, "".join(ln + "\n" for ln in lines))
