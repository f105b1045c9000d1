"""Closed-loop evaluation in the simulator: `episodes.jsonl` (one line per finished episode,
appended and fsynced) and `summary.json` (recomputed from all lines).

An interrupted run resumes: finished episodes are read back and skipped; `run.json` records
the settings and the resources' fingerprints (`heisd.runtime.runinfo`), and a resume with
anything different is refused instead of mixing results. A lock keeps a second process out
of the folder while one runs. MuJoCo's warnings go to `mujoco.log` in the folder.
"""

from __future__ import annotations

import json
import logging
from contextlib import ExitStack
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from functools import partial
from pathlib import Path

from heisd.benchmarks.cameras import DEFAULT_CAMERA
from heisd.benchmarks.registry import is_libero
from heisd.data.views import observed_frame
from heisd.errors import ConfigError, InputError
from heisd.runtime import run_thresholds
from heisd.runtime.metrics import episode_steps, summarize
from heisd.runtime.policy import VLAPolicy
from heisd.runtime.recording import EVAL_SEED_OFFSET
from heisd.runtime.runinfo import EVAL_RUN, check_run
from heisd.storage import append_text, directory_lock, refuse_foreign, strict_json, write_json, write_text

log = logging.getLogger(__name__)

EPISODES_FILE = "episodes.jsonl"
SUMMARY_FILE = "summary.json"
MUJOCO_LOG = "mujoco.log"
WARNINGS_KEY = "mujoco_warnings"  # a remote worker's MuJoCo warnings, carried in its line to the driver


@dataclass(frozen=True)
class EvalConfig:
    tasks: tuple[str, ...]  # task names of the benchmark
    episodes: int  # per task
    seed: int = 0  # layout seed of episode i of task t: episode_seed(EVAL_SEED_OFFSET + seed, t, i)
    max_steps: int = 300  # steps per episode (LIBERO: policy steps after the wait steps; registry.default_max_steps)
    execute: int = 0  # actions executed per inference (0 = the whole chunk)
    image_size: int = 128  # camera frame, pixels
    camera: str = DEFAULT_CAMERA  # Meta-World camera (LIBERO renders its own: not recorded there)
    benchmark: str = "mw"  # mw or a LIBERO suite (heisd.benchmarks.registry)
    protocol: str = "raw"  # the target's frame/action convention (TargetSpec.protocol; "openvla" on LIBERO)
    center_crop: bool = True  # openvla protocol: OpenVLA's 0.9-area center crop (run_libero_eval.py's default)
    # LIBERO: episodes start from layouts LIBERO's samplers draw from their layout seeds, not from the suite's
    # init states: closed-loop calibration on layouts the evaluation never uses (mw layouts are always drawn)
    sampled_layouts: bool = False

    def __post_init__(self) -> None:
        if self.sampled_layouts and self.benchmark == "mw":
            raise ConfigError("sampled layouts are for LIBERO (mw episodes always start from drawn layouts)")
        for name, least in (("episodes", 1), ("max_steps", 1), ("execute", 0), ("seed", 0), ("image_size", 1)):
            if getattr(self, name) < least:
                raise ConfigError(f"EvalConfig.{name} must be >= {least}, got {getattr(self, name)}")

    def settings(self) -> dict:
        """What run.json records and a resume must match (the crop only where a protocol applies it, the
        camera only on mw)."""
        settings = asdict(self)
        if is_libero(self.benchmark):
            del settings["camera"]
        if self.protocol != "openvla":
            del settings["center_crop"]
        if not self.sampled_layouts:  # runs recorded before the option existed resume as they were
            del settings["sampled_layouts"]
        return settings

    def jobs(self) -> list[tuple[str, int]]:
        """Every (task, episode) of the run, episode by episode across the tasks: a run stopped
        part way keeps the same episodes of every task, a subset whose success rate still speaks
        for the suite (each episode's layout comes from its seed, so the order changes no episode)."""
        return [(t, i) for i in range(self.episodes) for t in self.tasks]


def ran_eval_settings(saved: dict) -> dict:
    """A saved run.json as its episodes ran: LIBERO runs saved before the camera was left out say mw's,
    which they never rendered."""
    return {k: v for k, v in saved.items() if k != "camera"} if is_libero(saved.get("benchmark", "mw")) else saved


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
                raise InputError(f"{path}:{i + 1}: corrupt episode line (not the last one; refusing to guess)")
            log.warning("%s: dropping a truncated last line; that episode reruns", path)
            write_text(path, "".join(line_ + "\n" for line_ in lines[:-1]))
    return out


