"""What gradalign promises about your files: nothing lost, nothing executed.

Each test is a defect once reproduced by hand (a careless or hostile use), kept as a promise:
- outputs never touch inputs, and a refusal comes before any training;
- a run, a baseline with its reference, a verify set: replaced whole or not at all;
- one writer per path; what a killed writer left is cleaned up by the next one;
- no user file is ever deleted;
- no code named by a run's files is imported unless the user names it.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from gradalign import api, api_recording
from gradalign.runs import writer as run_writer
from gradalign.runs.locks import RunLock
from gradalign.runs.reader import read_run_dir

from .conftest import ROOT, one_line_error

SMALL_ARGS = ["--hidden", "16", "--updates", "3", "--batch-size", "16"]


def digest(folder: Path) -> dict[str, str]:
    """Every file under `folder` with its SHA-256: a directory's exact state."""
    return {
        str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(folder.rglob("*"))
        if p.is_file()
    }


@pytest.fixture
def verified(cli, tmp_path) -> Path:
    """A complete verify set (baseline, baseline-fp64, merged) of a small config."""
    out = tmp_path / "v"
    assert cli("verify", *SMALL_ARGS, "--out", out).code == 0
    return out


# -- outputs never touch inputs ------------------------------------------------------------------


def test_merged_against_a_baseline_never_writes_over_it(cli, verified):
    before = digest(verified)
    base = verified / "baseline"
    result = cli("merged", "--against", base, "--out", base)
    one_line_error(result, "would overwrite the input", "baseline")
    assert "--accum-steps 1" not in result.err  # the old, misleading message
    one_line_error(cli("merged", "--against", base, "--out", verified / "baseline-fp64"))
    assert digest(verified) == before


