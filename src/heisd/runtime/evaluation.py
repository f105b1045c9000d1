"""Closed-loop evaluation in the simulator: `episodes.jsonl` (one line per finished episode,
appended and fsynced) and `summary.json` (recomputed from all lines).

An interrupted run resumes: finished episodes are read back and skipped; `run.json` records
the settings, and a resume with different settings is refused instead of mixing results.
"""

from __future__ import annotations

import json
import os
import sys
from dataclasses import asdict, dataclass
from pathlib import Path

from heisd.runtime.metrics import episode_steps, summarize
from heisd.runtime.policy import VLAPolicy

EVAL_SEED_OFFSET = 10_000  # evaluation layouts come from seeds no demonstration command uses by default


@dataclass(frozen=True)
class EvalConfig:
    tasks: tuple[str, ...]  # mw task names
    episodes: int  # per task
    seed: int = 0  # layout seed of episode i of task t: episode_seed(EVAL_SEED_OFFSET + seed, t, i)
    max_steps: int = 300  # environment steps per episode
    execute: int = 0  # actions executed per inference (0 = the whole chunk)
    image_size: int = 128
    camera: str = "corner3"


def read_episodes(path: Path) -> list[dict]:
    """Finished episodes; a last line cut off by a crash is dropped (that episode reruns)."""
    if not path.exists():
        return []
    lines = path.read_text().splitlines()
    out = []
    for i, line in enumerate(lines):
        try:
            out.append(json.loads(line))
        except json.JSONDecodeError:
            if i != len(lines) - 1:
                raise ValueError(f"{path}:{i + 1}: corrupt episode line (not the last one; refusing to guess)")
            print(f"{path}: dropping a truncated last line; that episode reruns", file=sys.stderr)
            path.write_text("".join(line_ + "\n" for line_ in lines[:-1]))
    return out


def _check_run(out: Path, run: dict) -> None:
    run = json.loads(json.dumps(run))  # tuples -> lists, as read back
    path = out / "run.json"
    if path.exists():
        old = json.loads(path.read_text())
        if old != run:
            diff = {k: (old.get(k), run.get(k)) for k in set(old) | set(run) if old.get(k) != run.get(k)}
            raise ValueError(f"{out} holds a run with other settings {diff}; use another --out to start afresh")
    else:
        path.write_text(json.dumps(run, indent=2) + "\n")


class EvalRun:
    """One method's evaluation directory: what is done, what is pending, one episode at a time."""

    def __init__(self, label: str, cfg: EvalConfig, out: Path):
        self.label, self.cfg, self.out = label, cfg, out
        out.mkdir(parents=True, exist_ok=True)
        _check_run(out, {"method": label, "benchmark": "mw", **asdict(cfg)})
        self.done = read_episodes(out / "episodes.jsonl")

    def pending(self) -> list[tuple[str, int]]:
        finished = {(e["task"], e["episode"]) for e in self.done}
        return [(t, i) for t in self.cfg.tasks for i in range(self.cfg.episodes) if (t, i) not in finished]

    def run(self, policy: VLAPolicy, task: str, i: int) -> dict:
        from heisd.benchmarks.mw import MetaWorldEnv, MWConfig
        from heisd.data.demos import episode_seed

        cfg = self.cfg
        env = MetaWorldEnv(task, MWConfig(cfg.image_size, cfg.camera, cfg.max_steps))
        layout_seed = episode_seed(EVAL_SEED_OFFSET + cfg.seed, task, i)
        line = run_episode(env, policy, layout_seed, cfg.execute)
        line.update(task=task, episode=i, layout_seed=layout_seed)
        with open(self.out / "episodes.jsonl", "a") as log:
            log.write(json.dumps(line) + "\n")
            log.flush()
            os.fsync(log.fileno())
        self.done.append(line)
        return line

    @property
    def sr(self) -> float:
        return sum(e["success"] for e in self.done) / max(len(self.done), 1)

    def summary(self) -> dict:
        summary = summarize(self.label, "mw", self.done)
        (self.out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
        return summary


def evaluate(policy: VLAPolicy, method_label: str, cfg: EvalConfig, out: Path, progress: bool = True) -> dict:
    from tqdm import tqdm

    run = EvalRun(method_label, cfg, out)
    bar = tqdm(run.pending(), desc=f"eval {method_label}", unit="ep", disable=not progress)
    for task, i in bar:
        run.run(policy, task, i)
        bar.set_postfix(sr=f"{run.sr:.2f}")
    return run.summary()


def run_episode(env, policy: VLAPolicy, layout_seed: int, execute: int = 0) -> dict:
    obs, info = env.reset(options={"layout_seed": layout_seed})
    policy.reset(env.instruction, env.task)
    records, ee_path, success, truncated, env_steps = [], [], False, False, 0
    moved = [info["ee_pos"]]  # positions since the last inference: the kinematic window's steps
    while not (success or truncated):
        actions, record = policy.act(obs["image"], obs["state"], moved)
        records.append(record)
        ee_path.append([round(float(x), 5) for x in info["ee_pos"]])
        moved, todo = [], actions[: execute or len(actions)]
        for j, action in enumerate(todo):
            # only the frame after the chunk is read: mid-chunk steps skip rendering
            obs, _, success, truncated, info = env.step(action, render=j == len(todo) - 1)
            moved.append(info["ee_pos"])
            env_steps += 1
            if success or truncated:
                break
    policy.end_episode(success)
    steps = episode_steps(records)
    steps["ee_pos"] = ee_path  # where each control step started: the plots color it by mode
    return {"success": bool(success), "env_steps": env_steps, "layout": [round(float(x), 6) for x in env.layout],
            "steps": steps}
