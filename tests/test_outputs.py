"""No command destroys data: an existing output needs --overwrite, --overwrite replaces only what
heisd made, and every kind of heisd output is recognized as its own kind only."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from helpers import save_tiny_drafter, tiny_vla, write_demo_file

from heisd.cli import main
from heisd.drafter.train import DRAFTER_RUN
from heisd.errors import OutputError
from heisd.retrieval import build_datastore
from heisd.retrieval.manifest import DATASTORE
from heisd.runtime.bench import BENCH_RUN
from heisd.runtime.demos import generate_demos
from heisd.runtime.recording import DEMOS, DemoConfig
from heisd.runtime.replay import REPLAY_RUN
from heisd.runtime.runinfo import EVAL_RUN
from heisd.targets.vla.train import TRAINING_RUN


def siblings(path: Path) -> list[str]:
    return sorted(p.name for p in path.parent.iterdir())


def test_overwrite_never_touches_a_file_or_folder_heisd_did_not_make(tmp_path, capsys) -> None:
    vla = tiny_vla()
    vla.save_pretrained(tmp_path / "vla")
    write_demo_file(tmp_path / "demos.hdf5", ["reach-v3"], episodes=2, steps=20)
    (tmp_path / "thesis.pdf").write_text("three years of work")
    (tmp_path / "home").mkdir()
    (tmp_path / "home" / "notes.txt").write_text("mine")
    before = siblings(tmp_path / "thesis.pdf")
    for out in ("thesis.pdf", "home"):
        argv = ["build-datastore", "--target", str(tmp_path / "vla"), "--demos", str(tmp_path / "demos.hdf5"),
                "--out", str(tmp_path / out), "--overwrite", "--threads", "1"]
        assert main(argv) == 1
        assert f"{out} exists and is not a heisd datastore" in capsys.readouterr().err
    assert (tmp_path / "thesis.pdf").read_text() == "three years of work"
    assert (tmp_path / "home" / "notes.txt").read_text() == "mine"
    assert siblings(tmp_path / "thesis.pdf") == before  # no hidden .old- / .tmp- left beside them
    build_datastore(vla, [tmp_path / "demos.hdf5"], tmp_path / "store")
    with pytest.raises(OutputError, match="already holds a heisd datastore"):
        build_datastore(vla, [tmp_path / "demos.hdf5"], tmp_path / "store")
    (tmp_path / "store" / "notes.txt").write_text("a note inside the old store")
    build_datastore(vla, [tmp_path / "demos.hdf5"], tmp_path / "store", overwrite=True)  # heisd's files: replaced
    assert (tmp_path / "store" / "notes.txt").read_text() == "a note inside the old store"  # the user's: kept
    assert siblings(tmp_path / "store") == sorted(before + ["store"])


def test_demos_need_overwrite_and_replace_only_heisd_files(tmp_path) -> None:
    cfg = DemoConfig(("reach-v3",), episodes=1, max_steps=3, image_size=16)
    out = tmp_path / "demos.hdf5"
    generate_demos(cfg, out, progress=False)
    first = out.stat().st_mtime_ns
    with pytest.raises(OutputError, match="demos.hdf5 already holds a heisd demonstration file; pass --overwrite"):
        generate_demos(cfg, out, progress=False)
    assert out.stat().st_mtime_ns == first
    generate_demos(cfg, out, progress=False, overwrite=True)
    assert out.stat().st_mtime_ns != first and siblings(out) == ["demos.hdf5"]


def test_train_vla_overwrite_starts_afresh_and_keeps_foreign_files(tmp_path, capsys, monkeypatch) -> None:
    write_demo_file(tmp_path / "demos.hdf5", ["reach-v3", "push-v3"], episodes=2, steps=10)
    out = tmp_path / "run"
    argv = ["train-vla", "--demos", str(tmp_path / "demos.hdf5"), "--out", str(out), "--steps", "4",
            "--batch-size", "4", "--threads", "1", "--eval-every", "2", "--save-every", "2", "--hidden-size", "32",
            "--layers", "1", "--image-size", "16", "--vision-channels", "8,16"]
    assert main(argv) == 0
    (out / "notes.txt").write_text("my notes on this run")
    assert main(argv) == 1 and "pass --overwrite to replace it or --resume" in capsys.readouterr().err
    assert main([*argv, "--overwrite", "--steps", "2"]) == 0  # not a resume: a new run of 2 steps
    assert [json.loads(x)["step"] for x in (out / "train_log.jsonl").read_text().splitlines()] == [2]
    assert (out / "notes.txt").read_text() == "my notes on this run"
    # the old run goes when the new one starts: one interrupted before its first save leaves no mix
    from heisd.targets.vla import train as train_module

    def interrupted(*args) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(train_module, "_save", interrupted)
    assert main([*argv, "--overwrite"]) == 130
    assert sorted(p.name for p in out.iterdir()) == ["notes.txt", "train_log.jsonl"]


def test_each_output_kind_recognizes_its_own_outputs_only(tmp_path) -> None:
    vla = tiny_vla()
    outputs = {"vla": tmp_path / "vla", "drafter": tmp_path / "drafter", "store": tmp_path / "store",
               "demos": tmp_path / "demos.hdf5", "eval": tmp_path / "bench" / "ar", "bench": tmp_path / "bench",
               "replay": tmp_path / "replay"}
    vla.save_pretrained(outputs["vla"])
    save_tiny_drafter(vla, outputs["drafter"])
    for name, info in (("vla", {"model_config": {}}), ("drafter", {"drafter_config": {}, "target_fingerprint": "x"})):
        (outputs[name] / "train_info.json").write_text(json.dumps(info))  # both trainers write this name
    write_demo_file(tmp_path / "raw.hdf5", ["reach-v3"], episodes=1, steps=20)  # written without heisd's marks
    build_datastore(vla, [tmp_path / "raw.hdf5"], outputs["store"])
    generate_demos(DemoConfig(("reach-v3",), episodes=1, max_steps=2, image_size=16), outputs["demos"], progress=False)
    outputs["eval"].mkdir(parents=True)
    (outputs["eval"] / "run.json").write_text(json.dumps({"method": "ar", "benchmark": "mw"}))
    outputs["replay"].mkdir()
    (outputs["replay"] / "replay.json").write_text("{}")
    kinds = {"vla": TRAINING_RUN, "drafter": DRAFTER_RUN, "store": DATASTORE, "demos": DEMOS, "eval": EVAL_RUN,
             "bench": BENCH_RUN, "replay": REPLAY_RUN}
    for name, kind in kinds.items():
        recognized = {other for other, path in outputs.items() if kind.recognize(path)}
        assert recognized == {name}, (name, recognized)
        assert not kind.recognize(tmp_path / "raw.hdf5")