def test_run_grad_script_refuses_its_own_baseline_as_output(verified):
    before = digest(verified)
    base = verified / "baseline"
    done = subprocess.run(
        ["sh", str(ROOT / "run_grad.sh"), str(base), "--out", str(base)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 2, done.stderr
    assert "would overwrite the input" in done.stderr and "Traceback" not in done.stderr
    assert digest(verified) == before


@pytest.mark.parametrize("target", ["baseline/manifest.json", "merged", "baseline-fp64/x.json"])
def test_a_json_report_never_lands_on_or_inside_an_input(cli, verified, target):
    before = digest(verified)
    result = cli("compare", verified / "baseline", verified / "merged", "--json", verified / target)
    one_line_error(result)
    assert digest(verified) == before


def test_a_json_report_never_overwrites_an_input_log(cli, tmp_path):
    logs = tmp_path / "logs"
    shutil.copytree(ROOT / "fixtures" / "paddle", logs)
    before = digest(logs)
    result = cli(
        "compare", logs / "run.log", logs / "run_grad.log", "-k", "4", "--json", logs / "run.log"
    )
    one_line_error(result, "run.log")
    assert digest(logs) == before


def test_verify_checks_its_report_path_before_training(cli, tmp_path):
    folder = tmp_path / "adir"
    folder.mkdir()
    started = time.monotonic()
    one_line_error(cli("verify", "--out", tmp_path / "v", "--json", folder), "is a directory")
    one_line_error(cli("verify", "--out", tmp_path / "v", "--json", tmp_path / "v/baseline/r.json"))
    assert time.monotonic() - started < 10
    assert not (tmp_path / "v").exists()
    assert not list(tmp_path.glob("*.tmp")) and not list(folder.iterdir())


def test_merged_against_a_k4_run_fails_before_training(cli, verified, tmp_path):
    result = cli("merged", "--against", verified / "merged", "--out", tmp_path / "m")
    one_line_error(result, "K=4", "K=1 baseline")
    assert not (tmp_path / "m").exists()


# -- whole or not at all -------------------------------------------------------------------------


def test_rerecording_never_deletes_the_users_files(cli, verified):
    notes = verified / "merged" / "NOTES.md"
    notes.write_text("why this run matters")
    one_line_error(cli("verify", *SMALL_ARGS, "--out", verified), "NOTES.md", "not the run's")
    assert notes.read_text() == "why this run matters"
    assert is_complete(verified)


def is_complete(out: Path) -> bool:
    return all((out / name / "manifest.json").is_file() for name in SPLIT)


SPLIT = ("baseline", "baseline-fp64", "merged")


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
    assert "no partial run was left in place" in result.err
    assert digest(verified) == before
    assert not [p.name for p in verified.iterdir() if p.name.startswith(".")]
    assert api.compare(verified / "baseline", verified / "merged").verdict == "pass"


def test_a_set_whose_commit_was_cut_short_is_finished_before_anyone_reads_it(tmp_path, verified):
    """A kill between two of a set's swaps: the journal names the staged runs; the next reader
    puts them all in place, so the set is the new one whole, never a mix."""
    new = tmp_path / "new"
    api.verify({"hidden": 16, "updates": 3, "batch_size": 16, "optimizer": "adam"}, new)
    area = verified / ".set-999999"
    area.mkdir()
    for name in SPLIT:
        shutil.copytree(new / name, area / name)
    run_writer.swap_into_place(area / "baseline", verified / "baseline")  # then "killed"
    journal = verified / ".gradalign-commit-999999.json"
    journal.write_text('{"area": ".set-999999", "names": ["baseline", "baseline-fp64", "merged"]}')
    read_run_dir(verified / "merged")
    assert not journal.exists() and not area.exists()
    for name in SPLIT:
        assert digest(verified / name) == digest(new / name), name


def test_a_kill_between_two_renames_never_leaves_the_path_empty(tmp_path, verified, monkeypatch):
    """Where no atomic exchange exists, a run is replaced by two renames; a kill between them
    leaves the old run aside, and the next writer puts it back."""
    monkeypatch.setattr(run_writer, "_exchange", lambda a, b: False)
    target = verified / "merged"
    before = digest(target)
    staged = tmp_path / ".merged.partial-999999"
    shutil.copytree(target, staged)
    real_replace = os.replace
    calls = []

    def dies_on_second(src, dst):
        calls.append(src)
        if len(calls) == 2:
            raise SystemExit("killed")
        real_replace(src, dst)

    monkeypatch.setattr(run_writer.os, "replace", dies_on_second)
    with pytest.raises(SystemExit):
        run_writer.swap_into_place(staged, target)
    monkeypatch.setattr(run_writer.os, "replace", real_replace)
    assert not target.exists()  # what the kill left: the old run lies aside
    with RunLock(target):
        run_writer.clear_stale(target)
    assert digest(target) == before


def test_swap_replaces_a_run_in_one_step(tmp_path, verified):
    if run_writer._renameat2 is None:
        pytest.skip("no renameat2 here: the two-rename path is tested above")
    staged = tmp_path / "staged"
    shutil.copytree(verified / "baseline", staged)
    (verified / "merged" / "manifest.json").touch()
    run_writer.swap_into_place(staged, verified / "merged")
    assert digest(verified / "merged") == digest(verified / "baseline")
    assert not staged.exists()


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


def test_what_a_killed_writer_left_is_removed_by_the_next(cli, tmp_path):
    out = tmp_path / "v"
    for left in (".merged.partial-999999", ".baseline.old-999999", ".set-999999"):
        (out / left / "weights").mkdir(parents=True)
        (out / left / "weights" / "big.safetensors").write_bytes(b"\0" * 1000)
    assert cli("verify", *SMALL_ARGS, "--out", out).code == 0
    assert sorted(p.name for p in out.iterdir()) == list(SPLIT)


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


def test_reports_into_pipes_and_through_links_are_written_not_replaced(cli, small_runs, tmp_path):
    """A report path that is not a regular file (a pipe, /dev/stdout, /dev/null) is written into;
    a symbolic link to a file stays a link to the report. Replacing /dev/null as root would
    break the machine."""
    import threading

    base, merged = small_runs["baseline"], small_runs["merged"]
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    got: list[bytes] = []
    reader = threading.Thread(target=lambda: got.append(fifo.read_bytes()))
    reader.start()
    link = tmp_path / "link.json"
    link.symlink_to(tmp_path / "real.json")
    result = cli("compare", base, merged, "--json", fifo, "--junit", link)
    reader.join(timeout=30)
    assert result.code == 0, result.err
    assert fifo.is_fifo() and json.loads(got[0])["verdict"] == "pass"
    assert link.is_symlink() and (tmp_path / "real.json").read_text().startswith("<?xml")
    assert not list(tmp_path.glob(".gradalign-*.tmp"))


def test_two_reports_on_one_file_and_overlong_names_are_refused_before_work(
    cli, small_runs, tmp_path
):
    base, merged = small_runs["baseline"], small_runs["merged"]
    same = cli("compare", base, merged, "--json", tmp_path / "r", "--junit", tmp_path / "r")
    one_line_error(same, "are the same file")
    long = cli(
        "compare", base, merged, "--json", tmp_path / "a.json", "--junit", tmp_path / ("x" * 260)
    )
    one_line_error(long, "longer than 255 bytes")
    assert not (tmp_path / "a.json").exists()  # refused before any report was written


def test_a_named_reference_that_is_missing_is_a_note_and_a_corrupt_one_is_refused(cli, verified):
    """Gone, the reference leaves the fixed tolerances (a note says so); still there but
    unreadable, it is an error: a gate must not quietly judge by weaker bounds."""
    base, merged, ref = verified / "baseline", verified / "merged", verified / "baseline-fp64"
    (ref / "manifest.json").write_text("{not json")
    one_line_error(cli("compare", base, merged), "baseline-fp64", "manifest")
    shutil.rmtree(ref)
    gone = cli("compare", base, merged)
    assert gone.code == 0 and "which is missing" in gone.out


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
    assert "interrupted: no partial run was left in place" in err and "Traceback" not in err
    assert not [p.name for p in out.iterdir()] if out.exists() else True


def test_ctrl_c_while_reports_are_written_leaves_the_whole_set(
    cli, small_runs, tmp_path, monkeypatch
):
    """An interrupt between two report files is held until all are written, then exits 130:
    CI never finds a passing JUnit file beside a missing HTML one."""
    from gradalign.report import junit

    real = junit.write_junit

    def interrupted(comparison, path):
        real(comparison, path)
        os.kill(os.getpid(), signal.SIGINT)

    monkeypatch.setattr(junit, "write_junit", interrupted)
    names = {"--json": "r.json", "--junit": "r.xml", "--markdown": "r.md", "--html": "r.html"}
    args = [a for option, name in names.items() for a in (option, tmp_path / name)]
    result = cli("compare", small_runs["baseline"], small_runs["merged"], *args)
    assert result.code == 130, result.err
    assert all((tmp_path / name).is_file() for name in names.values())
