"""heisd.storage: atomic files and directories, the output guard, directory locks, and
interrupted writes (SIGINT / SIGTERM in a real child process) that leave nothing behind."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import h5py
import pytest

from heisd.errors import OutputError
from heisd.storage import (
    LOCK_FILE,
    OutputKind,
    atomic_directory,
    atomic_file,
    atomic_files,
    check_output,
    clear_output,
    directory_lock,
    is_free,
    refuse_foreign,
    strict_json,
    write_json,
)
from heisd.storage.guard import has_file, hdf5_with_attr, json_with

SRC = str(Path(__file__).resolve().parents[1] / "src")
KIND = OutputKind("thing", json_with("made.json", "by"), files=("made.json", "data.bin"), reusable=("cache.bin",))


def names(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir())


def test_atomic_file_replaces_or_keeps_the_old_content(tmp_path: Path) -> None:
    path = tmp_path / "out.json"
    write_json(path, {"v": 1})
    with pytest.raises(RuntimeError):
        with atomic_file(path) as tmp:
            tmp.write_text("half")
            raise RuntimeError("disk full")
    assert json.loads(path.read_text()) == {"v": 1} and names(tmp_path) == ["out.json"]
    write_json(path, {"v": 2})
    assert json.loads(path.read_text()) == {"v": 2} and names(tmp_path) == ["out.json"]


def test_atomic_files_rename_together(tmp_path: Path) -> None:
    (tmp_path / "keep.txt").write_text("mine")
    with pytest.raises(RuntimeError):
        with atomic_files(tmp_path, ["a", "b"]) as tmp:
            tmp["a"].write_text("new a")
            raise RuntimeError
    assert names(tmp_path) == ["keep.txt"]  # not a without b
    with atomic_files(tmp_path, ["a", "b"]) as tmp:
        tmp["a"].write_text("A")
        tmp["b"].write_text("B")
    assert names(tmp_path) == ["a", "b", "keep.txt"] and (tmp_path / "b").read_text() == "B"


def test_atomic_directory_replace_and_failure(tmp_path: Path) -> None:
    out = tmp_path / "d"
    with atomic_directory(out) as tmp:
        (tmp / "x").write_text("1")
    with pytest.raises(ValueError):
        with atomic_directory(out, replace=["x"]) as tmp:
            (tmp / "x").write_text("2")
            raise ValueError
    assert (out / "x").read_text() == "1" and names(tmp_path) == ["d"]
    (out / "notes.txt").write_text("the user's")
    with atomic_directory(out, replace=["x"]) as tmp:
        (tmp / "y").write_text("2")
    assert names(out) == ["notes.txt", "y"] and names(tmp_path) == ["d"]  # no hidden .old- or .tmp- left
    with pytest.raises(OutputError, match="not a plain file name"):
        with atomic_directory(out, replace=["../d"]) as tmp:
            (tmp / "z").write_text("3")
    assert names(out) == ["notes.txt", "y"]
    with pytest.raises(OutputError, match="appeared while it was being written"):
        with atomic_directory(out) as tmp:  # not asked to replace: what is there stays
            (tmp / "z").write_text("3")
    assert names(out) == ["notes.txt", "y"] and names(tmp_path) == ["d"]


def test_guard_refuses_foreign_outputs_and_needs_overwrite(tmp_path: Path) -> None:
    ours, foreign, notes = tmp_path / "ours", tmp_path / "foreign", tmp_path / "notes.txt"
    ours.mkdir()
    (ours / "made.json").write_text('{"by": "heisd"}')
    (ours / "data.bin").write_text("x")
    (ours / "mine.txt").write_text("a user's file")
    foreign.mkdir()
    (foreign / "photo.jpg").write_text("x")
    notes.write_text("keep me")
    assert check_output(tmp_path / "new", KIND, overwrite=False) is False
    (tmp_path / "empty").mkdir()
    assert check_output(tmp_path / "empty", KIND, overwrite=False) is False
    (tmp_path / "cached").mkdir()
    (tmp_path / "cached" / "cache.bin").write_text("x")
    assert is_free(tmp_path / "cached", KIND)  # a cache alone is not a result to protect
    with pytest.raises(OutputError, match="already holds a heisd thing; pass --overwrite to replace it or --resume"):
        check_output(ours, KIND, overwrite=False, resume_flag="--resume")
    assert check_output(ours, KIND, overwrite=True) is True
    for path in (foreign, notes):
        with pytest.raises(OutputError, match="is not a heisd thing; heisd never replaces it"):
            check_output(path, KIND, overwrite=True)
        with pytest.raises(OutputError, match="is not a heisd thing"):
            refuse_foreign(path, KIND)
    (tmp_path / "link").symlink_to(tmp_path / "nowhere")
    assert not is_free(tmp_path / "link", KIND)
    clear_output(ours, KIND)
    assert names(ours) == ["mine.txt"]  # only heisd's own files go
    assert names(foreign) == ["photo.jpg"] and notes.read_text() == "keep me"


def test_recognizers(tmp_path: Path) -> None:
    with h5py.File(tmp_path / "ours.hdf5", "w") as f:
        f.create_group("data").attrs["heisd_version"] = "0.1.0"
    with h5py.File(tmp_path / "theirs.hdf5", "w") as f:
        f.create_group("data")
    (tmp_path / "text.hdf5").write_text("not hdf5")
    recognize = hdf5_with_attr("data", "heisd_version")
    assert recognize(tmp_path / "ours.hdf5")
    assert not recognize(tmp_path / "theirs.hdf5") and not recognize(tmp_path / "text.hdf5")
    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "made.json").write_text("[1, 2]")
    assert not json_with("made.json", "by")(tmp_path / "d") and has_file("made.json")(tmp_path / "d")


def _child(code: str, cwd: Path) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": SRC}
    return subprocess.Popen([sys.executable, "-c", textwrap.dedent(code)], cwd=cwd, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


HOLD_LOCK = """
    import time
    from heisd.storage import directory_lock
    with directory_lock("out", "test holder"):
        print("locked", flush=True)
        time.sleep(60)
