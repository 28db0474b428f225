"""Recording off the training path (runs/spool.py, runs/background.py): jobs run in order with
bounded memory, a failed background write surfaces on the caller's thread and as a one-line
error (exit 2), and the run stays complete-or-absent. Integrity without SHA-256 on the hot path,
and `--verify-files` for what fingerprints cannot see."""

from __future__ import annotations

import errno
import threading
import time

import numpy as np
import pytest

from gradalign.errors import BadInput
from gradalign.runs import writer as files
from gradalign.runs.background import BackgroundWriter
from gradalign.runs.spool import Spool
from gradalign.runs.tensorfile import TensorFile
from tests.conftest import SMALL, one_line_error


def test_spool_runs_jobs_in_order_and_raises_the_first_error_on_the_caller():
    spool, seen = Spool(), []
    spool.submit(lambda: seen.append(1))
    spool.submit(lambda: (_ for _ in ()).throw(OSError(errno.ENOSPC, "No space left")))
    spool.submit(lambda: seen.append(3))  # skipped: an earlier job failed
    with pytest.raises(OSError, match="No space"):
        spool.drain()
    with pytest.raises(OSError):
        spool.submit(lambda: None)
    spool.abort()
    assert seen == [1]


def test_spool_bounds_the_bytes_queued():
    spool, gate, held, peak = Spool(limit=100), threading.Event(), [0], [0]
    lock = threading.Lock()

    def job() -> None:
        gate.wait(5)
        with lock:
            held[0] -= 60

    def submit() -> None:
        for _ in range(4):
            with lock:
                held[0] += 60
                peak[0] = max(peak[0], held[0])
            spool.submit(job, 60)

    thread = threading.Thread(target=submit)
    thread.start()
    time.sleep(0.2)
    assert thread.is_alive(), "a second 60-byte job must wait while 60 of 100 bytes are queued"
    gate.set()
    thread.join(5)
    spool.close()
    assert peak[0] <= 120  # one job admitted beyond the limit at most, never all four


def test_abort_releases_what_queued_jobs_hold():
    spool, gate, released = Spool(), threading.Event(), []
    spool.submit(lambda: gate.wait(5), 1, lambda: released.append("running"))
    spool.submit(lambda: None, 1, lambda: released.append("queued"))
    gate.set()
    spool.abort()
    assert sorted(released) == ["queued", "running"]


def test_written_file_has_the_bytes_safetensors_writes(tmp_path):
    from safetensors.numpy import save

    tensors = {
        "b": np.arange(6, dtype=np.float32).reshape(2, 3),
        "a": np.array(7, dtype=np.int64),
        "c": np.zeros((0, 4), dtype=np.float64),
    }
    writer = files.RunWriter(tmp_path / "run")
    writer.write_tensors("weights/x.safetensors", tensors)
    ours = (writer.staging / "weights/x.safetensors").read_bytes()
    writer.abort()
    assert ours == save(tensors)
    path = tmp_path / "x.safetensors"
    path.write_bytes(ours)
    with TensorFile(path) as f:
        assert f.read("b", 2, 5).tolist() == [2.0, 3.0, 4.0]
        assert f.array("a").shape == ()


def test_a_failed_background_write_aborts_the_run(tmp_path, monkeypatch):
    def fail(path, data, durable=False):
        raise OSError(errno.ENOSPC, "No space left on device")

    background = BackgroundWriter(files.RunWriter(tmp_path / "run"))
    monkeypatch.setattr(files, "_write_atomic", fail)
    background.write("weights/init.safetensors", {"w": np.ones(3, np.float32)})
    with pytest.raises(BadInput, match=r"cannot write weights/init.safetensors \(No space left"):
        background.finish({}, dict)  # the run and the file named (a bare OSError named neither)
    assert not (tmp_path / "run").exists()
    assert [p.name for p in tmp_path.iterdir()] == []


def test_a_failed_background_write_is_a_one_line_error(cli, tmp_path, monkeypatch):
    real, calls = files._write_atomic, []

    def fail_later(path, data, durable=False):
        calls.append(path)
        if len(calls) == 3:  # a snapshot written on the background thread
            raise OSError(errno.ENOSPC, "No space left on device")
        return real(path, data, durable)

    monkeypatch.setattr(files, "_write_atomic", fail_later)
    out = tmp_path / "baseline"
    result = cli("baseline", "--out", out, "--reference", "none", "--updates", "3", "--hidden", "8")
    assert result.code == 2, result.err
    last = result.err.strip().splitlines()[-1]  # after the settings line recording prints
    assert last.startswith("error: ") and "No space" in last, result.err
    assert "Traceback" not in result.err
    assert not out.exists()


def test_verify_files_catches_what_fingerprints_cannot(cli, small_copy):
    """Two elements of one tensor swapped keep every fingerprint; the file's checksum does not."""
    snapshot = small_copy["merged"] / "weights" / "update_000001.safetensors"
    data = bytearray(snapshot.read_bytes())
    size = int.from_bytes(data[:8], "little")
    first = 8 + size  # the first tensor's first two float32 elements
    data[first : first + 4], data[first + 4 : first + 8] = (
        data[first + 4 : first + 8],
        data[first : first + 4],
    )
    assert data != snapshot.read_bytes()
    snapshot.write_bytes(bytes(data))
    plain = cli("compare", small_copy["baseline"], small_copy["merged"], "--reference", "none")
    assert plain.code in (0, 1), plain.err
    checked = cli(
        "compare",
        small_copy["baseline"],
        small_copy["merged"],
        "--verify-files",
        "--reference",
        "none",
    )
    one_line_error(checked, "update_000001.safetensors", "checksum")


def test_gradient_files_are_fingerprinted(cli, small_copy):
    grads = small_copy["merged"] / "grads" / "update_000002.safetensors"
    data = bytearray(grads.read_bytes())
    data[-3] ^= 0x01
    grads.write_bytes(bytes(data))
    result = cli("compare", small_copy["baseline"], small_copy["merged"])
    one_line_error(result, "grads/update_000002.safetensors", "checksum")
    assert SMALL.updates > 2
