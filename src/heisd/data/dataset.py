"""Reader for demonstration files in the LIBERO/robomimic HDF5 layout.

    data/                      attrs: benchmark, env_args (JSON), created, heisd_version
      demo_<i>/                attrs: task, instruction, success
        actions                (T, A) float32
        obs/agentview_rgb      (T, H, W, 3) uint8, upright
        obs/ee_pos             (T, 3) float32
        obs/gripper_states     (T, G) float32
        obs/goal_pos           (T, 3) float32, optional (Meta-World's goal; LIBERO has none)
        obs/eye_in_hand_rgb    (T, H, W, 3) uint8, optional (LIBERO's wrist camera, stored as agentview is)

The same code reads our files (`data` has a `benchmark` attribute) and LIBERO's own dataset
files and OpenVLA's regenerated no-noop files (`heisd.data.libero_files`: the task comes from
`data` attrs or the file name, not per-episode attrs; their frames are stored upside down, as the
simulator renders them, and are rotated 180 degrees on reading, as OpenVLA does). Opening a file
checks every episode: the layout, uint8 images, and (reading the small arrays) at least one step
and finite actions and states. A bad episode is refused with file and episode named, or, with
`skip_invalid`, left out and listed in `DemoFile.skipped` (layout errors are always refused).
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Iterator, Sequence

import h5py
import numpy as np

from heisd.data.views import stack_views
from heisd.errors import InputError

REQUIRED_DATASETS = ("actions", "obs/agentview_rgb", "obs/ee_pos", "obs/gripper_states")
NUMERIC_DATASETS = ("actions", "obs/ee_pos", "obs/gripper_states", "obs/goal_pos")  # must be finite
WRIST_DATASET = "obs/eye_in_hand_rgb"  # LIBERO's name for its wrist camera's frames
SKIP_FLAG = "--skip-invalid-episodes"  # the flag that asks to leave invalid episodes out


class DemoFormatError(InputError):
    """A demonstration file that does not follow the layout; the message names file and key."""


EE_DIMS = 3  # `Episode.state` starts with the end effector's xyz, then the gripper opening


@dataclass(frozen=True)
class Episode:
    name: str
    task: str
    instruction: str
    actions: np.ndarray  # (T, A) float32
    images: np.ndarray  # (T, H, W, 3) uint8, upright
    ee_pos: np.ndarray  # (T, 3) float32
    gripper: np.ndarray  # (T, G) float32
    success: bool
    goal_pos: np.ndarray | None = None  # (T, 3) float32 when the benchmark shows the goal
    wrist_images: np.ndarray | None = None  # (T, H, W, 3) uint8, upright: the wrist camera, when read

    @property
    def state(self) -> np.ndarray:
        """The state given to the VLA: end-effector xyz, gripper opening, goal xyz if recorded."""
        parts = [self.ee_pos, self.gripper] + ([self.goal_pos] if self.goal_pos is not None else [])
        return np.concatenate(parts, axis=1).astype(np.float32)

    def frames(self, views: int, steps: slice | np.ndarray = slice(None)) -> np.ndarray:
        """The frames a target with `views` cameras reads at `steps` (`heisd.data.views`)."""
        if views == 1:
            return self.images[steps]
        if self.wrist_images is None:
            raise ValueError(f"episode {self.name} was read without its wrist frames (DemoFile(..., views=2))")
        return stack_views(self.images[steps], self.wrist_images[steps])

    def __len__(self) -> int:
        return len(self.actions)


def _attr(obj, key: str) -> str:
    value = obj.attrs[key]
    return value.decode() if isinstance(value, bytes) else str(value)


def _heisd_layout(data: h5py.Group) -> bool:
    """heisd's files name the benchmark on `data` and task and instruction on every episode;
    LIBERO's and OpenVLA's files do neither."""
    first = next((data[k] for k in data.keys() if k.startswith("demo_")), None)
    return "benchmark" in data.attrs or (first is not None and "task" in first.attrs)


class DemoFile:
    """Open with ``with DemoFile(path) as f: for ep in f: ...``. Validates on open."""

    def __init__(self, path: str | Path, skip_invalid: bool = False, views: int = 1):
        self.path = Path(path)
        self.wrist = views == 2  # episodes carry the wrist camera's frames too (a file without them is refused)
        self.skipped: dict[str, str] = {}  # episode -> why it was left out (with skip_invalid)
        if not self.path.is_file():
            raise DemoFormatError(f"{self.path}: no such demonstration file")
        try:
            self._h5 = h5py.File(self.path, "r")
        except OSError as e:  # truncated or not HDF5 at all
            raise DemoFormatError(f"{self.path}: not a readable HDF5 file ({e})") from e
        if "data" not in self._h5:
            self.close()
            raise DemoFormatError(f"{self.path}: missing group 'data'")
        self._data = self._h5["data"]
        self.libero = None  # LiberoTask of a LIBERO/OpenVLA dataset file; None for heisd's own files
        if not _heisd_layout(self._data):
            from heisd.data.libero_files import identify

            try:
                self.libero = identify(self.path, self.attrs)
            except BaseException:
                self.close()
                raise
        names = sorted((k for k in self._data.keys() if k.startswith("demo_")), key=lambda k: int(k[5:]))
        self._names = []
        try:
            for name in names:
                self._validate(name)
                problem = self._invalid_data(name)
                if problem is None:
                    self._names.append(name)
                elif skip_invalid:
                    self.skipped[name] = problem
                else:
                    raise DemoFormatError(f"{self.path}: data/{name} {problem} (fix the file; {SKIP_FLAG} "
                                          "leaves such episodes out of training and datastores)")
        except DemoFormatError:
            self.close()
            raise

    def _validate(self, name: str) -> None:
        group = self._data[name]
        for key in REQUIRED_DATASETS:
            if key not in group:
                raise DemoFormatError(f"{self.path}: data/{name} is missing '{key}'")
        for key in ("task", "instruction") if self.libero is None else ():
            if key not in group.attrs:
                raise DemoFormatError(f"{self.path}: data/{name} is missing attribute '{key}'")
        t = group["actions"].shape[0]
        for key in REQUIRED_DATASETS[1:]:
            if group[key].shape[0] != t:
                raise DemoFormatError(
                    f"{self.path}: data/{name}/{key} has {group[key].shape[0]} steps, actions has {t}"
                )
        images = group["obs/agentview_rgb"]
        self._check_frames(name, "obs/agentview_rgb", images)
        if self.wrist:
            if WRIST_DATASET not in group:
                raise DemoFormatError(f"{self.path}: data/{name} has no wrist frames ({WRIST_DATASET}), and the "
                                      "target reads the wrist camera too: record with `heisd demos --wrist`")
            wrist = group[WRIST_DATASET]
            self._check_frames(name, WRIST_DATASET, wrist)
            if wrist.shape != images.shape:
                raise DemoFormatError(f"{self.path}: data/{name}/{WRIST_DATASET} has shape {wrist.shape}, "
                                      f"obs/agentview_rgb {images.shape}: the cameras differ in frames or size")

    def _check_frames(self, name: str, key: str, images) -> None:
        if images.ndim != 4 or images.shape[-1] != 3 or min(images.shape[1:3]) < 1:
            raise DemoFormatError(f"{self.path}: data/{name}/{key} has shape {images.shape}, not (T, H, W, 3) RGB")
        if images.dtype != np.uint8:
            raise DemoFormatError(f"{self.path}: data/{name}/{key} is {images.dtype}; heisd reads "
                                  "uint8 RGB in 0..255 (a float image in [0, 1] would read as black): "
                                  "store (x * 255).round().astype(uint8)")

    def _invalid_data(self, name: str) -> str | None:
        """Why an episode's data is unusable (no steps, non-finite values), or None."""
        group = self._data[name]
        if group["actions"].shape[0] == 0:
            return "has 0 steps"
        for key in NUMERIC_DATASETS:
            if key in group:
                values = np.asarray(group[key][()], dtype=np.float64)
                if not np.isfinite(values).all():
                    bad = np.argwhere(~np.isfinite(values))[0]
                    return f"has non-finite {key} (first at step {bad[0]}: {values[tuple(bad)]})"
        return None

    @property
    def attrs(self) -> dict:
        out = {k: (v.decode() if isinstance(v, bytes) else v) for k, v in self._data.attrs.items()}
        if "env_args" in out:
            out["env_args"] = json.loads(out["env_args"])
        return out

    @property
    def benchmark(self) -> str | None:
        """The benchmark the file's episodes come from (the LIBERO suite for LIBERO files)."""
        return self.libero.suite if self.libero is not None else self.attrs.get("benchmark")

    def check_benchmark(self, benchmark: str | None) -> None:
        """Refuse a file recorded in another benchmark (or LIBERO suite) than `benchmark` (None: any)."""
        found = self.benchmark
        if benchmark is not None and found is not None and found != benchmark:
            what = f"LIBERO suite {found!r} (task {self.libero.task})" if self.libero else f"benchmark {found!r}"
            raise DemoFormatError(f"{self.path}: demonstrations of {what}, not --benchmark {benchmark!r}")

    def episode_names(self) -> list[str]:
        return list(self._names)

    def __len__(self) -> int:
        return len(self._names)

    def summary(self, name: str) -> tuple[np.ndarray, bool]:
        """(actions, success) of one episode, without reading its frames."""
        g = self._group(name)
        return np.asarray(g["actions"][()], dtype=np.float32), bool(g.attrs.get("success", True))

    def task_of(self, name: str) -> str:
        """The task of one episode, without reading its frames."""
        return self.libero.task if self.libero else _attr(self._group(name), "task")

    def gripper_states(self, name: str) -> np.ndarray:
        """(T, G) finger positions of one episode, without reading its frames."""
        return _gripper_states(self._group(name))

    def ee_positions(self, name: str) -> np.ndarray:
        """(T, 3) end-effector positions of one episode, without reading its frames."""
        return np.asarray(self._group(name)["obs/ee_pos"][()], dtype=np.float32)

    def _group(self, name: str):
        if name not in self._names:
            raise DemoFormatError(f"{self.path}: no episode data/{name}")
        return self._data[name]

    def episode(self, name: str) -> Episode:
        g = self._group(name)
        try:
            images = self._frames(g, "obs/agentview_rgb")
            return Episode(
                name=name,
                task=self.task_of(name),
                instruction=self.libero.instruction if self.libero else _attr(g, "instruction"),
                actions=np.asarray(g["actions"][()], dtype=np.float32),
                images=images,
                ee_pos=np.asarray(g["obs/ee_pos"][()], dtype=np.float32),
                gripper=_gripper_states(g),
                success=bool(g.attrs.get("success", True)),
                goal_pos=np.asarray(g["obs/goal_pos"][()], dtype=np.float32) if "obs/goal_pos" in g else None,
                wrist_images=self._frames(g, WRIST_DATASET) if self.wrist else None,
            )
        except OSError as e:  # a chunk cut off by truncation
            raise DemoFormatError(f"{self.path}: data/{name} cannot be read ({e})") from e

    def _frames(self, g, key: str) -> np.ndarray:
        """One camera's frames, upright (LIBERO's and OpenVLA's files store them upside down)."""
        images = np.asarray(g[key][()], dtype=np.uint8)
        return np.ascontiguousarray(images[:, ::-1, ::-1]) if self.libero else images

    def __iter__(self) -> Iterator[Episode]:
        for name in self._names:
            yield self.episode(name)

    def close(self) -> None:
        self._h5.close()

    def __enter__(self) -> "DemoFile":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


