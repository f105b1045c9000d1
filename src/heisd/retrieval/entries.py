"""Validation and in-memory accumulation of datastore entries before they are written."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

# Payload arrays stored per entry, one .npy file each (task_id indexes the task-name list).
PAYLOAD_FIELDS = ("keys", "tokens", "own_tokens", "hidden", "ee_pos", "episode", "step", "task_id")
GLOBAL_COLLECTION = "__global__"  # name of the all-entries collection; no task may use it


def _int32(name: str, value: int | np.ndarray) -> np.ndarray:
    array = np.asarray(value)
    if array.dtype.kind not in "iu":
        raise ValueError(f"{name} must hold integers, got dtype {array.dtype}")
    info = np.iinfo(np.int32)
    if array.size and (array.min() < info.min or array.max() > info.max):
        raise ValueError(f"{name} does not fit in int32")
    return array.astype(np.int32)


class EntryBuffer:
    """Checks shapes batch by batch, so a bad batch fails where it is added, not at finalize."""

    def __init__(
        self, key_dim: int, hidden_dim: int, n_tokens: int, n_sequences: int, tasks: Sequence[str] | None
    ) -> None:
        for name, value in (
            ("key_dim", key_dim),
            ("hidden_dim", hidden_dim),
            ("n_tokens", n_tokens),
            ("n_sequences", n_sequences),
        ):
            if value < 1:
                raise ValueError(f"{name} must be >= 1, got {value}")
        self.key_dim, self.hidden_dim = key_dim, hidden_dim
        self.n_tokens, self.n_sequences = n_tokens, n_sequences
        self.declared = tasks is not None
        self.tasks: list[str] = []
        self._task_ids: dict[str, int] = {}
        for task in tasks or ():
            self._task_id(task)
        self._batches: dict[str, list[np.ndarray]] = {field: [] for field in PAYLOAD_FIELDS}
        self.n_entries = 0

    def _task_id(self, task: str) -> int:
        if task not in self._task_ids:
            if not isinstance(task, str) or not task or task == GLOBAL_COLLECTION:
                raise ValueError(f"invalid task name {task!r}")
            self._task_ids[task] = len(self.tasks)
            self.tasks.append(task)
        return self._task_ids[task]

    def add(
        self,
        *,
        keys: np.ndarray,
        tokens: np.ndarray,
        own_tokens: np.ndarray,
        hidden: np.ndarray,
        ee_pos: np.ndarray,
        episode: int | np.ndarray,
        step: np.ndarray,
        task: str | Sequence[str],
    ) -> None:
        keys = np.asarray(keys, dtype=np.float32)
        if keys.ndim != 2 or keys.shape[1] != self.key_dim:
            raise ValueError(f"keys must have shape [B, {self.key_dim}], got {keys.shape}")
        b = keys.shape[0]
        norms = np.linalg.norm(keys, axis=1, keepdims=True)
        if not np.all(np.isfinite(norms)) or np.any(norms == 0):
            raise ValueError("keys must be finite and non-zero (they are L2-normalized)")
        batch = {
            "keys": keys / norms,
            "tokens": _int32("tokens", tokens),
            "own_tokens": _int32("own_tokens", own_tokens),
            "hidden": np.asarray(hidden, dtype=np.float32),
            "ee_pos": np.asarray(ee_pos, dtype=np.float32),
            "episode": np.broadcast_to(_int32("episode", episode), (b,)),
            "step": np.broadcast_to(_int32("step", step), (b,)),
        }
        names = [task] * b if isinstance(task, str) else list(task)
        if len(names) != b:
            raise ValueError(f"task must be one name or {b} names, got {len(names)}")
        if self.declared and (unknown := set(names) - set(self.tasks)):
            raise ValueError(f"tasks {sorted(unknown)} were not declared ({self.tasks})")
        expected = {
            "tokens": (b, self.n_sequences, self.n_tokens),
            "own_tokens": (b, self.n_tokens),
            "hidden": (b, self.hidden_dim),
            "ee_pos": (b, 3),
        }
        for field, shape in expected.items():
            if (got := batch[field].shape) != shape:
                raise ValueError(f"{field} must have shape {list(shape)}, got {list(got)}")
        # Task ids last: a rejected batch must not register a task that then has no entries.
        batch["task_id"] = np.array([self._task_id(t) for t in names], dtype=np.int32)
        for field in PAYLOAD_FIELDS:
            self._batches[field].append(np.array(batch[field]))  # copy: callers may reuse buffers
        self.n_entries += b

    def task_counts(self) -> list[int]:
        if not self.n_entries:
            return [0] * len(self.tasks)
        ids = np.concatenate(self._batches["task_id"])
        return np.bincount(ids, minlength=len(self.tasks)).tolist()

    def arrays(self) -> dict[str, np.ndarray]:
        return {field: np.concatenate(parts) for field, parts in self._batches.items()}
