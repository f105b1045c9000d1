"""`heisd project`: per-step statistics of a bench run times a profile's per-piece costs."""

from __future__ import annotations

import json

import pytest

from heisd.cli import main
from heisd.profiling.projection import step_ms, verify_ms

PROFILE = {
    "target": "t", "device": "cpu", "device_name": "test", "dtype": "float32",
    "spec": {"n_action_tokens": 8},
    "pieces_ms": {"vision": {"median_ms": 2.0}, "prefill": {"median_ms": 10.0}, "decode_step": {"median_ms": 3.0},
                  "tree_verify": {"8": {"median_ms": 4.0}, "32": {"median_ms": 6.0}},
                  "drafter_pass": {"median_ms": 0.5}, "datastore_query": {"median_ms": 0.25}},
}
CONFIG = {"method": "heisd", "tree_budget": 8, "tree_depth": 3, "retrieval_budget": 32, "retrieval_fallback": "ar"}


def test_step_costs_by_hand() -> None:
    ar = {**CONFIG, "method": "ar"}
    assert step_ms({"mode": "drafter", "target_forwards": 8}, ar, PROFILE, 8) == 2 + 10 + 7 * 3
    # drafter mode: 3 verify passes, each a tree of 8 plus 3 drafter passes
    assert step_ms({"mode": "drafter", "target_forwards": 4}, CONFIG, PROFILE, 8) == 2 + 10 + 3 * (4 + 3 * 0.5)
    # retrieval: query, prefill, the group tree once, then AR fallback steps
    assert step_ms({"mode": "retrieval", "target_forwards": 3}, CONFIG, PROFILE, 8) == 2 + 0.25 + 10 + 6 + 3
    assert step_ms({"mode": "retrieval", "target_forwards": 0}, CONFIG, PROFILE, 8) == 2 + 0.25  # prefill skip
    drafter_fallback = {**CONFIG, "retrieval_fallback": "drafter"}
    assert step_ms({"mode": "retrieval", "target_forwards": 3}, drafter_fallback, PROFILE, 8) == \
        2 + 0.25 + 10 + 6 + (4 + 3 * 0.5)
    assert step_ms({"mode": "jacobi", "target_forwards": 2}, CONFIG, PROFILE, 8) == pytest.approx(2 + 10 + 3.875)
    assert verify_ms(PROFILE, 20) == pytest.approx(5.0) and verify_ms(PROFILE, 64) == 6.0


def test_project_a_bench_directory(tmp_path, capsys) -> None:
    def method(name, label, modes, forwards, latency, speedup):
        (tmp_path / label).mkdir()
        steps = {"mode": modes, "target_forwards": forwards}
        (tmp_path / label / "episodes.jsonl").write_text(json.dumps({"steps": steps}) + "\n")
        return {"method": label, "dir": label, "config": {**CONFIG, "method": name},
                "latency_ms": {"median": latency}, "speedup": speedup}

    bench = [method("ar", "ar", ["drafter"] * 3, [8, 8, 8], 30.0, 1.0),
             method("retrieval", "retrieval", ["retrieval"] * 3, [0, 2, 2], 20.0, 1.5)]
    (tmp_path / "bench.json").write_text(json.dumps(bench))
    (tmp_path / "profile.json").write_text(json.dumps(PROFILE))
    assert main(["project", "--bench", str(tmp_path), "--profile", str(tmp_path / "profile.json"),
                 "--out", str(tmp_path / "p.json")]) == 0
    rows = json.loads((tmp_path / "p.json").read_text())["rows"]
    assert rows[0]["projected_ms"] == 33.0 and rows[1]["projected_ms"] == 2 + 0.25 + 10 + 6
    assert rows[1]["projected_speedup"] == pytest.approx(33.0 / 18.25)
    assert "PROJECTION" in capsys.readouterr().out
    again = ["project", "--bench", str(tmp_path), "--profile", str(tmp_path / "profile.json"), "--out",
             str(tmp_path / "p.json")]
    assert main(again) == 1 and "p.json already holds a heisd projection" in capsys.readouterr().err
    assert main([*again, "--overwrite"]) == 0
    no_drafter = {**PROFILE, "pieces_ms": {k: v for k, v in PROFILE["pieces_ms"].items() if k != "datastore_query"}}
    (tmp_path / "partial.json").write_text(json.dumps(no_drafter))
    with pytest.raises(SystemExit, match="datastore_query"):
        main(["project", "--bench", str(tmp_path), "--profile", str(tmp_path / "partial.json")])