ACTION_BOUNDS = ("quantile", "absmax")  # what `ActionStats.bounds` can put the action bins' ends at


@dataclass(frozen=True)
class ActionStats:
    """Per-dimension action statistics; q01/q99 normalize actions (OpenVLA convention)."""

    q01: np.ndarray
    q99: np.ndarray
    mean: np.ndarray
    std: np.ndarray
    min: np.ndarray
    max: np.ndarray

    def to_dict(self) -> dict:
        return {k: np.asarray(v).tolist() for k, v in asdict(self).items()}

    def bounds(self, kind: str) -> tuple[np.ndarray, np.ndarray]:
        """The action bins' low and high ends per dimension. `quantile`: q01 and q99 (OpenVLA's; an action
        outside is clipped to the end bin). `absmax`: -m and m, m the largest |action|, so every recorded
        action has its bin and a zero action decodes to zero (the middle one of an odd count of bins):
        a move a scripted expert makes in under 1% of the frames (LIBERO-10's pitch turns) is not cut to
        a tenth of itself (BENCHMARKS 18.28)."""
        if kind == "quantile":
            return self.q01, self.q99
        if kind == "absmax":
            m = np.maximum(np.abs(self.min), np.abs(self.max))
            return -m, m
        raise ValueError(f"action bounds are one of {ACTION_BOUNDS}, got {kind!r}")

    @classmethod
    def from_dict(cls, d: dict) -> "ActionStats":
        missing = [k for k in ("q01", "q99", "mean", "std", "min", "max") if k not in d]
        if missing:
            raise ValueError(f"action statistics are missing {missing}")
        return cls(**{k: np.asarray(d[k], dtype=np.float32) for k in cls.__dataclass_fields__})


