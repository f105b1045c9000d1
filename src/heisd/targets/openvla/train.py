"""Behaviour cloning of an OpenVLA-architecture target (`heisd train-vla --arch openvla`).

The model is OpenVLA's (fused DINOv2 + SigLIP ViTs -> GELU MLP projector -> Llama, patches
after BOS), at a shape this machine can train (`synthetic.SHAPES`), trained end to end, and
saved in OpenVLA's file layout (config.json with norm_stats, preprocessor_config.json, the
tokenizer files, bf16 safetensors), so the native loader reads it like any OpenVLA checkpoint.
Frames and labels follow OpenVLA's LIBERO fine-tuning data: upright 256 px frames through the
protocol's JPEG round trip and Lanczos resize to 224 (`protocol_frames`, what its evaluation
feeds), the gripper as 1 = open, 0 = closed, q01/q99 statistics with the gripper unnormalized, and its
random 0.9-area crops (the evaluation's default center crop is their mean).
The loop, checkpoints and resume are `heisd.targets.vla.train`'s.
"""

from __future__ import annotations

import copy
import json
import shutil
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple, Sequence

import numpy as np
import torch
from tqdm import tqdm

from heisd.benchmarks.libero_protocol import openvla_gripper_label, protocol_frames
from heisd.data.dataset import DemoFile, DemoFormatError
from heisd.errors import UsageError
from heisd.storage import OutputKind
from heisd.storage.guard import has_file, json_with
from heisd.targets.openvla.config import CONFIG_FILE, PREPROCESSOR_FILE, OpenVLAConfig
from heisd.targets.openvla.load import ATTENTION, file_shapes, finish, load_openvla, read_parts
from heisd.targets.openvla.model import OpenVLA
from heisd.targets.openvla.resample import resampled_state
from heisd.targets.openvla.standin_tokenizer import save_standin_tokenizer
from heisd.targets.openvla.synthetic import IMAGE_SIZE, SHAPES, config_dict, preprocessor_dict, random_tensors
from heisd.targets.openvla.tiny import save_sharded
from heisd.targets.openvla.weights import to_file_key
from heisd.targets.vla.frames import Frames, chunk_targets, episode_rows, left_padded
from heisd.targets.vla.train import (INFO_FILE, LOG_FILE, TRAIN_STATE_FILE, AuxiliaryLoss, TrainConfig,
                                     TrainingSetup, _split, check_resumed_data, fit, guarded_run, resume_state)

WEIGHTS_FILE = "model.safetensors"
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json")
STATIC_FILES = (CONFIG_FILE, PREPROCESSOR_FILE, *TOKENIZER_FILES)
OPENVLA_RUN = OutputKind(
    "OpenVLA training run", lambda p: has_file(TRAIN_STATE_FILE)(p) or json_with(INFO_FILE, "model_config")(p),
    files=(*STATIC_FILES, WEIGHTS_FILE, TRAIN_STATE_FILE, LOG_FILE, INFO_FILE))
UNUSED_SEED = 0  # the never-run ViT keys a real file holds (last block, norm, pool head) are random


@dataclass(frozen=True)
class OpenVLAShape:
    """What `--arch openvla` may change of `synthetic.SHAPES[base]`."""

    base: str = "small"
    hidden_size: int | None = None  # Llama width (MLP 4x); None = the base shape's
    layers: int | None = None  # Llama decoder layers; None = the base shape's
    crop_area: float = 0.9  # OpenVLA's random-crop augmentation (its LIBERO eval center-crops this area); 1 = off
    noop_threshold: float = 0.1  # drop steps moving less than this in every dimension, gripper and fingers at rest
    patch_size: int | None = None  # ViT patch size in pixels; None = the base shape's (or the --init-from's)
    # > 0: the image tokens also predict the recorded end-effector and finger positions, a training-only
    # loss of this weight (`vla.train.AuxiliaryLoss`); the saved target still reads images alone
    aux_state_weight: float = 0.0

    def __post_init__(self) -> None:
        if not 0 < self.crop_area <= 1:
            raise UsageError(f"--crop-area must be in (0, 1], got {self.crop_area}")
        if not self.aux_state_weight >= 0:
            raise UsageError(f"--aux-state-weight must be >= 0, got {self.aux_state_weight}")
        if self.patch_size is not None and not (0 < self.patch_size <= IMAGE_SIZE
                                                and IMAGE_SIZE % self.patch_size == 0):
            raise UsageError(f"--patch-size must divide the {IMAGE_SIZE} px frame, got {self.patch_size}")

    def repatch(self, config: dict) -> dict:
        """`config` with both towers at this shape's patch size (unchanged without one)."""
        if self.patch_size is not None:
            for kwargs in config["timm_model_kwargs"]:
                kwargs["patch_size"] = self.patch_size
        return config

    def config(self, norm_stats: dict) -> dict:
        if self.base not in SHAPES:
            raise UsageError(f"unknown OpenVLA shape {self.base!r}; known: {', '.join(SHAPES)}")
        config = config_dict(self.base)
        text = config["text_config"]
        if self.hidden_size is not None:
            text.update(hidden_size=self.hidden_size, intermediate_size=4 * self.hidden_size)
        if self.layers is not None:
            text["num_hidden_layers"] = self.layers
        config["norm_stats"] = copy.deepcopy(norm_stats)
        return self.repatch(config)


