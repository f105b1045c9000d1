"""Finished episodes of a recording, kept beside its output (`OUT.partial/`) until the output is
written, so that a killed `heisd demos` (or a DAgger round's rollouts) run again with the same
settings records only the episodes it had not finished. An episode is a pure function of its task,
index and settings (`heisd.runtime.recording`), so a resumed recording writes the same files as an
uninterrupted one. The task list and episode count may change between runs: an episode's data does
not depend on them. A recording that fails or is killed before any episode finished, or that the
disk refused, leaves nothing.
"""

from __future__ import annotations

import json
import os
import pickle
import shutil
import sys
import zlib
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import asdict
from pathlib import Path

from heisd.errors import OutputError, WriteError
from heisd.runtime.recording import DemoConfig, episode_work, ran_settings
from heisd.storage import write_json
from heisd.storage.failures import os_error

SUFFIX = ".partial"
SETTINGS_FILE = "recording.json"
EPISODE_SUFFIX = ".pkl.z"  # a zlib-compressed pickle of the episode's dict
PER_EPISODE = ("tasks", "episodes")  # settings an episode's data does not depend on


def jobs_of(cfg: DemoConfig) -> list[tuple[str, int, DemoConfig]]:
    """A recording's jobs for `episode_work`, in the order its files hold them."""
    return [(t, i, cfg) for t in cfg.tasks for i in range(cfg.episodes)]


def partial_path(out: Path) -> Path:
    return out.parent / (out.name + SUFFIX)


@contextmanager
def episode_store(out: Path, cfg: DemoConfig, overwrite: bool = False,
                  progress: bool = True) -> Iterator[EpisodeStore]:
    """The store of `out`'s recording for the block that writes `out`: removed once the block has
    written it. Kept when the block is killed or fails, if it holds a finished episode; else, or when
    the system refused a write (a full disk: the store would only hold on to the space), removed with
    the folders it made. `progress`: say how many episodes are read back."""
    made = [p for p in (partial_path(Path(out)), *Path(out).parents) if not p.exists()]
    store, jobs = EpisodeStore(out, cfg, overwrite), jobs_of(cfg)
    done = store.finished(jobs)
    if done and progress:
        print(f"resuming: {done} of {len(jobs)} episodes were recorded before ({store.dir})", file=sys.stderr)
    try:
        yield store
    except BaseException as e:
        if isinstance(e, WriteError) or os_error(e) is not None or not store.finished_any():
            shutil.rmtree(store.dir, ignore_errors=True)
            for folder in made[1:]:  # innermost first; one the block filled stays
                if folder.is_dir() and not any(folder.iterdir()):
                    folder.rmdir()
        raise
    store.remove()


class EpisodeStore:
    """`OUT.partial/`: `recording.json` (the settings) and one compressed pickle per finished episode.
    Kept episodes of other settings are refused, or with `overwrite` thrown away; of the same settings
    they are used even with `overwrite` (they are the episodes the recording would make)."""

    def __init__(self, out: Path, cfg: DemoConfig, overwrite: bool = False):
        self.dir = partial_path(Path(out))
        settings = {k: v for k, v in json.loads(json.dumps(asdict(cfg))).items() if k not in PER_EPISODE}
        saved = self.dir / SETTINGS_FILE
        if self.dir.exists():
            try:
                before = json.loads(saved.read_text())
                if not isinstance(before, dict):
                    raise ValueError("not a JSON object")
                before = ran_settings(before)
            except (OSError, ValueError) as e:  # not ours to remove, even with --overwrite
                raise OutputError(f"{self.dir} is not a recording's finished episodes ({saved.name}: {e}); "
                                  "move it away to record here") from e
            if before != settings:
                if not overwrite:
                    changed = ", ".join(sorted(k for k in settings if before.get(k) != settings[k]))
                    raise OutputError(f"{self.dir} holds the finished episodes of a recording with other settings "
                                      f"({changed}): rerun with them to resume it, or pass --overwrite to start over")
                shutil.rmtree(self.dir)
        self.dir.mkdir(parents=True, exist_ok=True)
        if not saved.is_file():
            write_json(saved, settings)

    def finished(self, jobs: Iterable[tuple]) -> int:
        return sum(self._file(job).is_file() for job in jobs)

    def finished_any(self) -> bool:
        return any(self.dir.glob(f"*{EPISODE_SUFFIX}"))

    def episodes(self, jobs: list[tuple], executor) -> Iterator[dict]:
        """Every job's episode in job order: read back when finished before, else recorded (on
        `executor`) and kept here as soon as it arrives."""
        done = {job[:2] for job in jobs if self._file(job).is_file()}
        fresh = executor.map(episode_work, [job for job in jobs if job[:2] not in done], ordered=True)
        try:
            for job in jobs:
                if job[:2] in done:
                    yield self._load(job)
                else:
                    _, ep = next(fresh)
                    self._save(job, ep)
                    yield ep
        finally:
            fresh.close()  # an error or interrupt stops the workers now

    def remove(self) -> None:
        """The output is written: the kept episodes are no longer needed."""
        shutil.rmtree(self.dir, ignore_errors=True)

    def _file(self, job: tuple) -> Path:
        task, index = job[:2]
        return self.dir / f"{task}.{index}{EPISODE_SUFFIX}"

    def _save(self, job: tuple, ep: dict) -> None:
        path = self._file(job)
        tmp = path.with_name(path.name + ".tmp")
        try:
            tmp.write_bytes(zlib.compress(pickle.dumps(ep, protocol=pickle.HIGHEST_PROTOCOL), 1))
            os.replace(tmp, path)  # a kill mid-write leaves no episode file
        finally:
            tmp.unlink(missing_ok=True)

    def _load(self, job: tuple) -> dict:
        path = self._file(job)
        try:
            return pickle.loads(zlib.decompress(path.read_bytes()))
        except (OSError, zlib.error, pickle.UnpicklingError, EOFError) as e:
            raise OutputError(f"{path}: a finished episode cannot be read back ({e}); remove the file to record "
                              "that episode again") from e

