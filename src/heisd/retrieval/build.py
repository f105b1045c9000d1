"""Building the datastore from demonstrations with the target (docs/design.md §2.2).

One entry per demonstration frame: key = the target's retrieval key (`Target.retrieval_key`:
for the small VLA its pooled vision feature beside the normalized state, for OpenVLA its
pooled projected patches); payload = the demonstrator's action tokens of this step and the next
`n_sequences - 1` steps (frames),
the target's own greedy tokens and its lm_head-input hidden state at the first action
position (batched greedy decoding: exactly what the decode loop's prefill and AR steps
compute), the end-effector position, episode / step / task. The manifest's extras carry the
kinematic statistics F is normalized with and the action layout.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import torch
from tqdm import tqdm

from heisd.data.dataset import DemoFile, DemoFormatError
from heisd.data.views import target_frames
from heisd.errors import InputError
from heisd.executors import LocalExecutor
from heisd.kinematics import KinematicConfig, KinematicStats, fit_delta_scale
from heisd.retrieval.datastore import Datastore, DatastoreWriter
from heisd.retrieval.index_config import IndexConfig
from heisd.retrieval.manifest import DATASTORE, read_manifest, sha256_file
from heisd.storage import check_output, recorded_path
from heisd.targets.base import Target
from heisd.targets.rollout import rollout_frames
from heisd.targets.vla.frames import chunk_targets

KINEMATIC_STATS_KEY = "kinematic_stats"  # extras: KinematicStats.to_dict() over the demonstrations
DELTA_SCALE_KEY = "delta_scale"  # extras: metres per unit action (`fit_delta_scale`), for clients sending no position
LAYOUT_KEY = "action_layout"  # extras: action_dim, chunk, vocab_size, n_bins of the target
BUILD_KEY = "build"  # extras: the build summary, with the identity of every demonstration file read


@dataclass(frozen=True)
class BuildConfig:
    batch_size: int = 64  # frames per target pass
    n_sequences: int = 4  # demonstrator tokens of this step and the next 3 (paper)
    index: IndexConfig = IndexConfig()  # FAISS index per collection: flat, HNSW or IVF-PQ by size


@dataclass
class EncodedFrames:
    keys: np.ndarray  # float32 [B, Dk] retrieval keys (`Target.retrieval_key`; the datastore normalizes them)
    own_tokens: np.ndarray  # int64 [B, n] the target's greedy action tokens
    hidden: np.ndarray  # float32 [B, Dh] lm_head input at the first action position


def encode_frames(target: Target, images: np.ndarray, instruction: str, states: np.ndarray) -> EncodedFrames:
    """Run the target on B frames of one instruction: key, greedy tokens, prefill hidden state."""
    out = rollout_frames(target, images, instruction, states)
    return EncodedFrames(
        keys=out.keys.numpy(), own_tokens=out.features.tokens.numpy(), hidden=out.features.hidden[:, 0].numpy()
    )


@torch.no_grad()
def key_dim(target: Target) -> int:
    """Width of the retrieval key (asked of the model rather than re-derived from its pooling)."""
    spec = target.spec
    frame = torch.zeros(1, *spec.frame_shape, dtype=torch.uint8)
    state = spec.state_input(np.zeros((1, spec.state_dim)))
    return int(target.retrieval_key(frame, state, target.encode_prompt("")).shape[1])


def demo_tokens(target: Target, actions: np.ndarray, n_sequences: int) -> np.ndarray:
    """int64 [T, n_sequences, n]: row t holds the tokenized chunks of steps t..t+n_sequences-1,
    each chunk = actions (s, s+1, ...) as the model predicts them; past the episode end the
    last action repeats (the robot holds its last command)."""
    t = len(actions)
    ids = target.action_tokenizer.encode(chunk_targets(actions, target.spec.chunk)).reshape(t, -1)
    steps = np.minimum(np.arange(t)[:, None] + np.arange(n_sequences)[None, :], t - 1)
    return ids[steps]


def build_datastore(
    target: Target,
    demos: Sequence[str | Path],
    out_dir: str | Path,
    config: BuildConfig | None = None,
    overwrite: bool = False,
    skip_invalid: bool = False,
    benchmark: str | None = None,
    executor: Any = None,
    make_target: Callable[[], Target] | None = None,
) -> dict[str, Any]:
    """Encode every frame of every successful episode and write the datastore; returns a summary.
    Failed expert demonstrations are left out: their actions would be drafted as if they were
    right. The target's own rollouts (`heisd demos --policy DIR`) are kept whole, failures too:
    the drafts are the target's own tokens, right for the target wherever it went (ours). The
    kinematic statistics come from the expert's episodes only (the metric's reference motion).
    `benchmark`: every file must come from it (a LIBERO file: from that suite); None accepts any.
    `skip_invalid`: episodes with unusable data are left out (counted) instead of refused.
    `executor` (`heisd.executors`; default: this process): where episodes are encoded, a remote one
    by targets `make_target` loads (a picklable function); the datastore is written here, once."""
    config = config or BuildConfig()
    check_output(Path(out_dir), DATASTORE, overwrite)  # before the expensive part; finalize checks again
    spec = target.spec
    writer = DatastoreWriter(
        key_dim=key_dim(target),
        hidden_dim=spec.hidden_size,
        n_tokens=spec.n_action_tokens,
        n_sequences=config.n_sequences,
        target_fingerprint=target.fingerprint(),
        index_config=config.index,
    )
    trajectories, episodes, dropped, start = [], 0, 0, time.perf_counter()
    executed: list[np.ndarray] = []  # the expert's actions beside each trajectory
    # per file: who acted and its entries' episode ids [first, end): an entry's source is its episode's
    sources: list[dict[str, Any]] = []
    jobs, invalid = [], 0
    for path in demos:  # every file checked before any encoding
        with DemoFile(path, skip_invalid) as f:
            f.check_benchmark(benchmark)  # a file of another suite is refused up front
            source = f.attrs.get("source", "expert")
            if source == "dagger":  # expert labels on the target's states: neither kind of entry
                raise DemoFormatError(
                    f"{path}: a DAgger file (the target acted, the expert labelled) is "
                    "training data for train-vla, not datastore entries"
                )
            sources.append({"path": recorded_path(path), "source": source, "episodes": [0, 0], "frames": 0})
            jobs += [(len(sources) - 1, str(path), name, source == "target") for name in f.episode_names()]
            invalid += len(f.skipped)
    here, started = EpisodeEncoder(target, config, skip_invalid), 0  # files before `started` have their first id
    setup = None if make_target is None else partial(_remote_encoder, make_target, config, skip_invalid)
    with tqdm(total=len(jobs), unit="episode", desc="build-datastore") as bar, here:
        # in job order: the entries, their ids and the statistics are the same wherever episodes were encoded
        for (file, path, name, _), ep in (executor or LocalExecutor()).map(
            encode_episode, jobs, setup=setup, here=here, ordered=True
        ):
            bar.update(1)
            for tally in sources[started : file + 1]:  # a file's ids start where the files before it ended
                tally["episodes"] = [episodes, episodes]
            started, tally = max(started, file + 1), sources[file]
            if ep is None:  # a failed expert episode: its actions would be drafted as if they were right
                dropped += 1
                continue
            if ep["actions"].shape[1] != spec.action_dim:
                raise DemoFormatError(
                    f"{path}: data/{name}/actions has {ep['actions'].shape[1]} dims, "
                    f"the target's actions have {spec.action_dim}"
                )
            n = len(ep["actions"])
            for lo in range(0, n, config.batch_size):  # one add per target pass, as encoded
                hi = min(lo + config.batch_size, n)
                writer.add(
                    keys=ep["keys"][lo:hi],
                    tokens=ep["demo"][lo:hi],
                    own_tokens=ep["own_tokens"][lo:hi],
                    hidden=ep["hidden"][lo:hi],
                    ee_pos=ep["ee_pos"][lo:hi],
                    episode=episodes,
                    step=np.arange(lo, hi),
                    task=ep["task"],
                )
            if tally["source"] != "target":
                trajectories.append(ep["ee_pos"])
                executed.append(ep["actions"])
            episodes += 1
            tally["episodes"][1], tally["frames"] = episodes, tally["frames"] + n
            bar.set_postfix(frames=len(writer))
    for tally in sources[started:]:  # files left without an episode
        tally["episodes"] = [episodes, episodes]
    if not episodes:
        raise DemoFormatError(f"no successful episodes in {[str(p) for p in demos]}")
    seconds = time.perf_counter() - start
    kinematic = KinematicConfig()
    if not trajectories:
        raise DemoFormatError("the kinematic statistics need expert demonstrations beside the target's rollouts")
    summary = {
        "demos": [recorded_path(p) for p in demos],
        "demo_files": [demo_identity(p) for p in demos],
        "episodes": episodes,
        "dropped_failed": dropped,
        "dropped_invalid": invalid,
        "sources": sources,
        "frames": len(writer),
        "seconds": round(seconds, 2),
        "frames_per_s": round(len(writer) / seconds, 1),
        "threads": torch.get_num_threads(),
        **asdict(config),
    }
    extras = {
        KINEMATIC_STATS_KEY: KinematicStats.fit(trajectories, kinematic).to_dict(),
        DELTA_SCALE_KEY: fit_delta_scale(trajectories, executed),
        "kinematic_config": asdict(kinematic),
        LAYOUT_KEY: {
            "action_dim": spec.action_dim,
            "chunk": spec.chunk,
            "vocab_size": spec.vocab_size,
            "n_bins": spec.n_bins,
        },
        BUILD_KEY: summary,
    }
    writer.finalize(out_dir, extras=extras, overwrite=overwrite)
    return summary


class EpisodeEncoder:
    """What encodes demonstration episodes: the target, and the files it has opened (each opened,
    and validated, once)."""

    def __init__(self, target: Target, config: BuildConfig, skip_invalid: bool):
        self.target, self.config, self.skip_invalid = target, config, skip_invalid
        self.files: dict[str, DemoFile] = {}

    def file(self, path: str) -> DemoFile:
        if path not in self.files:
            self.files[path] = DemoFile(path, self.skip_invalid, self.target.spec.views)
        return self.files[path]

    def __enter__(self) -> EpisodeEncoder:
        return self

    def __exit__(self, *exc: Any) -> None:
        for f in self.files.values():
            f.close()
        self.files.clear()


def _remote_encoder(make_target: Callable[[], Target], config: BuildConfig, skip_invalid: bool) -> EpisodeEncoder:
    return EpisodeEncoder(make_target(), config, skip_invalid)


def encode_episode(encoder: EpisodeEncoder, job: tuple[int, str, str, bool]) -> dict[str, Any] | None:
    """One episode's entries, encoded in target passes of `batch_size` frames; None for a failed
    episode that is not kept (`keep_failed`: the target's own rollouts are)."""
    _, path, name, keep_failed = job
    ep = encoder.file(path).episode(name)
    if not ep.success and not keep_failed:
        return None
    target, batch = encoder.target, encoder.config.batch_size
    if ep.actions.shape[1] != target.spec.action_dim:  # the driver names the file
        return {"actions": ep.actions}
    parts = [
        encode_frames(
            target,
            target_frames(target.spec, ep, slice(lo, lo + batch)),
            ep.instruction,
            ep.state[lo : lo + batch],
        )
        for lo in range(0, len(ep), batch)
    ]
    return {
        "task": ep.task,
        "actions": ep.actions,
        "ee_pos": ep.ee_pos,
        "demo": demo_tokens(target, ep.actions, encoder.config.n_sequences),
        "keys": np.concatenate([p.keys for p in parts]),
        "own_tokens": np.concatenate([p.own_tokens for p in parts]),
        "hidden": np.concatenate([p.hidden for p in parts]),
    }


def demo_identity(path: str | Path) -> dict[str, Any]:
    """A demonstration file by content (a copy under another name is the same file)."""
    path = Path(path)
    return {"path": recorded_path(path), "sha256": sha256_file(path), "bytes": path.stat().st_size}


def check_held_out(root: str | Path, demos: Sequence[str | Path]) -> None:
    """Refuse held-out demonstrations the datastore was built from: every frame would find
    itself (theta 1.0, skip rate 1.0), a meaningless calibration."""
    built = read_manifest(Path(root))["extras"].get(BUILD_KEY, {})
    by_sha = {f["sha256"]: f["path"] for f in built.get("demo_files", [])}
    by_path = {str(Path(p).resolve()): p for p in built.get("demos", [])}  # manifests older than demo_files
    for path in demos:
        same = by_sha.get(sha256_file(Path(path))) if by_sha else by_path.get(str(Path(path).resolve()))
        if same is not None:
            raise InputError(
                f"--demos {path}: {root} was built from this file ({same}); calibrate on "
                "held-out demonstrations (e.g. heisd demos --seed 2)"
            )


def open_datastore(path: str | Path, target: Target, **kwargs: Any) -> Datastore:
    """Load a datastore for `target`; a datastore built for another target is refused (its
    own tokens and hidden states would describe a different model)."""
    return Datastore.load(path, expected_fingerprint=target.fingerprint(), expected_key_dim=key_dim(target), **kwargs)