def action_statistics(labels: np.ndarray, n_episodes: int) -> dict:
    """OpenVLA's dataset statistics entry for `labels` [N, 7] (gripper last, already 1 = open)."""
    a = labels.astype(np.float64)
    stat = {name: fn(a, axis=0).tolist() for name, fn in (("mean", np.mean), ("std", np.std), ("max", np.max),
                                                            ("min", np.min))}
    stat.update(q01=np.quantile(a, 0.01, axis=0).tolist(), q99=np.quantile(a, 0.99, axis=0).tolist(),
                mask=[True] * (a.shape[1] - 1) + [False])  # OpenVLA normalizes every dimension but the gripper
    return {"action": stat, "num_transitions": int(len(a)), "num_trajectories": int(n_episodes)}


FINGERS_AT_REST = 1e-3  # m in one step: fingers moving less have stopped (closing on an object: 2-4e-3 per step)


def moving_steps(actions: np.ndarray, threshold: float, fingers: np.ndarray | None = None) -> np.ndarray:
    """Indices of the steps to train on: OpenVLA's LIBERO data drops no-op steps (no motion, the gripper as
    before); here "no motion" is every arm component below `threshold` (0 keeps every step) and, where the
    finger positions [T, G] are given, the fingers at rest over the step. The scripted experts hold still
    for a fixed number of steps while the fingers close, and a target that reads no state cannot time that:
    trained on the whole wait it waits for ever (BENCHMARKS 15.3); trained on none of it, it never sees
    half-closed fingers labelled "close" and opens them again (15.6). So the steps whose fingers still move
    stay, and the rest of the wait goes."""
    if threshold <= 0:
        return np.arange(len(actions))
    grip = actions[:, -1]
    same = np.r_[False, grip[1:] == grip[:-1]]
    still = np.abs(actions[:, :-1]).max(axis=1) < threshold
    if fingers is not None:
        moved = np.abs(np.diff(fingers, axis=0)).max(axis=1, initial=0.0)  # step t: frame t -> t + 1
        still &= np.r_[moved < FINGERS_AT_REST, True]
    return np.flatnonzero(~(still & same))


class KeptEpisode(NamedTuple):
    """One episode to train on: where it is, and its steps that are not no-ops."""

    path: Path
    name: str
    instruction: str
    labels: np.ndarray  # OpenVLA's labels of the kept steps (`openvla_gripper_label`)
    steps: np.ndarray  # indices of the kept steps (`moving_steps`)
    robot: np.ndarray  # [kept, 3 + G]: end-effector and finger positions at the kept steps (auxiliary targets)


def _episodes(paths: Sequence[Path], skip_invalid: bool, noop_threshold: float
              ) -> tuple[list[KeptEpisode], int, int, str]:
    """Every successful episode (no-op steps left out), failed ones dropped, invalid ones, and the
    norm_stats key: the files' LIBERO suite when they agree, else "libero"."""
    kept, dropped, invalid, suites = [], 0, 0, set()
    for path in paths:
        with DemoFile(path, skip_invalid) as f:
            if f.libero is None:
                raise DemoFormatError(f"{path}: not a LIBERO demonstration file; --arch openvla trains on LIBERO "
                                      "files recorded at 256 px (`heisd demos --image-size 256 --shadows`)")
            invalid += len(f.skipped)
            suites.add(f.libero.suite)
            for name in f.episode_names():
                actions, success = f.summary(name)
                if not success and f.attrs.get("source") != "dagger":
                    dropped += 1
                    continue
                fingers = f.gripper_states(name)
                steps = moving_steps(actions, noop_threshold, fingers)
                robot = np.concatenate([f.ee_positions(name), fingers], axis=1)[steps]
                kept.append(KeptEpisode(Path(path), name, f.libero.instruction, openvla_gripper_label(actions[steps]),
                                        steps, robot))
    if not kept:
        raise DemoFormatError(f"no successful episodes in {[str(p) for p in paths]}")
    return kept, dropped, invalid, suites.pop() if len(suites) == 1 else "libero"


