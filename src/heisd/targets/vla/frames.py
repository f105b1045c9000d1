"""Training frames for the VLA: every step of every episode, held in memory.

A frame is (image at t, state at t, prompt of its episode) -> target chunk
(actions[t], ..., actions[t + chunk - 1]), padded past the episode end by repeating the
last action (the robot holds its last command once the task is done).
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import numpy as np
import torch

from heisd.data.dataset import DemoFile, DemoFormatError, Episode
from heisd.targets.vla.action_tokenizer import ActionTokenizer
from heisd.targets.vla.text_tokenizer import TextTokenizer
from heisd.targets.vla.vision import resize_views


@dataclass
class Frames:
    images: torch.Tensor  # uint8 [N, S, S, 3], already at the model's image size
    states: torch.Tensor  # float32 [N, state_dim]
    action_ids: torch.Tensor  # int64 [N, chunk * action_dim] target tokens
    prompt_ids: torch.Tensor  # int64 [N_episodes, L_max], LEFT-padded with the pad id
    prompt_mask: torch.Tensor  # int64 [N_episodes, L_max], 1 = real token
    episode: torch.Tensor  # int64 [N]: row of each frame in prompt_ids
    aux: torch.Tensor | None = None  # float32 [N, k]: an auxiliary loss's targets (`train.AuxiliaryLoss`)
    weight: torch.Tensor | None = None  # float32 [N]: each frame's weight in the loss (`keyframe_weights`)

    def __len__(self) -> int:
        return len(self.images)

    def to(self, device: torch.device | str) -> "Frames":
        """All frames on `device` (a GPU holds them easily), so a batch is gathered there."""
        return Frames(**{f: None if getattr(self, f) is None else getattr(self, f).to(device)
                         for f in self.__dataclass_fields__})

    def batch(self, idx: torch.Tensor) -> dict[str, torch.Tensor]:
        idx = idx.to(self.episode.device)
        ep = self.episode[idx]
        return {"images": self.images[idx], "state": self.states[idx], "action_ids": self.action_ids[idx],
                "prompt_ids": self.prompt_ids[ep], "prompt_mask": self.prompt_mask[ep],
                **({"aux": self.aux[idx]} if self.aux is not None else {}),
                **({"weight": self.weight[idx]} if self.weight is not None else {})}


@dataclass
class EpisodeRecord:
    """What the loader keeps of one episode before tokenization."""

    name: str
    task: str
    instruction: str
    images: np.ndarray  # uint8 [T, S, S, 3], resized
    states: np.ndarray  # float32 [T, state_dim]
    actions: np.ndarray  # float32 [T, A]
    gripper_width: int  # values of the gripper opening in the state, after the end effector's xyz (`Episode.state`)


def read_episodes(paths: Sequence[str | Path], image_size: int, benchmark: str | None = None,
                  skip_invalid: bool = False, views: int = 1) -> tuple[list[EpisodeRecord], int, int]:
    """Successful episodes of all files (each of the `views` cameras resized to image_size, stacked as
    the target reads them: `heisd.data.views`), how many failed ones were dropped,
    and how many invalid ones `skip_invalid` left out (else an invalid episode is an error).

    Failed demonstrations are dropped: behaviour cloning would imitate the failure. DAgger files
    keep theirs: the target acted there, but the labels are the expert's.
    """
    records, dropped, invalid = [], 0, 0
    for path in paths:
        with DemoFile(path, skip_invalid, views) as f:
            if f.skipped:
                invalid += len(f.skipped)
                print(f"{path}: left out {len(f.skipped)} invalid episodes: "
                      + "; ".join(f"{k} {v}" for k, v in f.skipped.items()), file=sys.stderr)
            found = f.attrs.get("benchmark")
            if benchmark is not None and found is not None and found != benchmark:
                raise DemoFormatError(f"{path}: demonstrations of benchmark {found!r}, not {benchmark!r}")
            keep_failed = f.attrs.get("source") == "dagger"
            for ep in f:
                if not ep.success and not keep_failed:
                    dropped += 1
                    continue
                records.append(_record(f"{Path(path).name}:{ep.name}", ep, image_size, views))
    if not records:
        raise DemoFormatError(f"no successful episodes in {[str(p) for p in paths]}")
    return records, dropped, invalid


def _record(name: str, ep: Episode, image_size: int, views: int) -> EpisodeRecord:
    images = resize_views(torch.from_numpy(ep.frames(views)), image_size, views).numpy()
    return EpisodeRecord(name, ep.task, ep.instruction, images, ep.state, ep.actions, ep.gripper.shape[1])


def chunk_targets(actions: np.ndarray, chunk: int) -> np.ndarray:
    """[T, A] -> [T, chunk, A]: row t holds actions t..t+chunk-1, the last one repeated past the end."""
    t = len(actions)
    idx = np.minimum(np.arange(t)[:, None] + np.arange(chunk)[None, :], t - 1)
    return actions[idx]


def left_padded(prompts: Sequence[Sequence[int]], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Prompts of one batch as (ids, mask) [N, L_max], LEFT-padded with `pad_id` (mask 1 = real token)."""
    width = max(len(p) for p in prompts)
    ids = torch.full((len(prompts), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(prompts), width), dtype=torch.long)
    for i, p in enumerate(prompts):
        ids[i, width - len(p):] = torch.tensor(p)
        mask[i, width - len(p):] = 1
    return ids, mask


