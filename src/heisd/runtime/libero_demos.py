"""LIBERO demonstrations written in LIBERO's own dataset layout: one `<task>_demo.hdf5` per task
(as LIBERO's scripts/create_dataset.py), so LIBERO's and OpenVLA's tools read them as well as ours.

    data/                  attrs: problem_info (JSON), bddl_file_name, env_args (JSON),
                           macros_image_convention "opengl", num_demos, total, heisd_version, source
      demo_<i>/            attrs: num_samples, layout (the start state), success
        actions            (T, 7) float32, the expert's clean labels (DART noise is not in them)
        obs/agentview_rgb  (T, H, W, 3) uint8, upside down as rendered (readers rotate it 180 degrees)
        obs/eye_in_hand_rgb  the wrist camera's frames, stored alike (recorded with `DemoConfig.wrist`)
        obs/ee_pos         (T, 3), obs/gripper_states (T, 2)
        states             (T, S) float64 simulator states, rewards and dones (T,) uint8 (1 at a success)

An expert's successful episodes are kept; the target's rollouts and DAgger data keep every episode
(`heisd.runtime.demos`). The writer is all-or-nothing (the files appear together).
"""

from __future__ import annotations

import json
import time
from contextlib import ExitStack
from dataclasses import asdict
from pathlib import Path

import numpy as np

from heisd import __version__
from heisd.benchmarks.cameras import LIBERO_CAMERA, LIBERO_WRIST_CAMERA
from heisd.benchmarks.libero_protocol import rotate_180
from heisd.data.dataset import WRIST_DATASET
from heisd.data.libero_files import DEMO_SUFFIX
from heisd.executors import LocalExecutor
from heisd.runtime.episode_store import episode_store, jobs_of
from heisd.runtime.recording import DEMOS, KEEP_FAILED, VERSION_ATTR, DemoConfig
from heisd.storage import atomic_files, check_output
from heisd.storage.hdf5 import HDF5Output


def task_file(task: str) -> str:
    return f"{task}{DEMO_SUFFIX}.hdf5"


def generate_libero_demos(cfg: DemoConfig, out: Path, progress: bool = True, overwrite: bool = False,
                          executor=None) -> dict:
    """Roll out `cfg.policy` and write `out/<task>_demo.hdf5` for every task of `cfg`.
    Existing files there need `overwrite`, and are replaced only if heisd wrote them."""
    from tqdm import tqdm

    out = Path(out)
    names = [task_file(t) for t in cfg.tasks]
    for name in names:
        check_output(out / name, DEMOS, overwrite)
    start = time.time()
    kept, dropped, steps = {}, {}, {}  # per task: episodes kept and dropped, steps kept
    jobs = jobs_of(cfg)
    files: dict[str, HDF5Output] = {}
    # the files close (raising a refused write: heisd.storage.hdf5) before they are renamed into
    # place; the bar is closed before an error reaches the command line (its last line)
    with (episode_store(out, cfg, overwrite, progress) as store,
          tqdm(total=len(jobs), desc="demos", unit="ep", disable=not progress) as bar,
          atomic_files(out, names) as temps, ExitStack() as closing):
        for ep in store.episodes(jobs, executor or LocalExecutor()):  # in job order: one task's after another
            task = ep["task"]
            if task not in files:
                files[task] = closing.enter_context(HDF5Output(temps[task_file(task)]))
                _file_attrs(files[task].file.create_group("data"), ep, cfg)
            if ep["success"] or cfg.source in KEEP_FAILED:
                steps[task] = steps.get(task, 0) + _write_episode(files[task].file["data"], kept.get(task, 0), ep)
                kept[task] = kept.get(task, 0) + 1
            else:
                dropped[task] = dropped.get(task, 0) + 1
            files[task].check()  # a full disk stops the recording here
            bar.update(1)
        for task, h5 in files.items():
            h5.file["data"].attrs["num_demos"] = kept.get(task, 0)
            h5.file["data"].attrs["total"] = steps.get(task, 0)
    wall = time.time() - start
    total = sum(steps.values())
    return {"kept": sum(kept.values()), "dropped": dropped, "steps": total, "seconds": wall,
            "steps_per_s": total / wall, "files": [str(out / n) for n in names]}


def _file_attrs(data, ep: dict, cfg: DemoConfig) -> None:
    info = ep["problem_info"]
    data.attrs["problem_info"] = json.dumps(info)
    data.attrs["bddl_file_name"] = ep["bddl_file"]
    # "type" 1: robomimic's robosuite env type, as LIBERO writes it
    data.attrs["env_args"] = json.dumps({"type": 1, "env_name": info["problem_name"],
                                         "problem_name": info["problem_name"], "bddl_file": ep["bddl_file"],
                                         "env_kwargs": {"controller": "OSC_POSE",
                                                        "camera_names": [LIBERO_CAMERA] + [LIBERO_WRIST_CAMERA] * ("wrist_images" in ep),
                                                        "camera_heights": cfg.image_size,
                                                        "camera_widths": cfg.image_size},
                                         "heisd_demos": asdict(cfg)})
    data.attrs["macros_image_convention"] = "opengl"  # frames stored as rendered: upside down
    data.attrs["created"] = time.strftime("%Y-%m-%dT%H:%M:%S%z")
    data.attrs["source"] = cfg.source
    data.attrs[VERSION_ATTR] = __version__


def _write_episode(data, index: int, ep: dict) -> int:
    g = data.create_group(f"demo_{index}")
    n = len(ep["actions"])
    g.attrs["num_samples"] = n
    g.attrs["layout"] = ep["layout"]
    g.attrs["success"] = bool(ep["success"])  # heisd's reader defaults to True: LIBERO's files hold successes only
    g.create_dataset("actions", data=ep["actions"])
    for key, name in (("images", "obs/agentview_rgb"), ("wrist_images", WRIST_DATASET)):
        if key in ep:
            frames = np.stack([rotate_180(f) for f in ep[key]])
            h, w = frames.shape[1:3]
            g.create_dataset(name, data=frames, compression="lzf", chunks=(1, h, w, 3))
    g.create_dataset("obs/ee_pos", data=ep["ee_pos"])
    g.create_dataset("obs/gripper_states", data=ep["gripper"])
    g.create_dataset("states", data=ep["states"])
    done = np.zeros(n, dtype=np.uint8)
    done[-1] = int(ep["success"])  # a success ends its episode
    g.create_dataset("rewards", data=done)
    g.create_dataset("dones", data=done)
    return n