def _episode_frames(job: tuple[Path, str, np.ndarray]) -> np.ndarray:
    """One episode's kept frames as the target sees them (a worker process's job)."""
    path, name, steps = job
    with DemoFile(path) as f:
        return protocol_frames("openvla", f.episode(name).images[steps])


def read_frames(episodes: list[KeptEpisode], model: OpenVLA, workers: int, robot: bool = False) -> Frames:
    """The episodes' frames, prompts and action tokens, and with `robot` their end-effector and finger
    positions (the auxiliary loss's targets). Frames go through `protocol_frames` in `workers`
    processes, straight into one preallocated array (a few GB: never held twice)."""
    n = sum(len(e.labels) for e in episodes)
    size = model.spec.image_size
    images = torch.empty((n, size, size, 3), dtype=torch.uint8)
    prompt = model.parts.prompt  # left-padded, as teacher_forced's prompt_mask expects
    prompt_ids, prompt_mask = left_padded([prompt.encode(e.instruction) for e in episodes], prompt.pad_id)
    tok = model.action_tokenizer
    jobs = [(e.path, e.name, e.steps) for e in episodes]
    row = 0
    with ProcessPoolExecutor(max(1, workers)) as pool, tqdm(total=n, desc="frames", unit="frame") as bar:
        for frames in pool.map(_episode_frames, jobs):
            if frames.shape[1:] != (size, size, 3):
                raise DemoFormatError(f"frames of shape {frames.shape[1:]}, expected {(size, size, 3)}")
            images[row:row + len(frames)] = torch.from_numpy(frames)
            row += len(frames)
            bar.update(len(frames))
    ids = [tok.encode(chunk_targets(e.labels, 1)).reshape(len(e.labels), -1) for e in episodes]
    return Frames(images=images, states=torch.zeros((n, 0)), action_ids=torch.from_numpy(np.concatenate(ids)),
                  prompt_ids=prompt_ids, prompt_mask=prompt_mask,
                  episode=episode_rows([len(e.labels) for e in episodes]),
                  aux=torch.from_numpy(np.concatenate([e.robot for e in episodes]).astype(np.float32))
                  if robot else None)


def _auxiliary_loss(model: OpenVLA, weight: float, frames: list[Frames | None],
                    state: dict | None) -> AuxiliaryLoss | None:
    """The robot-state loss of `weight` (None at 0), its targets standardized with the training frames'
    statistics. A resumed run keeps the head it was started with."""
    if state is not None and ("aux" in state) != (weight > 0):
        raise UsageError("--resume with a different --aux-state-weight than the run was started with "
                         "(with one and without)")
    if weight == 0:
        return None
    train = frames[0]
    assert train is not None and train.aux is not None
    mean, std = train.aux.mean(0), train.aux.std(0).clamp(min=1e-6)
    for f in frames:
        if f is not None and f.aux is not None:
            f.aux = (f.aux - mean) / std
    grid = IMAGE_SIZE // patch_size(model)
    return AuxiliaryLoss(grid * grid, model.language_model.config.hidden_size, train.aux.shape[1], weight)


def new_model(out: Path, config: dict, seed: int) -> OpenVLA:
    """Write the checkpoint's static files into `out` and build the model they describe, freshly initialized:
    the Llama as `transformers` initializes it, the ViTs with timm's small-normal position embeddings."""
    (out / CONFIG_FILE).write_text(json.dumps(config, indent=2))
    (out / PREPROCESSOR_FILE).write_text(json.dumps(preprocessor_dict(), indent=2))
    save_standin_tokenizer(out)
    torch.manual_seed(seed)
    model = OpenVLA(read_parts(out, unnorm_key=None, weights=(WEIGHTS_FILE,)), ATTENTION)
    for name, p in model.vision_backbone.named_parameters():
        if name.endswith(("pos_embed", "cls_token", "reg_token")):  # zeros otherwise: no position signal
            torch.nn.init.trunc_normal_(p, std=0.02)
    return finish(model, torch.device("cpu"))


def patch_size(model: OpenVLA) -> int:
    return model.vision_backbone.featurizer.spec.patch_size


def _repatched(trained: OpenVLA, out: Path, shape: OpenVLAShape, key: str | None) -> OpenVLA:
    """`trained` at `shape.patch_size` (`heisd.targets.openvla.resample`): out's config.json rewritten,
    the model built from it, every weight carried over, the patch-grid ones resampled."""
    config = shape.repatch(json.loads((out / CONFIG_FILE).read_text()))
    (out / CONFIG_FILE).write_text(json.dumps(config, indent=2))
    model = OpenVLA(read_parts(out, unnorm_key=key, weights=(WEIGHTS_FILE,)), ATTENTION)
    state = trained.state_dict()
    vision = resampled_state(model.vision_backbone, trained.vision_backbone.state_dict())
    state.update({f"vision_backbone.{k}": v for k, v in vision.items()})
    model.load_state_dict(state)
    return finish(model, torch.device("cpu"))


