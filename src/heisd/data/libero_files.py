"""Which LIBERO suite and task a LIBERO dataset file holds.

LIBERO's own files (`<task>_demo.hdf5`, made by LIBERO's scripts/create_dataset.py) carry the task
in `data` attrs: `problem_info` (JSON with `problem_name`, `domain_name`, `language_instruction`) and
`bddl_file_name`. OpenVLA's regenerated no-noop files (experiments/robot/libero/
regenerate_libero_dataset.py) keep the file name but write no `data` attrs at all. So the task
is found from, in order: the BDDL file name, the file name; the instruction from `problem_info`,
else from the task name as LIBERO derives it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from heisd.errors import InputError

DEMO_SUFFIX = "_demo"  # LIBERO names a task's file <task name>_demo.hdf5


@dataclass(frozen=True)
class LiberoTask:
    suite: str  # libero_spatial, libero_object, libero_goal, libero_10 or libero_90
    task: str  # LIBERO's task name (its BDDL file name without .bddl)
    instruction: str  # the language instruction


def _task_map() -> dict[str, list[str]]:
    from heisd.benchmarks.libero_setup import ensure_libero

    ensure_libero()
    from libero.libero.benchmark.libero_suite_task_map import libero_task_map

    return libero_task_map


def _language(task: str) -> str:
    from libero.libero.benchmark import grab_language_from_filename

    return grab_language_from_filename(task + ".bddl")


def identify(path: Path, attrs: dict) -> LiberoTask:
    """The suite and task of a LIBERO-layout file (attrs: its `data` group's attributes, decoded)."""
    suite_of = {task: suite for suite, tasks in _task_map().items() for task in tasks}
    candidates = []
    if "bddl_file_name" in attrs:
        candidates.append(Path(str(attrs["bddl_file_name"])).stem)
    stem = path.stem
    candidates.append(stem[: -len(DEMO_SUFFIX)] if stem.endswith(DEMO_SUFFIX) else stem)
    task = next((c for c in candidates if c in suite_of), None)
    if task is None:
        raise InputError(f"{path}: a LIBERO-layout file (no 'benchmark' attribute on 'data') whose task is "
                         f"unknown: neither its data attrs 'bddl_file_name' nor its name <task>{DEMO_SUFFIX}.hdf5 "
                         "names a LIBERO task")
    instruction = _language(task)
    if "problem_info" in attrs:
        try:
            given = json.loads(attrs["problem_info"])["language_instruction"]
        except (json.JSONDecodeError, KeyError, TypeError) as e:
            raise InputError(f"{path}: data attribute 'problem_info' is not LIBERO's JSON with "
                             f"'language_instruction' ({e})") from e
        instruction = (given if isinstance(given, str) else " ".join(given)).strip().strip('"')
    return LiberoTask(suite_of[task], task, instruction)
