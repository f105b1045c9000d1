"""A heisd policy with LeRobot's policy interface: `reset()` at an episode's start, then
`select_action(batch)` per environment step -> a torch tensor [B, action_dim] (and
`predict_action_chunk(batch)` -> [B, chunk, action_dim]), so LeRobot's rollout loops can run it.

The batch is LeRobot's layout, as `lerobot.envs.utils.preprocess_observation` makes it plus the
task string: "observation.images.<cam>" (or "observation.image"): float [B, 3, H, W] in [0, 1]
(uint8 [B, H, W, 3] is taken too); "observation.state": float [B, S]; "task": B instructions. A
target that reads a wrist camera too (`train-vla --wrist`) takes it from `wrist_key` (LeRobot's
LIBERO datasets: "observation.images.wrist_image").
Feed it the environment's observation, not one normalized by a policy preprocessor: the target
normalizes its own inputs, and its actions come back in the environment's units.

Each batch row is its own heisd episode with its own policy: an in-process `VLAPolicy` (from a
`PolicyPool`: one target, datastore and drafter for all rows) or a `RemotePolicy` on a heisd server.
As LeRobot's chunking policies do, an inference returns a chunk whose first `n_action_steps`
actions are handed out one per call; the end-effector positions of the calls in between (the
state's `ee_slice`) reach the kinematic switch as the next inference's `ee_pos`.

Only the interface is LeRobot's: this class does not subclass `lerobot.policies.PreTrainedPolicy`,
whose package cannot be imported beside heisd's torch (README, "LeRobot").
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import Callable

import numpy as np
import torch

from heisd.data.views import stack_views

IMAGE_PREFIX = "observation.images."
SINGLE_IMAGE = "observation.image"


@dataclass(frozen=True)
class LeRobotAdapterConfig:
    # the camera to show the target; None: "observation.image", else the first camera by name
    image_key: str | None = None
    wrist_key: str | None = None  # the wrist camera, for a target that reads it (and only then)
    state_key: str = "observation.state"  # the robot state ("proprio" of a target that takes one)
    # where the end-effector position sits in the state (LeRobot's LIBERO and heisd's mw: the first
    # three values); None: the state holds none, the kinematic switch sees no motion
    ee_slice: tuple[int, int] | None = (0, 3)
    n_action_steps: int | None = None  # actions handed out per inference; None: the whole chunk

    def __post_init__(self) -> None:
        if self.n_action_steps is not None and self.n_action_steps < 1:
            raise ValueError(f"n_action_steps must be >= 1, got {self.n_action_steps}")
        if self.ee_slice is not None and self.ee_slice[1] - self.ee_slice[0] != 3:
            raise ValueError(f"ee_slice must span 3 values (x, y, z), got {self.ee_slice}")


class _Row:
    """One batch row's episode: its policy, the actions left of its chunk, its path since the last inference."""

    def __init__(self, policy):
        self.policy = policy
        self.instruction: str | None = None  # None: the episode has not started
        self.queue: deque = deque()
        self.path: list[np.ndarray] = []


