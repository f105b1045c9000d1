"""DAgger for the target VLA (Ross et al., 2011): roll out the current target, label every state
it visits with the scripted expert, aggregate with everything so far, fine-tune, repeat.

Behaviour cloning alone leaves the target in states no demonstration visited (push and
pick-place: the arm wanders for the whole episode). DAgger puts exactly those states, with the
expert's answer, into the training data.

`OUT/` holds, per round r (1-based):

    round_<r>/rollouts.hdf5   the round's actor (round r-1's checkpoint, round 1: --init) rolled
                              out on layouts of seed `seed + r - 1`, expert-labelled (LIBERO:
                              round_<r>/rollouts/<task>_demo.hdf5, one file per task)
    round_<r>/vla/            the checkpoint fine-tuned from the actor on demos + rollouts 1..r (an
                              OpenVLA-architecture --init: rolled out on the protocol's 256 px frames
                              and fine-tuned as `train-vla --arch openvla` does, with its defaults)
    dagger.json               the configuration (a resumed run must match it, except for the number of
                              rounds, which may grow, and the threads and workers)
    dagger_log.jsonl          per round: the actor's success per task on its rollouts, data, training

A killed run resumes where it stopped: finished rollout files and trainings are kept, a round's
unfinished rollouts keep their finished episodes (`heisd.runtime.episode_store`), a partial
training continues from its own train_state.
"""

from __future__ import annotations

import json
import math
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from heisd.errors import ConfigError, OutputError
from heisd.storage import (
    OutputKind,
    append_text,
    check_output,
    directory_lock,
    recorded_path,
    refuse_foreign,
    strict_json,
    write_json,
)
from heisd.storage.guard import json_with

CONFIG_FILE = "dagger.json"
LOG_FILE = "dagger_log.jsonl"
DAGGER_RUN = OutputKind("DAgger run", json_with(CONFIG_FILE, "init", "demos"))  # "rounds" is not saved (RESOURCES)


@dataclass(frozen=True)
class DaggerConfig:
    init: str  # checkpoint of round 0 (behaviour-cloned on the demonstrations)
    demos: tuple[str, ...]  # the demonstrations it was trained on (aggregated every round)
    tasks: tuple[str, ...]  # tasks of `benchmark` rolled out
    rounds: int = 3  # rollout + fine-tune rounds
    episodes: int = 8  # rollout episodes per task per round
    seed: int = 20  # round r rolls out on layouts of seed `seed + r - 1` (never an evaluation seed)
    steps: int = 1000  # fine-tuning steps per round (cosine schedule of its own)
    batch_size: int = 64
    lr: float = 3e-4  # peak fine-tuning learning rate (a tenth of the schedule warms up)
    threads: int = 2  # torch threads for fine-tuning
    workers: int = 1  # simulator processes for the rollouts
    max_steps: int | None = None  # rollouts' step limit; None: the benchmark's (LIBERO: only its protocol's)
    benchmark: str = "mw"  # mw, or a LIBERO suite with scripted experts (libero_object)
    keyframe_weight: float = 1.0  # fine-tuning: `TrainConfig.keyframe_weight` (1: every frame alike)
    keyframe_window: int = 8  # fine-tuning: `TrainConfig.keyframe_window`

    def __post_init__(self) -> None:
        from heisd.benchmarks.libero_experts import check_expert_suite
        from heisd.benchmarks.registry import recording_max_steps
        from heisd.runtime.recording import EVAL_SEED_OFFSET

        if self.benchmark != "mw":
            check_expert_suite(self.benchmark)
        object.__setattr__(self, "max_steps", recording_max_steps(self.benchmark, self.max_steps))

        for name, least in (("rounds", 1), ("episodes", 1), ("steps", 1), ("batch_size", 1), ("threads", 1),
                            ("workers", 1), ("max_steps", 1), ("seed", 0)):
            if getattr(self, name) < least:
                raise ConfigError(f"DaggerConfig.{name} must be >= {least}, got {getattr(self, name)}")
        if not self.lr > 0:
            raise ConfigError(f"DaggerConfig.lr must be > 0, got {self.lr}")
        if not (self.keyframe_weight > 0 and math.isfinite(self.keyframe_weight)) or self.keyframe_window < 1:
            raise ConfigError(f"DaggerConfig.keyframe_weight must be > 0 and keyframe_window >= 1, got "
                              f"{self.keyframe_weight} and {self.keyframe_window}")
        if self.seed + self.rounds > EVAL_SEED_OFFSET:
            raise ConfigError(f"DAgger rounds use seeds {self.seed}..{self.seed + self.rounds - 1}: they must stay "
                              f"below {EVAL_SEED_OFFSET}, where the evaluation layouts start")

    def round_seed(self, r: int) -> int:
        """Layout seed of round r's rollouts (r from 1)."""
        return self.seed + r - 1


