"""`--benchmark` names -> environments: `mw` (embedded) and the LIBERO suites (the `libero` extra)."""

from __future__ import annotations

from heisd.benchmarks.libero_protocol import SUITES
from heisd.errors import UsageError

BENCHMARKS: tuple[str, ...] = ("mw",) + SUITES


def is_libero(benchmark: str) -> bool:
    return benchmark in SUITES


def action_dim(benchmark: str) -> int:
    """Dims of the actions the benchmark's robot takes."""
    if is_libero(benchmark):
        from heisd.benchmarks.libero_protocol import ACTION_DIM

        return ACTION_DIM
    from heisd.benchmarks.mw import ACTION_DIM

    return ACTION_DIM


def check_target(benchmark: str, spec) -> None:
    """Refuse a target (its `TargetSpec`) that cannot act in `benchmark`: its actions must have the
    dims the benchmark's robot takes, and a target with OpenVLA's conventions runs on LIBERO only."""
    dims, takes = spec.action_dim, action_dim(benchmark)
    if dims != takes:
        raise UsageError(f"--target's actions have {dims} dims, --benchmark {benchmark} takes {takes}")
    if spec.protocol == "openvla" and not is_libero(benchmark):
        raise UsageError(f"--target follows OpenVLA's LIBERO protocol; --benchmark {benchmark} has none")


def task_instructions(benchmark: str) -> dict[str, str]:
    """Task name -> language instruction, for every task of the benchmark."""
    if is_libero(benchmark):
        from heisd.benchmarks.libero import suite_instructions

        return suite_instructions(benchmark)
    from heisd.benchmarks.mw import TASKS

    return {name: task.instruction for name, task in TASKS.items()}


def resolve_tasks(benchmark: str, names: list[str] | tuple[str, ...]) -> tuple[str, ...]:
    """Command-line task names of a benchmark ('all' = all its tasks), each checked; a task named
    twice is refused (its episodes would run twice and count twice in the summary)."""
    repeated = sorted({name for name in names if list(names).count(name) > 1})
    if repeated:
        raise UsageError(f"--tasks names {', '.join(repeated)} more than once; each task runs once "
                         "(--episodes sets how many episodes per task)")
    if is_libero(benchmark):
        from heisd.benchmarks.libero import resolve_tasks as libero_tasks

        return libero_tasks(benchmark, names)
    from heisd.benchmarks.mw import resolve_tasks as mw_tasks

    return mw_tasks(names)


def default_max_steps(benchmark: str) -> int:
    """Steps per episode when none are given: mw's environment steps (`MWConfig.max_steps`), or a LIBERO
    suite's policy steps after the wait steps (OpenVLA's protocol: 220 / 280 / 300 / 520)."""
    if is_libero(benchmark):
        from heisd.benchmarks.libero_protocol import MAX_STEPS

        return MAX_STEPS[benchmark]
    from heisd.benchmarks.mw import MWConfig

    return MWConfig.max_steps


def recording_max_steps(benchmark: str, max_steps: int | None) -> int:
    """The step limit of recorded episodes (demonstrations, DAgger rollouts): mw's `max_steps`, None
    for its default; a LIBERO suite records with its protocol's limit only (its scripted experts and
    targets are measured with it), so another value is refused."""
    limit = default_max_steps(benchmark)
    if is_libero(benchmark) and max_steps not in (None, limit):
        from heisd.errors import UsageError

        raise UsageError(f"{benchmark} records episodes of its protocol's {limit} steps; --max-steps "
                         f"{max_steps} is for mw (leave it out)")
    return limit if max_steps is None else max_steps


def make_env(benchmark: str, task: str, image_size: int, camera: str, max_steps: int | None = None,
             protocol: str = "raw", crop: bool = False, fast_render: bool | None = None, wrist: bool = False):
    """One task's environment. LIBERO: agentview at `image_size`; `camera` is mw's. `max_steps`: the
    episode's steps (LIBERO: policy steps after the wait steps); None = `default_max_steps`.
    `protocol` is the target's (`TargetSpec.protocol`): "openvla" renders at the protocol's 256 px and
    applies OpenVLA's frame and gripper conventions (`crop`: its 0.9-area center crop), with shadows
    (OpenVLA saw them); "raw" (small targets, their demos and their evaluations alike) renders without
    shadows and reflections, at CPU cost. `wrist`: LIBERO also renders its wrist camera
    (``obs["wrist_image"]``)."""
    max_steps = default_max_steps(benchmark) if max_steps is None else max_steps
    if is_libero(benchmark):
        from heisd.benchmarks.libero import PROTOCOL_RENDER_SIZE, LiberoConfig, LiberoEnv

        size = PROTOCOL_RENDER_SIZE if protocol == "openvla" else image_size
        fast = protocol == "raw" if fast_render is None else fast_render
        return LiberoEnv(benchmark, task, LiberoConfig(image_size=size, fast_render=fast,
                                                       max_steps=max_steps, protocol=protocol, crop=crop,
                                                       wrist=wrist))
    if wrist:
        raise UsageError(f"{benchmark} has no wrist camera (LIBERO's suites do)")
    from heisd.benchmarks.mw import MetaWorldEnv, MWConfig

    return MetaWorldEnv(task, MWConfig(image_size, camera, max_steps))


def reset_options(benchmark: str, layout_seed: int, episode: int, sampled: bool = False) -> dict:
    """How episode `episode` starts: mw draws a layout from its seed; LIBERO episode i starts from the
    suite's init state i, as OpenVLA's protocol does, or with ``sampled`` from a layout its own
    samplers draw from the seed (layouts the evaluation's init states never are)."""
    return {"init_state": episode} if is_libero(benchmark) and not sampled else {"layout_seed": layout_seed}
