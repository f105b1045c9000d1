"""Demonstrations for `mw` (one file, heisd's variant of the LIBERO/robomimic layout) and for
LIBERO-Object (one file per task in LIBERO's own layout: `heisd.runtime.libero_demos`); each episode is
recorded by `heisd.runtime.recording`.

Scripted experts (the default), with optional DART-style noise: the executed action is the
expert's plus Gaussian noise on xyz, but the recorded label is the clean expert action. The
demonstrations then cover the states a slightly-off policy visits, which is what closed-loop
behaviour cloning needs. Every episode starts from a layout drawn from its own seed (mw's layouts;
LIBERO's placement samplers), never from the init states LIBERO's evaluation uses.

Or the target's own closed-loop rollouts (`DemoConfig.policy` = a checkpoint directory, AR
decoding; ours, docs/design.md §2.2): every episode is kept, failed ones too, since a datastore drafts
the target's own tokens, which are right wherever the target goes. Their layouts must stay
disjoint from the evaluation layouts: seeds from EVAL_SEED_OFFSET on are refused.

Or DAgger data (`expert_labels`): the target acts, and every visited state is labelled with the
scripted expert's action there. Every episode is kept too: the labels are the expert's wherever
the target went, and the states a failing target visits are the ones it must learn to leave.
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict, replace
from pathlib import Path

from heisd import __version__
from heisd.executors import LocalExecutor
from heisd.runtime.episode_store import episode_store, jobs_of
from heisd.runtime.recording import DEMOS, KEEP_FAILED, VERSION_ATTR, DemoConfig, episode_work
from heisd.storage import atomic_file, check_output
from heisd.storage.hdf5 import HDF5Output


def generate_demos(cfg: DemoConfig, out: Path, progress: bool = True, overwrite: bool = False,
                   executor=None) -> dict:
    """Roll out `cfg.policy` and write the episodes to `out` (atomically): the successful ones of
    an expert, every one of the target's. An existing `out` needs `overwrite`, and is replaced
    only if heisd wrote it. LIBERO: `out` is a directory of per-task files in LIBERO's layout.
    `executor` (`heisd.executors`; default: this process): where the episodes are rolled out."""
    from tqdm import tqdm

    from heisd.benchmarks.registry import is_libero, resolve_tasks

    resolve_tasks(cfg.benchmark, cfg.tasks)  # each task checked
    if is_libero(cfg.benchmark):
        from heisd.runtime.libero_demos import generate_libero_demos

        return generate_libero_demos(cfg, out, progress, overwrite, executor)
    out = Path(out)
    check_output(out, DEMOS, overwrite)
    start = time.time()
    kept, dropped, steps = 0, {}, 0
    jobs = jobs_of(cfg)
    # a full disk stops the recording at the episode it hits and leaves no file (heisd.storage.hdf5), only
    # the finished episodes (episode_store); the bar is closed before an error reaches the command line,
    # which prints it as the last line
    with (episode_store(out, cfg, overwrite, progress) as store,
          tqdm(total=len(jobs), desc="demos", unit="ep", disable=not progress) as bar, atomic_file(out) as tmp,
          HDF5Output(tmp) as h5):
        data = h5.file.create_group("data")
        data.attrs["benchmark"] = "mw"
        data.attrs["source"] = cfg.source
        data.attrs["env_args"] = json.dumps(asdict(cfg))
        data.attrs["created"] = time.strftime("%Y-%m-%dT%H:%M:%S%z")
        data.attrs[VERSION_ATTR] = __version__
        # Episodes are independent jobs (each a pure function of its seed), written in job order,
        # so the file is identical for any number of workers, here or on Ray
        for ep in store.episodes(jobs, executor or LocalExecutor()):
            kept, steps = _write(data, ep, kept, steps, dropped, keep_failed=cfg.source in KEEP_FAILED)
            h5.check()
            bar.update(1)
        data.attrs["total"] = steps
    wall = time.time() - start
    return {"kept": kept, "dropped": dropped, "steps": steps, "seconds": wall, "steps_per_s": steps / wall}


def measure_expert(cfg: DemoConfig, progress: bool = True, executor=None) -> dict:
    """The expert's success per task on the layouts `cfg` would record (its seeds and noise), rolled
    out without rendering and without writing: {task: {"episodes", "successes", "mean_steps"}}."""
    from tqdm import tqdm

    from heisd.benchmarks.registry import resolve_tasks

    resolve_tasks(cfg.benchmark, cfg.tasks)
    cfg = replace(cfg, render=False, wrist=False)
    jobs = jobs_of(cfg)
    table = {t: {"episodes": 0, "successes": 0, "steps": 0} for t in cfg.tasks}
    results = (executor or LocalExecutor()).map(episode_work, jobs)
    for _, ep in tqdm(results, total=len(jobs), desc="expert", unit="ep", disable=not progress):
        row = table[ep["task"]]
        row["episodes"] += 1
        row["successes"] += int(ep["success"])
        row["steps"] += len(ep["actions"])
    return {t: {"episodes": r["episodes"], "successes": r["successes"], "mean_steps": r["steps"] / r["episodes"]}
            for t, r in table.items()}


def _write(data, ep: dict, kept: int, steps: int, dropped: dict, keep_failed: bool) -> tuple[int, int]:
    if not ep["success"] and not keep_failed:
        dropped[ep["task"]] = dropped.get(ep["task"], 0) + 1
        return kept, steps
    g = data.create_group(f"demo_{kept}")
    g.attrs.update(task=ep["task"], instruction=ep["instruction"], success=bool(ep["success"]),
                   num_samples=len(ep["actions"]))
    g.attrs["layout"] = ep["layout"]
    g.create_dataset("actions", data=ep["actions"])
    h, w = ep["images"].shape[1:3]
    g.create_dataset("obs/agentview_rgb", data=ep["images"], compression="lzf", chunks=(1, h, w, 3))
    g.create_dataset("obs/ee_pos", data=ep["ee_pos"])
    g.create_dataset("obs/gripper_states", data=ep["gripper"])
    g.create_dataset("obs/goal_pos", data=ep["goal_pos"])
    return kept + 1, steps + len(ep["actions"])