class EvalRun:
    """One method's evaluation directory: what is done, what is pending, one episode at a time.

    Holds the folder's lock from construction to `close()` (use it as a context manager).
    `identity`: the resources and method config (`runinfo.run_identity`) for run.json.
    """

    def __init__(self, label: str, cfg: EvalConfig, out: Path, identity: dict | None = None):
        self.label, self.cfg, self.out = label, cfg, Path(out)
        refuse_foreign(self.out, EVAL_RUN)
        self._held = ExitStack()
        self._held.enter_context(directory_lock(self.out))
        try:
            check_run(self.out, {"method": label, **cfg.settings(), **(identity or {})}, ran_eval_settings)
            self.done = read_episodes(self.out / EPISODES_FILE)
        except BaseException:
            self.close()
            raise

    def close(self) -> None:
        self._held.close()

    def __enter__(self) -> "EvalRun":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def attach(self, policy: VLAPolicy) -> None:
        """Continue the policy's online skip thresholds from this run's last finished episode."""
        run_thresholds.start(self.out, policy.skip_thresholds(), self.done)

    def persist_thresholds(self, policy: VLAPolicy) -> dict:
        """`--persist-thresholds`: merge the finished run's thresholds into the datastore manifest."""
        return run_thresholds.persist(self.out, policy.skip_thresholds(), policy.decoders.retrieval.datastore)

    def pending(self) -> list[tuple[str, int]]:
        finished = {(e["task"], e["episode"]) for e in self.done}
        return [job for job in self.cfg.jobs() if job not in finished]

    def record(self, line: dict) -> dict:
        """Append a finished episode's line (from any worker) to episodes.jsonl; MuJoCo warnings a
        remote worker brought back go to the run's mujoco.log."""
        warnings = line.pop(WARNINGS_KEY, "")
        if warnings:
            append_text(self.out / MUJOCO_LOG, warnings)
        append_text(self.out / EPISODES_FILE, strict_json(line) + "\n", sync=True)
        self.done.append(line)
        return line

    @property
    def sr(self) -> float:
        return sum(e["success"] for e in self.done) / max(len(self.done), 1)

    def summary(self) -> dict:
        summary = summarize(self.label, self.cfg.benchmark, self.done)
        if run_thresholds.LINE_KEY in self.done[-1]:  # where online adaptation left the skips
            summary[run_thresholds.LINE_KEY] = self.done[-1][run_thresholds.LINE_KEY]
        write_json(self.out / SUMMARY_FILE, summary)
        return summary


@dataclass
class EpisodeWorker:
    """What runs episodes: one policy per method (bench: each configuration; eval: one) and the
    settings. `logs`: per policy, its run's mujoco.log where the worker shares the run's folders;
    None on a Ray worker, whose lines bring MuJoCo's warnings back to the driver."""

    policies: list[VLAPolicy]
    cfg: EvalConfig
    out: str  # the run folder, named in errors
    logs: list[Path] | None = None


def episode_worker(make_policies: Callable[[], list[VLAPolicy]], cfg: EvalConfig, out: str,
                   thresholds: list[dict]) -> EpisodeWorker:
    """A Ray worker's state: its own policies, their skip thresholds continued from where the run
    stands (`thresholds`, per policy); from then on they adapt over this worker's episodes."""
    policies = make_policies()
    for policy, state in zip(policies, thresholds, strict=True):
        for skip in policy.skip_thresholds():
            if skip.extras_key in state:
                skip.restore(state[skip.extras_key])
    return EpisodeWorker(policies, cfg, out)


def play(worker: EpisodeWorker, job: tuple[str, int, Sequence[int]]) -> list[tuple[int, dict]]:
    """Episode i of task `task` with each policy k of `ks` in turn: [(k, episode line)]."""
    task, i, ks = job
    return [(k, play_episode(worker, k, task, i)) for k in ks]


