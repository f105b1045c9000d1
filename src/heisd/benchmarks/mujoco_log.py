"""MuJoCo's warnings into a run's folder instead of MUJOCO_LOG.TXT in the working directory."""

from __future__ import annotations

import time
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator


@contextmanager
def mujoco_log(path: Path, context: str = "") -> Iterator[None]:
    """While the block runs, MuJoCo warnings (e.g. an unstable simulation) are appended to `path`,
    each line stamped with the time and `context` (which episode)."""
    import mujoco

    def warn(message: str) -> None:
        with open(path, "a") as log:
            log.write(f"{time.strftime('%Y-%m-%dT%H:%M:%S')} {context} WARNING: {message}\n")

    previous = mujoco.get_mju_user_warning()
    mujoco.set_mju_user_warning(warn)
    try:
        yield
    finally:
        mujoco.set_mju_user_warning(previous)
