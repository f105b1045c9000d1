"""`heisd eval --method ar` with an OpenVLA target on LIBERO equals OpenVLA's own evaluation loop, step for step.

tests/golden/openvla_libero_loop.json was made by OpenVLA's `run_libero_eval.py` (its `eval_libero`,
run in a throwaway environment with the reference's pinned versions; tests/golden/README.md says how)
on the tiny checkpoint (`heisd tiny-openvla --seed 0`) with a `dataset_statistics.json` beside it:
LIBERO-Object task 0 from init state 0, truncated after 30 policy steps. It holds the action sent to
`env.step` and `robot0_eef_pos` of the observation the policy read, per step. Numbers only; none of
the reference's code is here. Frames come from MuJoCo's EGL renderer: a different GL stack may draw
other pixels, and then other tokens.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np
import pytest

from heisd.benchmarks.libero_protocol import openvla_gripper
from heisd.cli import main

pytest.importorskip("libero", reason="the libero extra is not installed (pip install -e '.[libero]')")

GOLDEN = json.loads((Path(__file__).parent / "golden" / "openvla_libero_loop.json").read_text())


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory) -> Path:
    """The reference's checkpoint: the tiny one, plus the fine-tuning statistics OpenVLA's eval reads."""
    from heisd.targets.openvla import write_tiny_openvla

    path = tmp_path_factory.mktemp("loop") / "tiny-openvla"
    write_tiny_openvla(path, seed=0, shards=2)  # as `heisd tiny-openvla --seed 0`
    (path / "dataset_statistics.json").write_text(json.dumps(GOLDEN["dataset_statistics"], indent=2))
    return path


def test_the_golden_episode_was_made_on_this_exact_checkpoint(checkpoint):
    # if this fails, the tiny checkpoint's bytes changed: make the golden episode again (tests/golden/README.md)
    hashes = {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(checkpoint.iterdir())}
    assert hashes == GOLDEN["files"]


def test_the_references_tokens_become_its_actions(checkpoint):
    """The action post-processing alone: de-normalization with the suite's statistics (dataset_statistics.json
    replacing config.json's, the key falling back to `_no_noops`), then the gripper's 2a-1, sign, inversion."""
    from heisd.targets.openvla import load_openvla

    target = load_openvla(checkpoint, unnorm_key=GOLDEN["suite"])
    assert target.parts.stats.key == GOLDEN["unnorm_key"] == "libero_object_no_noops"
    actions = openvla_gripper(target.action_tokenizer.decode(np.array(GOLDEN["tokens"])))
    assert actions.dtype == np.float64  # predict_action's: the simulator gets these numbers
    np.testing.assert_allclose(actions, GOLDEN["actions"], rtol=0, atol=1e-12)


def test_heisd_eval_reproduces_openvlas_libero_episode_step_for_step(checkpoint, tmp_path, capsys):
    from heisd.benchmarks.libero import suite_tasks

    assert GOLDEN["truncated_at"] == GOLDEN["steps"] == 30 and GOLDEN["center_crop"]
    task = suite_tasks(GOLDEN["suite"])[GOLDEN["task_index"]]
    out = tmp_path / "eval"
    # no --unnorm-key: the suite's, as OpenVLA's eval; the center crop is on by default, as there
    assert main(["eval", "--method", "ar", "--target", str(checkpoint), "--benchmark", GOLDEN["suite"],
                 "--tasks", task, "--episodes", "1", "--seed", "0", "--max-steps", str(GOLDEN["steps"]),
                 "--out", str(out)]) == 0
    line = json.loads((out / "episodes.jsonl").read_text())
    assert line["layout"] == [GOLDEN["init_state"]]
    steps = line["steps"]
    assert [len(a) for a in steps["actions"]] == [1] * GOLDEN["steps"]  # one action per control step
    actions, ee_pos = np.array([a[0] for a in steps["actions"]]), np.array(steps["ee_pos"])
    for i, (action, expected) in enumerate(zip(actions, GOLDEN["actions"])):
        np.testing.assert_allclose(ee_pos[i], GOLDEN["ee_pos"][i], rtol=0, atol=1e-4, err_msg=f"step {i}: ee_pos")
        np.testing.assert_allclose(action, expected, rtol=0, atol=1e-5, err_msg=f"step {i}: action")
    assert line["success"] == GOLDEN["success"] and line["env_steps"] == GOLDEN["steps"]

    run = json.loads((out / "run.json").read_text())
    assert run["max_steps"] == 30 and run["center_crop"] is True and run["protocol"] == "openvla"
    argv = ["eval", "--method", "ar", "--target", str(checkpoint), "--benchmark", GOLDEN["suite"], "--tasks", task,
            "--episodes", "1", "--max-steps", "30", "--no-center-crop", "--out", str(out)]
    capsys.readouterr()
    assert main(argv) == 1  # other frames: not a resume of this run
    assert "other settings (center_crop: True -> False)" in capsys.readouterr().err