def _stats_key(directory: Path, suite_key: str) -> str | None:
    """The statistics a fine-tuned checkpoint tokenizes its labels with: its only set, else the data's suite
    (`<suite>` or `<suite>_no_noops`, as OpenVLA-7B holds one set per dataset)."""
    return None if len(OpenVLAConfig.from_dir(directory).norm_stats) == 1 else suite_key


def save_weights(model: OpenVLA, out: Path) -> None:
    """model.safetensors in OpenVLA's key names and dtype (bf16), with the never-run keys a real file holds
    (the same random tensors at every checkpoint: a fixed seed)."""
    _, ignorable = file_shapes(model)
    vocab = model.parts.config.vocab_size
    tensors = random_tensors(ignorable, UNUSED_SEED, torch.device("cpu"), torch.bfloat16,
                             range(vocab - model.parts.config.n_action_bins, vocab))
    tensors.update({to_file_key(k): v.detach().to("cpu", torch.bfloat16) for k, v in model.state_dict().items()})
    for stale in [p for p in out.glob("model-*-of-*.safetensors")]:  # one file: a shard set would shadow it
        stale.unlink()
    save_sharded(out, tensors, shards=1)
    model.weights_rewritten()


def train_openvla(paths: list[Path], out: Path, cfg: TrainConfig, shape: OpenVLAShape, resume: bool = False,
                  overwrite: bool = False, skip_invalid: bool = False, device: str = "cpu", workers: int = 1,
                  init_from: Path | None = None) -> dict:
    """Train (or resume) an OpenVLA-architecture target on LIBERO demonstrations; the last logged metrics.
    `workers`: processes preparing frames; `init_from`: fine-tune that OpenVLA checkpoint (its shape, tokenizer
    and action statistics carry over). Resume, overwrite and the lock are as `vla.train.train`."""
    out = Path(out)

    def body() -> dict:
        started = time.perf_counter()
        episodes, dropped, invalid, name = _episodes(paths, skip_invalid, shape.noop_threshold)
        state = None
        if resume:
            state, run_cfg = resume_state(out, cfg)
            model = load_openvla(out, unnorm_key=_stats_key(out, name))
            model.load_state_dict(state["model"])
        elif init_from is not None:
            run_cfg = cfg
            out.mkdir(parents=True, exist_ok=True)
            for static in STATIC_FILES:
                shutil.copyfile(Path(init_from) / static, out / static)
            key = _stats_key(Path(init_from), name)
            model = load_openvla(init_from, unnorm_key=key)
            if shape.patch_size not in (None, patch_size(model)):
                model = _repatched(model, out, shape, key)
            model.parts = read_parts(out, unnorm_key=key, weights=(WEIGHTS_FILE,))  # the run's own files
        else:
            run_cfg = cfg
            labels = np.concatenate([e.labels for e in episodes])
            stats = {name: action_statistics(labels, len(episodes))}
            out.mkdir(parents=True, exist_ok=True)
            model = new_model(out, shape.config(stats), run_cfg.seed)
        model.train_crop_area = shape.crop_area
        train_eps, val_eps = _split(len(episodes), run_cfg.val_fraction, run_cfg.seed)
        robot = shape.aux_state_weight > 0
        frames = [read_frames([episodes[i] for i in eps], model, workers, robot) if eps else None
                  for eps in (train_eps, val_eps)]
        data = {"train_episodes": len(train_eps), "val_episodes": len(val_eps), "train_frames": len(frames[0]),
                "val_frames": len(frames[1]) if frames[1] else 0}
        check_resumed_data(state, data)
        config = json.loads((out / CONFIG_FILE).read_text())
        config.pop("norm_stats")
        aux = _auxiliary_loss(model, shape.aux_state_weight, frames, state)
        setup = TrainingSetup(model, frames[0], frames[1], data, dropped, invalid, state,
                              lambda o: save_weights(model, o), {"arch": "openvla", **config,
                                                                  "crop_area": shape.crop_area,
                                                                  "noop_threshold": shape.noop_threshold,
                                                                  "aux_state_weight": shape.aux_state_weight},
                              aux)
        return fit(setup, out, run_cfg, paths, init_from, torch.device(device), started)

    return guarded_run(out, OPENVLA_RUN, resume, overwrite, body)
