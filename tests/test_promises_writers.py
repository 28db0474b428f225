"""What gradalign promises while it writes: nothing lost, nothing executed.

Each test is a defect once reproduced by hand (a careless or hostile use), kept as a promise:
- no user file is ever deleted, and an interrupted writer (Ctrl-C, SIGTERM) keeps the earlier
  set and leaves nothing half-written;
- one writer per path; what a killed writer left is cleaned up by the next one;
- no code named by a run's files is imported unless the user names it.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

from gradalign import api, api_recording
from gradalign.runs import runset

from . import file_promises
from .conftest import one_line_error
from .file_promises import SMALL_ARGS, SPLIT, digest

verified = file_promises.verified  # the fixture, shared


# -- no user file deleted; an interrupted writer keeps the earlier set ----------------------------


def test_rerecording_never_deletes_the_users_files(cli, verified):
    notes = verified / "merged" / "NOTES.md"
    notes.write_text("why this run matters")
    one_line_error(cli("verify", *SMALL_ARGS, "--out", verified), "NOTES.md", "not the run's")
    assert notes.read_text() == "why this run matters"
    assert is_complete(verified)


def is_complete(out: Path) -> bool:
    return all((out / name / "manifest.json").is_file() for name in SPLIT)


def test_an_interrupted_verify_keeps_the_earlier_set_intact(cli, verified, monkeypatch):
    """Ctrl-C after the float64 reference (and the baseline) finished: the earlier set stays
    exactly as it was, nothing half-written is left, and the message says so truthfully."""
    before = digest(verified)
    real = api_recording.train_into

    def interrupted(config, where, shown, label, *args, **kwargs):
        if label == "merged":
            raise KeyboardInterrupt
        return real(config, where, shown, label, *args, **kwargs)

    monkeypatch.setattr(api_recording, "train_into", interrupted)
    result = cli("verify", *SMALL_ARGS, "--optimizer", "adam", "--out", verified)
    assert result.code == 130
    assert "nothing half-written was left in place" in result.err
    assert digest(verified) == before
    assert not [p.name for p in verified.iterdir() if p.name.startswith(".")]
    assert api.compare(verified / "baseline", verified / "merged").verdict == "pass"


def test_sigterm_cleans_up_as_ctrl_c_does(tmp_path):
    """A cancelled CI job, `timeout` or `docker stop` sends SIGTERM: exit 143, one line, and
    no staging directory or lock left behind (a real process, killed mid-training)."""
    out = tmp_path / "v"
    proc = subprocess.Popen(
        [sys.executable, "-m", "gradalign", "verify", "--updates", "400", "--out", str(out)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline = time.monotonic() + 60
    while not any(out.glob(".*")) and time.monotonic() < deadline:
        time.sleep(0.05)  # until it has started writing
    time.sleep(0.5)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 143, err
    assert "interrupted: nothing half-written was left in place" in err and "Traceback" not in err
    assert not [p.name for p in out.iterdir()] if out.exists() else True


# -- one writer at a time; the next writer cleans up after a killed one ---------------------------


HOLD = """
import sys, time
from gradalign.runs.locks import RunLock
RunLock(sys.argv[1]).acquire()
print("held", flush=True)
time.sleep(120)
"""


def test_two_writers_of_one_path_never_run_at_once(cli, tmp_path):
    out = tmp_path / "v"
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLD, str(out / "merged")], stdout=subprocess.PIPE, text=True
    )
    try:
        assert holder.stdout.readline().strip() == "held"
        result = cli("verify", *SMALL_ARGS, "--out", out)
        one_line_error(result, "being written by another gradalign process", str(holder.pid))
        assert not (out / "baseline").exists()
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait()
    assert cli("verify", *SMALL_ARGS, "--out", out).code == 0  # a dead holder's lock is stale


def test_a_lock_path_holding_a_link_a_folder_or_a_pipe_is_refused_never_written_through(
    cli, tmp_path, small_runs
):
    """A link at the lock's path (`.NAME.lock`, committed beside a golden file) had the file it
    named overwritten with a pid; a folder or a pipe there was an internal error (exit 3)."""
    import os

    precious = tmp_path / "precious.txt"
    precious.write_text("the user's data\n")
    lock = tmp_path / ".b.lock"
    lock.symlink_to(precious)
    one_line_error(cli("baseline", *SMALL_ARGS, "-o", tmp_path / "b"), "not a lock file")
    assert precious.read_text() == "the user's data\n" and lock.is_symlink()
    golden = tmp_path / "g.json"
    (tmp_path / ".g.json.lock").symlink_to(precious)
    update = cli("golden", "check", golden, small_runs["merged"], "--update")
    one_line_error(update, "not a lock file")
    assert precious.read_text() == "the user's data\n" and not golden.exists()
    lock.unlink()
    lock.mkdir()
    one_line_error(cli("baseline", *SMALL_ARGS, "-o", tmp_path / "b"), "not a lock file")
    lock.rmdir()
    os.mkfifo(lock)
    one_line_error(cli("baseline", *SMALL_ARGS, "-o", tmp_path / "b"), "not a lock file")
    lock.unlink()
    assert cli("baseline", *SMALL_ARGS, "-o", tmp_path / "b").code == 0
    assert not lock.exists()


def test_a_run_path_that_is_a_link_is_refused_saying_so(cli, tmp_path, small_runs):
    """`baseline -o L`, L a link to a run, was refused as "L exists and is not a gradalign run";
    the run it names is left as it was."""
    link = tmp_path / "latest"
    link.symlink_to(small_runs["baseline"])
    before = digest(small_runs["baseline"])
    one_line_error(cli("baseline", *SMALL_ARGS, "-o", link), "is a symbolic link", "never through")
    assert link.is_symlink() and digest(small_runs["baseline"]) == before


def test_a_report_through_a_link_into_a_missing_folder_is_refused(cli, small_runs, tmp_path):
    """A link to a path whose folders do not exist had them made (a path escape: a repository's
    committed link wrote anywhere the job could); a link to a file in a folder that exists is
    written through, as before."""
    away = tmp_path / "away"
    link = tmp_path / "r.json"
    link.symlink_to(away / "made" / "by" / "r.json")
    one_line_error(cli("compare", *small_runs.values(), "--json", link), "a folder that does not")
    golden = tmp_path / "g.json"
    golden.symlink_to(away / "g.json")
    one_line_error(cli("golden", "write", small_runs["baseline"], "--out", golden), "does not")
    assert not away.exists()
    away.mkdir()
    assert cli("compare", *small_runs.values(), "--json", link.parent / "r2.json").code == 0
    golden.unlink()
    golden.symlink_to(away / "g.json")
    assert cli("golden", "write", small_runs["baseline"], "--out", golden).code == 0
    assert (away / "g.json").is_file()


def test_what_a_killed_writer_left_is_removed_by_the_next(cli, tmp_path):
    out = tmp_path / "v"
    for left in (".merged.partial-999999", ".baseline.old-999999", ".set-999999"):
        (out / left / "weights").mkdir(parents=True)
        (out / left / "weights" / "big.safetensors").write_bytes(b"\0" * 1000)
    (out / ".set-999999" / runset.AREA_MARKER).write_bytes(runset._MARKER_TEXT)
    assert cli("verify", *SMALL_ARGS, "--out", out).code == 0
    assert sorted(p.name for p in out.iterdir()) == list(SPLIT)


def test_report_temporaries_a_killed_compare_left_are_removed_by_the_next(tmp_path):
    """A compare killed while it wrote its reports left `.gradalign-PID-N.tmp` files beside
    them, which no later command removed. A dead writer's are removed, a live one's kept."""
    import os

    from gradalign.report.output import write_text_atomic

    dead, live = tmp_path / ".gradalign-999999-0.tmp", tmp_path / f".gradalign-{os.getppid()}-0.tmp"
    for left in (dead, live):
        left.write_text("{half a report")
    other = tmp_path / ".gradalign-notes.tmp"  # not a temporary of ours: never touched
    other.write_text("x")
    write_text_atomic(tmp_path / "report.json", "{}")
    assert (tmp_path / "report.json").read_text() == "{}"
    assert not dead.exists() and live.exists() and other.exists()


# -- nothing executed ----------------------------------------------------------------------------


MODEL = """
from pathlib import Path
import torch
Path(__file__).with_name("IMPORTED").write_text("this module was imported")