def episode_rows(lengths: Sequence[int]) -> torch.Tensor:
    """int64 [sum(lengths)]: each frame's episode (its row in the prompt tensors)."""
    return torch.cat([torch.full((n,), i, dtype=torch.long) for i, n in enumerate(lengths)])


def keyframe_weights(actions: np.ndarray, window: int, weight: float) -> np.ndarray:
    """float32 [T]: `weight` on the `window` frames from each change of the gripper command (the last
    action value's sign), 1 elsewhere. Those are the frames where the command disagrees with the
    fingers, which follow it only a few steps later: a target that copies the fingers is wrong
    exactly there and nearly nowhere else (keyframe-focused imitation, Wen et al., 2021)."""
    sign = np.sign(actions[:, -1])
    w = np.ones(len(actions), dtype=np.float32)
    for t in np.nonzero(sign[1:] != sign[:-1])[0] + 1:
        w[t:t + window] = weight
    return w


def build_frames(records: Sequence[EpisodeRecord], text: TextTokenizer, actions: ActionTokenizer, chunk: int,
                 keyframe_window: int = 0, keyframe_weight: float = 1.0) -> Frames:
    """Every frame of `records`; with `keyframe_weight` != 1 each frame carries its loss weight."""
    weighted = keyframe_weight != 1.0 and keyframe_window > 0
    prompt_ids, prompt_mask = left_padded([text.encode_prompt(r.instruction) for r in records], text.pad_id)
    ids = [actions.encode(chunk_targets(r.actions, chunk)).reshape(len(r.actions), -1) for r in records]
    return Frames(
        images=torch.from_numpy(np.concatenate([r.images for r in records])),
        states=torch.from_numpy(np.concatenate([r.states for r in records]).astype(np.float32)),
        action_ids=torch.from_numpy(np.concatenate(ids)),
        prompt_ids=prompt_ids,
        prompt_mask=prompt_mask,
        episode=episode_rows([len(r.actions) for r in records]),
        weight=torch.from_numpy(np.concatenate([keyframe_weights(r.actions, keyframe_window, keyframe_weight)
                                                for r in records])) if weighted else None,
    )


class EpochSampler:
    """Random permutations of the frames, one per epoch; its state is part of train_state."""

    def __init__(self, n: int, batch_size: int, seed: int):
        self.n, self.batch_size = n, batch_size
        self.gen = torch.Generator().manual_seed(seed)
        self.perm, self.pos = torch.randperm(n, generator=self.gen), 0

    def next(self) -> torch.Tensor:
        if self.pos + self.batch_size > self.n:  # drop the ragged tail: every batch the same size
            self.perm, self.pos = torch.randperm(self.n, generator=self.gen), 0
        idx = self.perm[self.pos:self.pos + self.batch_size]
        self.pos += self.batch_size
        return idx

    def state_dict(self) -> dict:
        return {"gen": self.gen.get_state(), "perm": self.perm, "pos": self.pos}

    def load_state_dict(self, s: dict) -> None:
        self.gen.set_state(s["gen"])
        self.perm, self.pos = s["perm"], s["pos"]