def demo_seeds(paths: tuple[str, ...]) -> set[int]:
    """Layout seeds the demonstration files were recorded with (their `env_args`)."""
    from heisd.data.dataset import recorded_settings

    # heisd's LIBERO files keep them inside LIBERO's env_args, under "heisd_demos"
    settings = [s.get("heisd_demos", s) for s in recorded_settings(paths)]
    return {int(s["seed"]) for s in settings if "seed" in s}


def run_dagger(cfg: DaggerConfig, out: Path, overwrite: bool = False, progress: bool = True, executor=None) -> Path:
    """Run (or resume) every round; return the last round's checkpoint directory. `executor`
    (`heisd.executors`; default: `cfg.workers` local processes): where the rollouts run."""
    from heisd.executors import LocalExecutor
    from heisd.runtime.recording import ran_settings

    executor = executor or LocalExecutor(cfg.workers)
    out = Path(out)
    saved = out / CONFIG_FILE
    refuse_foreign(out, DAGGER_RUN)  # also names a corrupt dagger.json before it is read
    before, now = (json.loads(saved.read_text()) if saved.is_file() else None), _jsonable(cfg)
    if before is not None:
        before.setdefault("benchmark", "mw")  # runs saved before LIBERO had DAgger
        for name in ("keyframe_weight", "keyframe_window"):  # and before keyframe weights: unweighted
            before.setdefault(name, getattr(DaggerConfig, name))
        before = ran_settings(before)
    resuming = before == now
    if before is not None and not resuming and not overwrite:
        changed = sorted(k for k in now if before.get(k) != now[k])
        raise OutputError(f"{out} holds a DAgger run with other settings ({', '.join(changed)}): rerun with its "
                          "settings to resume it, or pass --overwrite to start over")
    if not resuming:
        check_output(out, DAGGER_RUN, overwrite)
    _check_init(cfg)  # a wrong --init is refused before anything is written
    clash = demo_seeds(cfg.demos) & {cfg.round_seed(r) for r in range(1, cfg.rounds + 1)}
    if clash:
        raise ConfigError(f"DAgger seeds {sorted(clash)} were used by the demonstrations: pick another --seed")
    with directory_lock(out):
        if not resuming:  # --overwrite: a new configuration starts from round 1
            for folder in out.glob("round_*"):
                _remove_round(folder)
            (out / LOG_FILE).unlink(missing_ok=True)
            write_json(saved, now)
        actor = Path(cfg.init)
        for r in range(1, cfg.rounds + 1):
            actor = _round(cfg, out, r, actor, progress, executor)
    return actor