class HeiSDPolicy:
    """LeRobot's policy interface over heisd policies (`VLAPolicy`'s reset / act / end_episode)."""

    name = "heisd"

    def __init__(self, make_policy: Callable[[], object], state_dim: int, chunk: int,
                 config: LeRobotAdapterConfig | None = None, task_of: dict[str, str] | None = None,
                 views: int = 1):
        """`make_policy()`: a fresh per-episode policy (called once per batch row); `state_dim`: the
        state values the target takes (0: none); `chunk`: actions per inference; `task_of`:
        instruction -> benchmark task name (the datastore collection; a server finds it itself);
        `views`: the cameras the target reads (2: `config.wrist_key` names the wrist camera)."""
        self.make_policy, self.state_dim, self.chunk = make_policy, state_dim, chunk
        self.task_of = task_of or {}
        self.config = config or LeRobotAdapterConfig()
        if (views == 2) != (self.config.wrist_key is not None):
            raise ValueError("the target reads the wrist camera too: give wrist_key, the batch's wrist camera"
                             if views == 2 else "wrist_key names a wrist camera, and the target reads one camera")
        if self.config.n_action_steps is not None and self.config.n_action_steps > chunk:
            raise ValueError(f"n_action_steps {self.config.n_action_steps} exceeds the target's chunk of {chunk}")
        self._rows: list[_Row] = []
        self.last_records: list = []  # the step records of the latest inference, one per row

    @classmethod
    def in_process(cls, target, method, config: LeRobotAdapterConfig | None = None) -> HeiSDPolicy:
        """Rows decoded here: `target` a loaded heisd target, `method` a MethodConfig. Instructions
        find their task (datastore collection) in the target's benchmark, as `heisd serve` does."""
        from heisd.benchmarks.registry import task_instructions
        from heisd.runtime.policy import PolicyPool
        from heisd.serving.launch import target_benchmark

        benchmark = target_benchmark(target)
        tasks = {} if benchmark is None else task_instructions(benchmark)
        pool = PolicyPool(target, method)
        return cls(pool.make, target.spec.state_dim, target.spec.chunk, config,
                   {instruction: task for task, instruction in tasks.items()}, target.spec.views)

    @classmethod
    def from_server(cls, url: str, config: LeRobotAdapterConfig | None = None, **client_kwargs) -> HeiSDPolicy:
        """Rows served by `heisd serve` at `url` (http:// REST or ws:// openpi), one server episode each."""
        from heisd.client import RemotePolicy, connect

        probe = connect(url, **client_kwargs)
        try:
            info = probe.info()
        finally:
            probe.close()
        chunk, views = info["target"]["action_shape"][0], info["target"].get("views", 1)
        return cls(lambda: RemotePolicy(connect(url, **client_kwargs), views), info["target"]["state_dim"], chunk,
                   config, views=views)

    def reset(self) -> None:
        """A new episode on every row (LeRobot calls this before each rollout); episodes still
        open end with their outcome unknown."""
        self.end_episode([None] * len(self._rows))

    def end_episode(self, successes: list[bool | None]) -> None:
        """Optional, before `reset()`: each row's outcome teaches the adaptive skips (None: unknown)
        and its episode ends (on a server: POST /end)."""
        for row, success in zip(self._rows, successes):
            if row.instruction is not None:
                row.policy.end_episode(success)
            row.instruction, row.path = None, []
            row.queue.clear()

    @torch.no_grad()
    def select_action(self, batch: dict) -> torch.Tensor:
        """The next action of every row, [B, action_dim]; a new chunk is inferred when a row's runs out."""
        image, state, tasks = self._inputs(batch)
        self._ensure_rows(len(tasks))
        for i, row in enumerate(self._rows[: len(tasks)]):
            if self.config.ee_slice is not None:
                lo, hi = self.config.ee_slice
                row.path.append(state[i, lo:hi].astype(np.float64))
        if any(not row.queue for row in self._rows[: len(tasks)]):
            chunk = self._infer(image, state, tasks)
            n = self.config.n_action_steps or self.chunk
            for row, actions in zip(self._rows, chunk):
                row.queue.clear()
                row.queue.extend(actions[:n])
        actions = np.stack([row.queue.popleft() for row in self._rows[: len(tasks)]])
        return torch.as_tensor(actions, dtype=torch.float32, device=_device(batch))

    @torch.no_grad()
    def predict_action_chunk(self, batch: dict) -> torch.Tensor:
        """A fresh chunk for every row, [B, chunk, action_dim] (the rows' episodes go on)."""
        image, state, tasks = self._inputs(batch)
        self._ensure_rows(len(tasks))
        return torch.as_tensor(np.stack(self._infer(image, state, tasks)), dtype=torch.float32, device=_device(batch))

    def _infer(self, image: np.ndarray, state: np.ndarray, tasks: list[str]) -> list[np.ndarray]:
        out, self.last_records = [], []
        for i, (row, task) in enumerate(zip(self._rows, tasks)):
            if row.instruction != task:  # a row's first step, or its environment switched task
                row.policy.reset(task, self.task_of.get(task))
                row.instruction = task
            proprio = state[i] if self.state_dim else np.zeros(0, np.float32)
            path = np.stack(row.path) if row.path else None
            actions, record = row.policy.act(image[i], proprio, path)
            row.path = []
            out.append(np.asarray(actions))
            self.last_records.append(record)
        return out

    def _ensure_rows(self, batch_size: int) -> None:
        while len(self._rows) < batch_size:
            self._rows.append(_Row(self.make_policy()))

    def _inputs(self, batch: dict) -> tuple[np.ndarray, np.ndarray, list[str]]:
        """(uint8 images [B, H, W, 3], float32 states [B, S], instructions) from LeRobot's batch."""
        key = self.config.image_key or _camera(batch, self.config.wrist_key)
        if key not in batch:
            raise KeyError(f"the batch has no {key!r}; its keys: {sorted(batch)}")
        image = _uint8_hwc(batch[key], key)
        if self.config.wrist_key is not None:
            if self.config.wrist_key not in batch:
                raise KeyError(f"the batch has no {self.config.wrist_key!r} (wrist_key); its keys: {sorted(batch)}")
            image = stack_views(image, _uint8_hwc(batch[self.config.wrist_key], self.config.wrist_key))
        tasks = batch.get("task")
        if isinstance(tasks, str):
            tasks = [tasks] * len(image)
        if not isinstance(tasks, (list, tuple)) or len(tasks) != len(image) or not all(isinstance(t, str) for t in tasks):
            raise ValueError(f"the batch needs 'task': one instruction string per row ({len(image)} rows)")
        if self.config.state_key in batch:
            state = _numpy(batch[self.config.state_key]).astype(np.float32)
        elif self.state_dim or self.config.ee_slice is not None:
            raise KeyError(f"the batch has no {self.config.state_key!r} (the target takes a state, or ee_slice "
                           "reads the end-effector position from it)")
        else:
            state = np.zeros((len(image), 0), np.float32)
        if state.ndim != 2 or len(state) != len(image):
            raise ValueError(f"{self.config.state_key}: shape {list(state.shape)}, expected [{len(image)}, S]")
        if self.state_dim and state.shape[1] != self.state_dim:
            raise ValueError(f"{self.config.state_key}: {state.shape[1]} values, the target takes {self.state_dim}")
        return image, state, list(tasks)


