"""A write the system refuses (a full disk, a file-size limit) ends a command with one line naming
the output, exit code 1 (not a crash), and nothing left behind: no hidden temporaries, no partial
output, no folder the command made.

A full disk without root: the commands run in a child process under RLIMIT_FSIZE with SIGXFSZ
ignored, so a write past the limit fails with EFBIG exactly where a full disk fails with ENOSPC.
Units write to /dev/full (ENOSPC).
"""

from __future__ import annotations

import errno
import os
import re
import resource
import signal
import subprocess
import sys
from pathlib import Path

import h5py
import numpy as np
import pytest
import torch
from helpers import tiny_vla, write_demo_file

from heisd.cli import main
from heisd.errors import WriteError
from heisd.storage import atomic_directory, atomic_file, write_json
from heisd.storage.failures import naming_failures
from heisd.storage.hdf5 import HDF5Output

SRC = str(Path(__file__).resolve().parents[1] / "src")
LIMIT = 20_000  # bytes per file: the metadata of a file fits, no output of these commands does
TOO_LARGE = "File too large; the file system or a file-size limit (ulimit -f) allows no larger file"
BAR = re.compile(r"^[\w-]+:\s+\d+%\|")  # a tqdm progress line
TRAIN = ["--steps", "4", "--batch-size", "4", "--threads", "1", "--eval-every", "2", "--save-every", "2",
         "--hidden-size", "32", "--layers", "1", "--image-size", "16", "--vision-channels", "8,16"]


def _limited() -> None:
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # else the kernel kills the writer instead of failing the write
    resource.setrlimit(resource.RLIMIT_FSIZE, (LIMIT, LIMIT))


