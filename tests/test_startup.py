"""The command line answers at once: `--help` and flag errors never load torch, transformers,
FAISS or a simulator (they cost seconds), and take well under a second of wall time."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from heisd.commands.runner import COMMANDS

SRC = str(Path(__file__).resolve().parents[1] / "src")
HEAVY = ("torch", "transformers", "faiss", "h5py", "mujoco", "libero", "metaworld", "ray")

PROBE = """
import sys
from heisd.commands.runner import build_parser
build_parser(sys.argv[1])
print(" ".join(m for m in {heavy} if m in sys.modules))
"""


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_building_a_commands_flags_loads_nothing_heavy(command) -> None:
    env = {**os.environ, "PYTHONPATH": SRC}
    done = subprocess.run([sys.executable, "-c", PROBE.format(heavy=HEAVY), command], env=env,
                          capture_output=True, text=True, timeout=60, check=True)
    assert done.stdout.split() == [], f"heisd {command}'s flags import {done.stdout.split()}"


@pytest.mark.parametrize("argv", [["--help"], ["eval", "--help"], ["eval", "--bad-flag"], ["serve", "--help"]])
def test_help_and_flag_errors_answer_within_a_second(argv) -> None:
    env = {**os.environ, "PYTHONPATH": SRC}
    start = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "heisd.cli", *argv], env=env, capture_output=True, text=True,
                          timeout=60)
    seconds = time.perf_counter() - start
    assert done.returncode in (0, 2) and "Traceback" not in done.stderr
    # about 0.3 s on a quiet 2-core machine (the interpreter itself ~0.05 s); the bound leaves room
    # for a loaded one, and a torch import alone costs several seconds
    assert seconds < 2.5, f"heisd {' '.join(argv)} took {seconds:.1f} s"