def make_model():
    return torch.nn.Sequential(torch.nn.Linear(784, 8), torch.nn.ReLU(), torch.nn.Linear(8, 10))
"""


def test_a_baseline_never_runs_the_code_its_manifest_names(cli, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "mynet.py").write_text(MODEL)
    base_args = ["--updates", "2", "--batch-size", "8", "--model", "mynet.py:make_model"]
    assert cli("baseline", *base_args, "--reference", "none", "--out", "base").code == 0
    (tmp_path / "IMPORTED").unlink()
    result = cli("merged", "--against", "base", "--out", "m")
    one_line_error(result, "does not import code a run names", "--model mynet.py:make_model")
    assert not (tmp_path / "IMPORTED").exists() and not (tmp_path / "m").exists()
    named = cli("merged", "--against", "base", "--out", "m", "--model", "mynet.py:make_model")
    assert named.code == 0, named.err
    assert (tmp_path / "IMPORTED").exists()
    trusted = cli("merged", "--against", "base", "--out", "m2", "--trust-run-code")
    assert trusted.code == 0, trusted.err
    assert "--trust-run-code: imported the code" in trusted.out


def test_a_lock_in_a_folder_that_cannot_be_written_says_so(cli, tmp_path, small_runs, monkeypatch):
    """A golden folder the job may not write in (another user's checkout) was refused as "the
    lock ... is not a lock file this tool made (a link, a folder or a pipe)"; the folder's
    permission is the cause. (As root every folder is writable: the refusal is simulated.)"""
    import errno
    import os

    from gradalign.runs import locks

    real_open = os.open

    def denied(path, flags, *args):
        if str(path).endswith(".lock"):
            raise PermissionError(errno.EACCES, "Permission denied", str(path))
        return real_open(path, flags, *args)

    monkeypatch.setattr(locks.os, "open", denied)
    golden = tmp_path / "ci" / "g.json"
    result = cli("golden", "check", golden, small_runs["merged"], "--update")
    one_line_error(result, f"cannot write in {golden.parent} (Permission denied)")
    assert "not a lock file" not in result.err and not golden.exists()


def test_a_golden_file_refused_as_an_output_is_called_a_golden_file(cli, tmp_path, small_runs):
    """`golden write` to a path it may not write was refused as a "report"."""
    link = tmp_path / "g.json"
    link.symlink_to(tmp_path / "missing" / "g.json")
    result = cli("golden", "write", small_runs["baseline"], "--out", link)
    one_line_error(result, f"golden file {link} is a link to")