def _camera(batch: dict, wrist_key: str | None) -> str:
    if SINGLE_IMAGE in batch:
        return SINGLE_IMAGE
    cameras = sorted(k for k in batch if k.startswith(IMAGE_PREFIX) and k != wrist_key)
    if not cameras:
        raise KeyError(f"the batch has no image ({SINGLE_IMAGE!r} or {IMAGE_PREFIX}<camera>); its keys: {sorted(batch)}")
    return cameras[0]


def _numpy(value) -> np.ndarray:
    return value.detach().cpu().numpy() if isinstance(value, torch.Tensor) else np.asarray(value)


def _uint8_hwc(value, key: str) -> np.ndarray:
    """LeRobot's float [B, 3, H, W] in [0, 1] (or uint8 [B, H, W, 3]) -> uint8 [B, H, W, 3]."""
    image = _numpy(value)
    if image.ndim != 4:
        raise ValueError(f"{key}: shape {list(image.shape)}, expected [B, 3, H, W] or [B, H, W, 3]")
    if image.shape[1] == 3 and image.shape[3] != 3:
        image = image.transpose(0, 2, 3, 1)
    if image.dtype != np.uint8:
        if image.dtype.kind != "f":
            raise ValueError(f"{key}: dtype {image.dtype}, expected float in [0, 1] or uint8")
        image = np.clip(np.rint(image * 255.0), 0, 255).astype(np.uint8)
    return np.ascontiguousarray(image)


def _device(batch: dict) -> torch.device:
    tensor = next((v for v in batch.values() if isinstance(v, torch.Tensor)), None)
    return tensor.device if tensor is not None else torch.device("cpu")