def heisd_limited(*argv: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": SRC, "PYTHONWARNINGS": "ignore", "MUJOCO_GL": "egl"}
    # pipes, not files: the limit would cut stderr itself short
    return subprocess.run([sys.executable, "-m", "heisd.cli", *argv], env=env, capture_output=True, text=True,
                          preexec_fn=_limited, timeout=300)


def assert_one_line(done: subprocess.CompletedProcess, command: str, path: Path) -> None:
    assert done.returncode == 1, (done.returncode, done.stderr[-3000:])  # a signal (a crash) is negative
    lines = [ln.strip() for ln in re.split(r"[\r\n]", done.stderr) if ln.strip() and not BAR.match(ln.strip())]
    assert lines == [f"heisd {command}: error: cannot write {path}: {TOO_LARGE}: choose another output path"], \
        done.stderr[-3000:]


def leftovers(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*"))


@pytest.fixture(scope="module")
def inputs(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("inputs")
    tiny_vla().save_pretrained(root / "vla")
    write_demo_file(root / "demos.hdf5", ["reach-v3", "push-v3"], episodes=2, steps=20)
    return root


def test_demos_on_a_full_disk_stop_with_one_line_and_leave_nothing(tmp_path) -> None:
    out = tmp_path / "made" / "demos.hdf5"
    done = heisd_limited("demos", "--tasks", "reach-v3", "--episodes", "1", "--image-size", "32",
                         "--max-steps", "100", "--out", str(out))
    assert_one_line(done, "demos", out)
    assert leftovers(tmp_path) == []  # neither the temporary nor the folder the command made


def test_build_datastore_on_a_full_disk(inputs, tmp_path) -> None:
    out = tmp_path / "store"
    done = heisd_limited("build-datastore", "--target", str(inputs / "vla"), "--demos", str(inputs / "demos.hdf5"),
                         "--out", str(out), "--threads", "1")
    assert_one_line(done, "build-datastore", out)
    assert leftovers(tmp_path) == []


def test_train_vla_on_a_full_disk(inputs, tmp_path) -> None:
    out = tmp_path / "run"
    done = heisd_limited("train-vla", "--demos", str(inputs / "demos.hdf5"), "--out", str(out), *TRAIN)
    assert_one_line(done, "train-vla", out)
    assert leftovers(tmp_path) == []  # no log of a run without a checkpoint, no folder


def test_a_refused_train_vla_run_leaves_no_folder_it_made(tmp_path, capsys) -> None:
    write_demo_file(tmp_path / "bad.hdf5", ["reach-v3"], episodes=2, steps=20)
    with h5py.File(tmp_path / "bad.hdf5", "a") as f:
        f["data/demo_1/actions"][3, 0] = np.nan
    assert main(["train-vla", "--demos", str(tmp_path / "bad.hdf5"), "--out", str(tmp_path / "new" / "run"),
                 *TRAIN]) == 1
    assert "data/demo_1 has non-finite actions" in capsys.readouterr().err
    assert leftovers(tmp_path) == ["bad.hdf5"]
    (tmp_path / "mine").mkdir()  # a folder that was there before stays
    assert main(["train-vla", "--demos", str(tmp_path / "bad.hdf5"), "--out", str(tmp_path / "mine"), *TRAIN]) == 1
    assert leftovers(tmp_path) == ["bad.hdf5", "mine"]


def test_hdf5_output_survives_a_refused_write_and_reports_it() -> None:
    """/dev/full refuses every write; HDF5 still reads back what it wrote (more than its chunk
    cache holds, so through the file), and the error comes from check() and from closing, in this
    process: no crash."""
    frames = np.random.default_rng(0).integers(0, 256, (100, 64, 64, 3), dtype=np.uint8)  # 1.2 MB
    with pytest.raises(OSError) as err:
        with HDF5Output(Path("/dev/full")) as h5:
            h5.file.create_dataset("data/demo_0/frames", data=frames, compression="lzf", chunks=(1, 64, 64, 3))
            h5.file.flush()
            assert np.array_equal(h5.file["data/demo_0/frames"][()], frames)
            h5.check()
    assert err.value.errno == errno.ENOSPC
    with pytest.raises(OSError) as err:
        with HDF5Output(Path("/dev/full")) as h5:
            h5.file.attrs["only"] = "metadata"  # written when the file closes
    assert err.value.errno == errno.ENOSPC


def test_each_library_s_report_of_a_full_disk_names_the_output(tmp_path) -> None:
    """(safetensors' "(os error N)" is covered by train-vla above: never point it at /dev/full, it
    replaces the file it writes, and a root test run would replace the device.)"""
    out = tmp_path / "out.bin"

    def torch_save() -> None:
        with open("/dev/full", "wb") as f:  # torch's RuntimeError carries the OSError as its context
            torch.save({"w": torch.zeros(100_000)}, f)

    writes = {
        "python": lambda: Path("/dev/full").write_bytes(b"x" * 100_000),
        "torch": torch_save,
    }
    for name, write in writes.items():
        with pytest.raises(WriteError) as err:
            with naming_failures(out):
                write()
        assert str(err.value) == f"cannot write {out}: No space left on device; free space or choose another " \
                                 "output path", name
    with pytest.raises(FileNotFoundError):  # an input the block reads is not the output
        with naming_failures(out):
            (tmp_path / "missing.json").read_text()


def test_atomic_writers_name_the_final_path_and_leave_nothing(tmp_path) -> None:
    full = Path("/dev/full")
    with pytest.raises(WriteError, match=re.escape(f"cannot write {tmp_path}/a/b/x.json: No space left on device")):
        with atomic_file(tmp_path / "a" / "b" / "x.json") as tmp:
            tmp.write_text("{}")
            full.write_text("x" * 10_000)
    with pytest.raises(WriteError, match=re.escape(f"cannot write {tmp_path}/store/manifest.json: No space")):
        with atomic_directory(tmp_path / "store") as tmp:
            write_json(tmp / "keys.json", [1, 2])
            with atomic_file(tmp / "manifest.json"):  # nested: named where it would have landed
                full.write_text("x" * 10_000)
    assert leftovers(tmp_path) == []


def test_append_is_a_whole_line_or_nothing(tmp_path) -> None:
    """Past the file-size limit an append is cut back to where it started (a child process: the
    limit is per process)."""
    log = tmp_path / "episodes.jsonl"
    log.write_text("x" * (LIMIT - 10) + "\n")
    code = ("import sys; from heisd.storage import append_text\n"
            "try:\n    append_text(sys.argv[1], '{\"episode\": 1, \"success\": true}\\n', sync=True)\n"
            "except Exception as e:\n    print(e)")
    done = subprocess.run([sys.executable, "-c", code, str(log)], env={**os.environ, "PYTHONPATH": SRC},
                          capture_output=True, text=True, preexec_fn=_limited, timeout=60)
    assert done.stdout.startswith(f"cannot write {log}: File too large"), done.stdout + done.stderr
    assert log.stat().st_size == LIMIT - 9