def _gripper_states(g) -> np.ndarray:
    """An episode group's gripper states as (T, G), one row per action."""
    return np.asarray(g["obs/gripper_states"][()], dtype=np.float32).reshape(len(g["actions"]), -1)


def compute_action_stats(paths: Sequence[str | Path], skip_invalid: bool = False) -> ActionStats:
    chunks = []
    for path in paths:
        with DemoFile(path, skip_invalid) as f:
            for name in f.episode_names():
                chunks.append(f.summary(name)[0])
    if not chunks:
        raise DemoFormatError(f"no episodes in {[str(p) for p in paths]}")
    a = np.concatenate(chunks, axis=0)
    return ActionStats(
        q01=np.quantile(a, 0.01, axis=0).astype(np.float32),
        q99=np.quantile(a, 0.99, axis=0).astype(np.float32),
        mean=a.mean(0).astype(np.float32),
        std=a.std(0).astype(np.float32),
        min=a.min(0).astype(np.float32),
        max=a.max(0).astype(np.float32),
    )


def recorded_settings(paths: Sequence[str | Path]) -> list[dict]:
    """Per file, the settings heisd recorded it with (`data` attrs `env_args`: seed, camera, ...);
    {} for files that hold none (LIBERO's and OpenVLA's)."""
    out = []
    for path in paths:
        with DemoFile(path) as f:
            args = f.attrs.get("env_args")
        out.append(args if isinstance(args, dict) else {})
    return out