def play_episode(worker: EpisodeWorker, k: int, task: str, i: int) -> dict:
    """One evaluation episode of policy k: its line (what episodes.jsonl keeps)."""
    import tempfile

    from heisd.benchmarks.mujoco_log import mujoco_log
    from heisd.benchmarks.registry import make_env, reset_options
    from heisd.executors import worker_name
    from heisd.runtime.recording import episode_seed

    cfg, policy = worker.cfg, worker.policies[k]
    layout_seed = episode_seed(EVAL_SEED_OFFSET + cfg.seed, task, i)
    with ExitStack() as stack:
        log_path = None if worker.logs is None else worker.logs[k]
        if log_path is None:  # a Ray worker: the warnings travel back in the line
            log_path = Path(stack.enter_context(tempfile.TemporaryDirectory())) / MUJOCO_LOG
        with mujoco_log(log_path, f"{task} episode {i}"):
            env = make_env(cfg.benchmark, task, cfg.image_size, cfg.camera, cfg.max_steps, cfg.protocol,
                           cfg.center_crop, wrist=policy.views == 2)
            try:
                options = reset_options(cfg.benchmark, layout_seed, i, cfg.sampled_layouts)
                line = run_episode(env, policy, options, cfg.execute)
            except InputError as err:
                raise InputError(f"{worker.out}: {task} episode {i}: {err}") from err
        line.update(task=task, episode=i, layout_seed=layout_seed)
        skips = policy.skip_thresholds()
        if skips:
            line[run_thresholds.LINE_KEY] = run_thresholds.snapshot(skips)
        if worker.logs is None:
            line["worker"] = worker_name()
            if log_path.exists():
                line[WARNINGS_KEY] = log_path.read_text()
    return line


def evaluate(policy: VLAPolicy, method_label: str, cfg: EvalConfig, out: Path, progress: bool = True,
             identity: dict | None = None, persist_thresholds: bool = False, executor=None,
             make_policy: Callable[[], VLAPolicy] | None = None) -> dict:
    """Run the pending episodes into `out` and summarize. `persist_thresholds`: once all episodes
    are done, merge the online skip thresholds into the datastore manifest (else it is not written).
    `executor` (`heisd.executors`; default: this process): where episodes run; a remote one builds
    each worker's policy with `make_policy` (a picklable function)."""
    from tqdm import tqdm

    from heisd.executors import LocalExecutor
    from heisd.retrieval.online import check_persistable

    executor = executor or LocalExecutor()
    if persist_thresholds:
        check_persistable(policy.skip_thresholds())
    with EvalRun(method_label, cfg, out, identity) as run:
        run.attach(policy)
        here = EpisodeWorker([policy], cfg, str(run.out), [run.out / MUJOCO_LOG])
        setup = None if make_policy is None else partial(
            episode_worker, partial(_one, make_policy), cfg, str(run.out),
            [run_thresholds.snapshot(policy.skip_thresholds())])
        jobs = [(t, i, (0,)) for t, i in run.pending()]
        bar = tqdm(total=len(jobs), desc=f"eval {method_label}", unit="ep", disable=not progress)
        with bar:
            for _, lines in executor.map(play, jobs, setup=setup, here=here):
                run.record(lines[0][1])
                bar.update(1)
                bar.set_postfix(sr=f"{run.sr:.2f}")
        summary = run.summary()
        if persist_thresholds:
            run.persist_thresholds(policy)
    return summary


def _one(make_policy: Callable[[], VLAPolicy]) -> list[VLAPolicy]:
    return [make_policy()]


def run_episode(env, policy: VLAPolicy, options: dict, execute: int = 0) -> dict:
    """One episode from `env.reset(options=options)` (`registry.reset_options`) to success or truncation."""
    obs, info = env.reset(options=options)
    policy.reset(env.instruction, env.task)
    records, ee_path, executed, success, truncated, env_steps = [], [], [], False, False, 0
    moved = [info["ee_pos"]]  # positions since the last inference: the kinematic window's steps
    views = policy.views
    while not (success or truncated):
        actions, record = policy.act(observed_frame(obs, views), obs["state"], moved)
        records.append(record)
        ee_path.append([round(float(x), 5) for x in info["ee_pos"]])
        moved, todo = [], actions[: execute or len(actions)]
        executed.append([])
        for j, action in enumerate(todo):
            # only the frame after the chunk is read: mid-chunk steps skip rendering
            obs, _, success, truncated, info = env.step(action, render=j == len(todo) - 1)
            moved.append(info["ee_pos"])
            executed[-1].append([round(float(x), 6) for x in info["action"]])
            env_steps += 1
            if success or truncated:
                break
    policy.end_episode(success)
    steps = episode_steps(records)
    steps["ee_pos"] = ee_path  # where each control step started: the plots color it by mode
    steps["actions"] = executed  # per control step, the actions the simulator received (protocol applied)
    return {"success": bool(success), "env_steps": env_steps, "layout": [round(float(x), 6) for x in env.layout],
            "steps": steps}