def _round(cfg: DaggerConfig, out: Path, r: int, actor: Path, progress: bool, executor) -> Path:
    """Round r: roll out `actor`, label, fine-tune it on everything so far; return the new checkpoint."""
    import torch

    from heisd.benchmarks.cameras import DEFAULT_CAMERA, UNRECORDED_CAMERA
    from heisd.benchmarks.libero_protocol import PROTOCOL_RENDER_SIZE
    from heisd.benchmarks.registry import is_libero
    from heisd.runtime.demos import generate_demos
    from heisd.runtime.recording import DemoConfig
    from heisd.targets.load import is_openvla
    from heisd.targets.openvla.train import OpenVLAShape, train_openvla
    from heisd.targets.vla.train import (
        TRAIN_STATE_FILE,
        TrainConfig,
        demo_camera,
        read_train_info,
        train,
        trained_camera,
    )

    folder = out / f"round_{r}"
    folder.mkdir(parents=True, exist_ok=True)
    openvla = is_openvla(actor)
    t0 = time.perf_counter()
    if not all(p.is_file() for p in rollout_files(cfg, folder)):  # written all at once: none or every one
        # mw: the camera the actor knows; else its demonstrations' (fine-tuning mixes them with these rollouts,
        # and train-vla refuses two cameras); else what heisd recorded with before files said. LIBERO: agentview
        camera = DEFAULT_CAMERA if is_libero(cfg.benchmark) else (
            trained_camera(actor) or demo_camera([Path(p) for p in cfg.demos]) or UNRECORDED_CAMERA)
        demo_cfg = DemoConfig(cfg.tasks, cfg.episodes, cfg.round_seed(r), camera=camera, max_steps=cfg.max_steps,
                              policy=str(actor), expert_labels=True, benchmark=cfg.benchmark,
                              **(dict(image_size=PROTOCOL_RENDER_SIZE, shadows=True) if openvla else {}))
        generate_demos(demo_cfg, _rollout_output(cfg, folder), progress=progress, executor=executor)
    rollout_s = time.perf_counter() - t0
    ckpt = folder / "vla"
    train_cfg = TrainConfig(steps=cfg.steps, batch_size=cfg.batch_size, lr=cfg.lr,
                            warmup_steps=max(1, cfg.steps // 10), seed=cfg.seed + r,
                            eval_every=max(1, cfg.steps // 6), save_every=max(1, cfg.steps // 6),
                            keyframe_weight=cfg.keyframe_weight, keyframe_window=cfg.keyframe_window)
    data = [Path(p) for p in cfg.demos] + [f for i in range(1, r + 1) for f in rollout_files(cfg, out / f"round_{i}")]
    t1 = time.perf_counter()
    if read_train_info(ckpt).get("step") != cfg.steps:  # not trained to the end yet
        torch.set_num_threads(cfg.threads)
        resume = (ckpt / TRAIN_STATE_FILE).is_file()
        overwrite = not resume and ckpt.exists()
        if openvla:
            train_openvla(data, ckpt, train_cfg, OpenVLAShape(), resume=resume, overwrite=overwrite,
                          workers=cfg.threads, init_from=actor)
        else:
            train(data, ckpt, train_cfg, chunk=_chunk(actor), resume=resume, benchmark=cfg.benchmark,
                  init_from=actor, overwrite=overwrite)
    if r not in logged_rounds(out):
        _log(out, {"round": r, "actor": str(actor), "checkpoint": str(ckpt), "rollout_seed": cfg.round_seed(r),
                   "actor_success": rollout_success(rollout_files(cfg, folder)),
                   "data_files": [recorded_path(p) for p in data], "rollout_s": round(rollout_s, 1),
                   "train_s": round(time.perf_counter() - t1, 1),
                   "train_metrics": read_train_info(ckpt).get("last_metrics", {})})
    return ckpt


def _rollout_output(cfg: DaggerConfig, folder: Path) -> Path:
    """Where a round's rollouts are recorded: mw one file, LIBERO a directory of per-task files."""
    from heisd.benchmarks.registry import is_libero

    return folder / ("rollouts" if is_libero(cfg.benchmark) else "rollouts.hdf5")


def rollout_files(cfg: DaggerConfig, folder: Path) -> list[Path]:
    """The files of a round's rollouts."""
    from heisd.benchmarks.registry import is_libero
    from heisd.runtime.libero_demos import task_file

    output = _rollout_output(cfg, folder)
    return [output / task_file(t) for t in cfg.tasks] if is_libero(cfg.benchmark) else [output]


def logged_rounds(out: Path) -> set[int]:
    path = out / LOG_FILE
    if not path.is_file():
        return set()
    return {json.loads(line)["round"] for line in path.read_text().splitlines() if line.strip()}


def rollout_success(paths: list[Path]) -> dict[str, float]:
    """Success rate per task of the actor in its rollout files (every episode is kept)."""
    from heisd.data.dataset import DemoFile

    wins: dict[str, list[bool]] = {}
    for path in paths:
        with DemoFile(path) as f:
            for ep in f:
                wins.setdefault(ep.task, []).append(ep.success)
    return {t: sum(v) / len(v) for t, v in sorted(wins.items())}


def _check_init(cfg: DaggerConfig) -> None:
    """--init must be a target that acts in the benchmark (DAgger fine-tunes it on its own rollouts): heisd's
    VLA, or on LIBERO an OpenVLA-architecture checkpoint (rolled out on the protocol's frames)."""
    from heisd.benchmarks.libero_protocol import PROTOCOL_RENDER_SIZE
    from heisd.runtime.recording import load_recordable
    from heisd.targets.load import is_openvla

    load_recordable(cfg.init, cfg.benchmark, "--init", (PROTOCOL_RENDER_SIZE, True) if is_openvla(cfg.init) else None)
    if is_openvla(cfg.init) and cfg.keyframe_weight != 1.0:
        raise ConfigError("--keyframe-weight is for heisd's VLA (OpenVLA's fine-tuning weighs every frame alike)")


def _chunk(checkpoint: Path) -> int:
    from heisd.targets.vla.checkpoint import CONFIG_FILE as VLA_CONFIG
    from heisd.targets.vla.checkpoint import read_json

    return int(read_json(checkpoint / VLA_CONFIG, missing=f"{checkpoint}: not a VLA checkpoint (no {VLA_CONFIG})")["chunk"])


def _remove_round(folder: Path) -> None:
    import shutil

    if folder.is_dir():
        shutil.rmtree(folder)


def _log(out: Path, record: dict) -> None:
    append_text(out / LOG_FILE, strict_json(record) + "\n")


# how fast a run goes, and how far: a resume may change them (a round's data and training do not depend on them)
RESOURCES = ("threads", "workers", "rounds")


def _jsonable(cfg: DaggerConfig) -> dict:
    return {k: v for k, v in json.loads(json.dumps(asdict(cfg))).items() if k not in RESOURCES}
