"""`heisd profile` on the CPU: the tiny OpenVLA checkpoint, the shipped small VLA, a random OpenVLA,
and scripts/gpu_profile.sh dry-run with the tiny shape."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from heisd.cli import main
from heisd.decoding import DraftTree
from heisd.profiling import measure
from heisd.profiling.pieces import branching_tree
from heisd.profiling.report import format_table
from heisd.profiling.timer import device_work, measure_rounds
from heisd.retrieval.datastore import DatastoreWriter

ROOT = Path(__file__).resolve().parents[1]
PIECES = {"vision", "prefill", "fused_prefill", "decode_step", "tree_verify", "ar_step"}


def test_measure_warms_up_then_times_each_run():
    calls, rolled = [], []
    timing = measure(lambda: calls.append(1) or len(calls), torch.device("cpu"), repeats=4, warmup=2,
                     after=rolled.append)
    assert len(calls) == 6 and rolled == [1, 2, 3, 4, 5, 6] and timing.runs == 4
    assert 0 <= timing.p10_ms <= timing.median_ms <= timing.p90_ms
    with pytest.raises(ValueError):
        measure(lambda: None, torch.device("cpu"), repeats=0, warmup=0)


def test_pieces_take_turns_each_warm_again_after_the_others():
    """Rounds: each piece's share of the repeats in a tight loop per turn, one untimed run first
    (the warm-up runs in the first turn), so load changes hit every piece alike."""
    order = []
    pieces = {name: (lambda name=name: order.append(name), None) for name in ("a", "b")}
    timings = measure_rounds(pieces, torch.device("cpu"), repeats=5, warmup=2, rounds=2)
    assert order == ["a"] * 5 + ["b"] * 5 + ["a"] * 3 + ["b"] * 3  # turn 1: 2 warm-up + 3 timed; turn 2: 1 + 2
    assert timings["a"].runs == timings["b"].runs == 5
    with pytest.raises(ValueError, match="rounds"):
        measure_rounds(pieces, torch.device("cpu"), repeats=2, warmup=0, rounds=3)


def test_profiled_trees_branch_breadth_first():
    tree = branching_tree(9, 4, first_action_id=100, n_bins=8)
    assert tree.parents.tolist() == [-1, -1, -1, -1, 0, 0, 0, 0, 1]
    assert tree.tokens.tolist() == [100, 101, 102, 103, 104, 105, 106, 107, 100]
    assert isinstance(tree, DraftTree) and tree.max_depth == 2


def run_profile(tmp_path, *args) -> dict:
    out = tmp_path / "profile.json"
    assert main(["profile", *args, "--out", str(out), "--repeats", "2", "--warmup", "1",
                 "--tree-sizes", "4", "16"]) == 0
    result = json.loads(out.read_text())
    pieces = result["pieces_ms"]
    assert PIECES <= set(pieces) and set(pieces["tree_verify"]) == {"4", "16"}
    timings = [pieces[k] for k in pieces if k != "tree_verify"] + list(pieces["tree_verify"].values())
    assert all(t["runs"] == 2 and t["median_ms"] > 0 for t in timings)
    return result


def test_profile_tiny_openvla_with_drafter_and_datastore(tiny_openvla_dir, tmp_path, capsys):
    rng = np.random.default_rng(0)
    writer = DatastoreWriter(key_dim=64, hidden_dim=64, n_tokens=7, target_fingerprint="any")
    writer.add(keys=rng.normal(size=(50, 64)).astype(np.float32), tokens=np.full((50, 4, 7), 31800),
               own_tokens=np.full((50, 7), 31800), hidden=np.zeros((50, 64), np.float32),
               ee_pos=np.zeros((50, 3), np.float32), episode=0, step=np.arange(50), task="t")
    writer.finalize(tmp_path / "ds")
    result = run_profile(tmp_path, "--target", str(tiny_openvla_dir), "--unnorm-key", "bridge_orig",
                         "--random-drafter", "--datastore", str(tmp_path / "ds"))
    assert {"drafter_pass", "datastore_query"} <= set(result["pieces_ms"])
    assert result["prefix_len"] > 256 and result["key_dim"] == 64 and result["spec"]["n_action_tokens"] == 7
    table = capsys.readouterr().out
    assert "| tree_verify_16 |" in table and "| datastore_query |" in table and "| fused_prefill |" in table
    assert result["fused_prefill_nodes"] == 32


def test_profile_shipped_small_vla_with_its_drafter(tmp_path):
    result = run_profile(tmp_path, "--target", str(ROOT / "checkpoints/vla"),
                         "--drafter", str(ROOT / "checkpoints/drafter"))
    assert result["spec"]["n_action_tokens"] == 8 and "drafter_pass" in result["pieces_ms"]


def test_profile_random_openvla_tiny_shape(tmp_path):
    result = run_profile(tmp_path, "--random-openvla-7b", "--random-shape", "tiny")
    assert result["target"] == "random OpenVLA (tiny shape)" and result["llm_parameters"] > 0
    again = ["profile", "--random-openvla-7b", "--random-shape", "tiny", "--out", str(tmp_path / "profile.json"),
             "--repeats", "1", "--warmup", "0"]
    assert main(again) == 1  # a measured profile is not replaced without --overwrite
    assert json.loads((tmp_path / "profile.json").read_text()) == result
    assert main([*again, "--overwrite"]) == 0


def test_profile_errors_are_one_line(tiny_openvla_dir, tmp_path):
    for args, expected in ((["--target", str(tmp_path)], "no config.json in"),
                           (["--target", str(tiny_openvla_dir)], "choose one with --unnorm-key"),
                           (["--target", str(ROOT / "checkpoints/vla"), "--datastore", str(tmp_path / "none")],
                            str(tmp_path / "none")),
                           (["--random-openvla-7b", "--random-shape", "tiny", "--device", "cpu", "--device-work"],
                            "--device-work reads CUDA's kernel records; --device is cpu")):
        with pytest.raises(SystemExit) as info:
            main(["profile", *args, "--out", str(tmp_path / "p.json")])
        assert str(info.value).startswith("heisd profile: ") and expected in str(info.value)
        assert "\n" not in str(info.value)


def test_gpu_profile_script_dry_run_on_cpu(tmp_path):
    env = {**os.environ, "DEVICE": "cpu", "DTYPE": "float32", "SHAPE": "tiny", "REPEATS": "1",
           "PYTHON": sys.executable, "PYTHONPATH": str(ROOT / "src")}
    out = tmp_path / "gpu"
    subprocess.run(["bash", str(ROOT / "scripts/gpu_profile.sh"), str(out)], env=env, check=True,
                   capture_output=True, timeout=300)
    result = json.loads((out / "profile_openvla_tiny_float32.json").read_text())
    assert set(result["pieces_ms"]["tree_verify"]) == {"4", "8", "16", "32", "64"}
    assert "drafter_pass" in result["pieces_ms"]
    assert (out / "environment.txt").is_file() and (out / "profile_openvla_tiny_float32.md").is_file()


def test_device_work_is_cuda_only_and_shown_beside_the_wall_time():
    with pytest.raises(ValueError, match="CUDA's kernel records; the device is cpu"):
        device_work({"mm": (lambda: torch.ones(2, 2) @ torch.ones(2, 2), None)}, torch.device("cpu"))
    piece = lambda ms, kernel=None: {"median_ms": ms, "p10_ms": ms, "p90_ms": ms, "runs": 3,  # noqa: E731
                                     **({} if kernel is None else {"kernel_ms": kernel, "device_ops": 1460.0})}
    result = {"target": "t", "device_name": "gpu", "dtype": "bfloat16", "prefix_len": 282, "repeats": 3, "warmup": 1,
              "pieces_ms": {"vision": piece(21.0, 4.0), "decode_step": piece(36.0, 6.5), "tree_verify": {}}}
    table = format_table(result)
    assert "| decode_step | 36.00 | 36.00 | 36.00 | 1.00 | 6.50 | 1460 |" in table and "GPU kernel ms" in table
    result["pieces_ms"]["vision"] = piece(21.0)  # a profile without --device-work: the columns stay out
    assert "GPU kernel" not in format_table(result)