"""


def test_lock_excludes_another_process_and_dies_with_it(tmp_path: Path) -> None:
    child = _child(HOLD_LOCK, tmp_path)
    try:
        assert child.stdout.readline().strip() == "locked"
        with pytest.raises(OutputError, match=rf"in use by another heisd process \(pid {child.pid}: test holder\)"):
            with directory_lock(tmp_path / "out"):
                pass
        start = time.monotonic()
        with pytest.raises(OutputError):
            with directory_lock(tmp_path / "out", wait_s=0.3):
                pass
        assert time.monotonic() - start >= 0.3
    finally:
        child.kill()  # SIGKILL: no cleanup code runs, the kernel drops the flock
        child.wait()
    with directory_lock(tmp_path / "out"):
        with directory_lock(tmp_path / "out"):  # re-entrant in one process
            assert (tmp_path / "out" / LOCK_FILE).read_text().startswith(f"pid {os.getpid()}")
    assert names(tmp_path / "out") == []  # released: the lock file goes with it


INTERRUPTED_WRITE = """
    import signal, sys, time
    from pathlib import Path
    from heisd.storage import atomic_directory, atomic_file, raise_on_sigterm
    # a shell starts background jobs (nohup, CI runners) with SIGINT ignored, and Python then keeps
    # it ignored: restore Ctrl-C's default, which is what this test is about
    signal.signal(signal.SIGINT, signal.default_int_handler)
    out = Path("out")
    try:
        with raise_on_sigterm():
            if sys.argv[1] == "directory":
                with atomic_directory(out / "store", replace=["old.npy"]) as tmp:
                    (tmp / "part.npy").write_bytes(b"x" * 1000)
                    print("writing", flush=True)
                    time.sleep(60)
            else:
                with atomic_file(out / "demos.hdf5") as tmp:
                    tmp.write_bytes(b"x" * 1000)
                    print("writing", flush=True)
                    time.sleep(60)
    except KeyboardInterrupt as err:
        sys.exit(128 + getattr(err, "signum", 2))
"""


@pytest.mark.parametrize("what", ["directory", "file"])
@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_an_interrupted_write_leaves_nothing_behind(tmp_path: Path, what: str, signum: int) -> None:
    (tmp_path / "out" / "store").mkdir(parents=True)
    (tmp_path / "out" / "store" / "old.npy").write_text("the previous datastore")
    (tmp_path / "out" / "demos.hdf5").write_text("the previous demos")
    env = {**os.environ, "PYTHONPATH": SRC}
    child = subprocess.Popen([sys.executable, "-c", textwrap.dedent(INTERRUPTED_WRITE), what], cwd=tmp_path,
                             env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert child.stdout.readline().strip() == "writing"
    child.send_signal(signum)
    assert child.wait(timeout=30) == 128 + signum
    assert names(tmp_path / "out") == ["demos.hdf5", "store"]  # no .tmp- / .old- siblings
    assert names(tmp_path / "out" / "store") == ["old.npy"]
    assert (tmp_path / "out" / "demos.hdf5").read_text() == "the previous demos"


def test_json_files_are_strict_json(tmp_path: Path) -> None:
    """NaN and Infinity are not JSON: an undefined number (a precision over no skipped frame) is null."""
    def refuse(literal: str):
        raise AssertionError(f"{literal} written")

    write_json(tmp_path / "m.json", {"precision": float("nan"), "rows": [1.5, float("inf"), {"x": -float("inf")}]})
    assert json.loads((tmp_path / "m.json").read_text(), parse_constant=refuse) == {
        "precision": None, "rows": [1.5, None, {"x": None}]}
    assert strict_json((0.25, float("nan"))) == "[0.25, null]"
