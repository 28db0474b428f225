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
from gradalign.runs import runset
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


def test_a_refused_compare_leaves_no_earlier_report_behind(cli, small_runs, tmp_path):
    """A CI workspace that keeps files: the JUnit file of an earlier passing compare showed a
    pass for a run refused later (exit 2). The refusal removes the reports it was asked to
    write, and says so; files that are no report are never touched."""
    out = tmp_path / "reports"
    reports = ["--json", out / "r.json", "--junit", out / "r.xml", "--markdown", out / "r.md"]
    passed = cli("compare", small_runs["baseline"], small_runs["merged"], *reports)
    assert passed.code == 0 and {p.name for p in out.iterdir()} == {"r.json", "r.xml", "r.md"}
    (out / "notes.json").write_text('{"verdict": "mine"}')  # a user's file, not a report
    refused = cli(
        "compare",
        small_runs["baseline"],
        tmp_path / "absent",
        *reports,
        "--html",
        out / "notes.json",
    )
    one_line_error(refused, "absent", "removed the earlier reports")
    assert sorted(p.name for p in out.iterdir()) == ["notes.json"]


def test_a_refused_compare_keeps_files_others_wrote_at_its_paths(
    cli, small_runs, tmp_path, monkeypatch
):
    """The job's step summary, which began with an earlier gate's report and holds another
    step's lines after it, was deleted whole; a user's own loss.png in the plot folder was
    deleted as a plot. Only what this tool wrote, by its own marks, is removed."""
    pytest.importorskip("matplotlib")
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib import pyplot

    summary, plots = tmp_path / "summary.md", tmp_path / "plots"
    monkeypatch.setenv("GITHUB_STEP_SUMMARY", str(summary))
    summary.write_text("")
    base, merged = small_runs["baseline"], small_runs["merged"]
    passed = cli("compare", base, merged, "--markdown", summary, "--plot", plots)
    assert passed.code == 0 and "gradalign: PASS" in summary.read_text()
    with summary.open("a") as handle:
        handle.write("## another tool's step\n")
    figure = pyplot.figure()
    figure.savefig(plots / "loss.png")  # the user's, over the tool's
    pyplot.close(figure)
    kept = {p: p.read_bytes() for p in (summary, plots / "loss.png")}
    refused = cli("compare", base, tmp_path / "absent", "--markdown", summary, "--plot", plots)
    one_line_error(refused, "absent", "removed the earlier reports")
    assert {p: p.read_bytes() for p in kept} == kept
    assert sorted(p.name for p in plots.iterdir()) == ["loss.png"]


def test_a_report_to_dev_stdout_appends_to_the_log_behind_it(small_runs, tmp_path):
    """`--json /dev/stdout >> ci.log`: the log was renamed over (its earlier lines lost, the
    shell writing on into the unlinked file); the report goes in at the descriptor's place."""
    log = tmp_path / "ci.log"
    log.write_text("an earlier step's line\n")
    command = [sys.executable, "-m", "gradalign", "compare", *small_runs.values()]
    with log.open("a") as out:
        done = subprocess.run([*command, "--json", "/dev/stdout"], stdout=out, cwd=tmp_path)
    assert done.returncode == 0
    text = log.read_text()
    assert text.startswith("an earlier step's line\n") and '"verdict": "pass"' in text


def test_a_report_to_stdout_is_all_stdout_carries(small_runs, tmp_path):
    """`--json /dev/stdout | jq`: the table was printed into the same stream, before the JSON,
    and no JSON reader could parse it; the table goes to stderr instead."""
    command = [sys.executable, "-m", "gradalign", "compare", *small_runs.values()]
    done = subprocess.run(
        [*command, "--json", "/dev/stdout"], capture_output=True, text=True, cwd=tmp_path
    )
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["verdict"] == "pass"
    assert "verdict: PASS" in done.stderr
    alone = subprocess.run(command, capture_output=True, text=True, cwd=tmp_path)
    assert "verdict: PASS" in alone.stdout  # without a report there, the table stays on stdout


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


def test_a_set_whose_commit_was_cut_short_is_finished_before_anyone_reads_it(
    cli, tmp_path, verified
):
    """A kill right after the first of a set's swaps: the next reader puts the whole new set in
    place (the replaced baseline, still beside it, is not swapped back), and a rerun works."""
    new = tmp_path / "new"
    api.verify({"hidden": 16, "updates": 3, "batch_size": 16, "optimizer": "adam"}, new)

    def stage(runs):
        for name in SPLIT:
            shutil.copytree(new / name, runs.path(name), dirs_exist_ok=True)

    assert commit_killed(verified, SPLIT, stage, step=3)  # after the first exchange
    read_run_dir(verified / "merged")
    assert sorted(p.name for p in verified.iterdir()) == list(SPLIT)
    for name in SPLIT:
        assert digest(verified / name) == digest(new / name), name
    assert api.compare(verified / "baseline", verified / "merged").verdict == "pass"
    assert cli("verify", *SMALL_ARGS, "--out", verified).code == 0


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


# -- a set's commit, killed at each of its steps, is finished whole by the next process ---------


def fake_run(path: Path, tag: str) -> None:
    """A directory the writer takes for a run (its manifest names the format), tagged `tag`."""
    files = {f"weights/update_{i:06d}.safetensors": "-" for i in range(4)}
    for rel in files:
        (path / rel).parent.mkdir(parents=True, exist_ok=True)
        (path / rel).write_text(f"{tag} {rel}")
    manifest = {"format": "gradalign-run", "files": files, "tag": tag}
    (path / "manifest.json").write_text(json.dumps(manifest))


def record_fake_set(parent: Path, names: tuple[str, ...], tag: str) -> None:
    runs = runset.RunSet(parent, list(names))
    for name in names:
        fake_run(runs.path(name), f"{tag}-{name}")
    runs.commit()


def fake_state(parent: Path, names: tuple[str, ...]) -> tuple[str | None, ...]:
    """Each member's tag where it is whole (every file as written), "PARTIAL" where not."""
    state = []
    for name in names:
        run = parent / name
        try:
            manifest = json.loads((run / "manifest.json").read_text())
            whole = all(
                (run / rel).read_text() == f"{manifest['tag']} {rel}" for rel in manifest["files"]
            )
        except FileNotFoundError:
            state.append(None if not run.exists() else "PARTIAL")
            continue
        state.append(manifest["tag"] if whole else "PARTIAL")
    return tuple(state)


def die_at(step: int) -> None:
    """From now on this (forked) process dies with no cleanup at all, as under SIGKILL, just
    before its `step`-th file-system change, or halfway through it if that deletes a tree (the
    manifest last, as may well happen). Between two changes the commit only reads, so dying
    after one is dying before the next."""
    count, busy = [0], [False]

    def halfway(path: Path) -> None:
        files = sorted((p for p in Path(path).rglob("*") if p.is_file()), reverse=True)
        for file in files[: len(files) // 2 + 1]:
            os.unlink(file)

    def wrap(owner: object, attr: str) -> None:
        real = getattr(owner, attr)

        def change(*args, **kwargs):
            if busy[0]:  # a step inside a step (the journal's rename): one step
                return real(*args, **kwargs)
            count[0] += 1
            if count[0] == step:
                if real is shutil.rmtree and os.path.isdir(args[0]):
                    halfway(args[0])
                os._exit(9)
            busy[0] = True
            try:
                return real(*args, **kwargs)
            finally:
                busy[0] = False

        setattr(owner, attr, change)

    for owner, attr in [
        (os, "rename"),
        (os, "replace"),
        (shutil, "rmtree"),
        (Path, "unlink"),
        (runset, "_exchange"),
        (runset, "_write_atomic"),
    ]:
        wrap(owner, attr)


def commit_killed(parent: Path, names, stage, step: int) -> bool:
    """Record a set over `parent` in a child process, `stage(runs)` filling its members, that
    dies at `step` of its commit (`die_at`); True if it died, False if it finished first."""
    child = os.fork()
    if child == 0:
        code = 0
        try:
            runs = runset.RunSet(parent, list(names))
            stage(runs)
            die_at(step)
            runs.commit()
        except BaseException:
            code = 3
        os._exit(code)
    code = os.waitstatus_to_exitcode(os.waitpid(child, 0)[1])
    assert code in (0, 9), code
    return code == 9


@pytest.mark.skipif(not hasattr(os, "fork"), reason="kills a forked child")
@pytest.mark.parametrize("exchange", [True, False], ids=["exchange", "two-renames"])
@pytest.mark.parametrize("earlier", [SPLIT, ("baseline", "merged")], ids=["over-set", "new-member"])
def test_a_set_killed_at_any_step_of_its_commit_is_old_or_new_whole(
    tmp_path, monkeypatch, exchange, earlier
):
    """Kill the commit at each of its renames, exchanges, journal writes and deletions (a
    deletion halfway): the next process leaves each member the old run whole or the new one
    whole, all members alike, nothing of the commit behind it; and a rerun works."""
    if exchange and run_writer._renameat2 is None:
        pytest.skip("no renameat2 here")
    if not exchange:
        monkeypatch.setattr(runset, "_exchange", lambda a, b: False)
    old = tuple(f"old-{n}" if n in earlier else None for n in SPLIT)
    new = tuple(f"new-{n}" for n in SPLIT)

    def stage(runs):
        for name in SPLIT:
            fake_run(runs.path(name), f"new-{name}")

    monkeypatch.setattr(os, "fsync", lambda fd: None)  # durability is not what is tested here
    outcomes = set()
    for step in range(1, 100):
        parent = tmp_path / str(step)
        record_fake_set(parent, earlier, "old")
        died = commit_killed(parent, SPLIT, stage, step)
        runset.recover_commits(parent)
        state = fake_state(parent, SPLIT)
        assert state in (old, new), (step, state)
        assert not list(parent.glob(".gradalign-commit-*")), step
        outcomes.add(state)
        record_fake_set(parent, SPLIT, "again")
        assert fake_state(parent, SPLIT) == tuple(f"again-{n}" for n in SPLIT)
        assert sorted(p.name for p in parent.iterdir()) == sorted(SPLIT), step
        if not died:
            break
    assert step > 8 and outcomes == {old, new}  # every step was reached, both ends seen


SOME = {"inode": 1, "manifest": "0" * 64}
WELL_FORMED = {"merged": SOME}


@pytest.mark.parametrize(
    ("journal", "marked"),
    [
        ({"names": [], "area": "precious"}, False),  # as fuzzed: a sibling deleted
        ({"names": [], "area": "."}, False),  # the whole parent deleted
        ({"names": ["precious"], "area": ".set-999999"}, True),  # another version's journal
        ({"version": 2, "area": "precious", "phase": "done", "members": WELL_FORMED}, False),
        ({"version": 2, "area": ".", "phase": "done", "members": WELL_FORMED}, False),
        ({"version": 2, "area": ".set-999998", "phase": "done", "members": WELL_FORMED}, True),
        ({"version": 2, "area": ".set-999999", "phase": "done", "members": WELL_FORMED}, False),
        ({"version": 2, "area": ".set-999999", "phase": "swap", "members": {"..": SOME}}, True),
        ({"version": 2, "area": ".set-999999", "phase": "swap", "members": {"a/b": SOME}}, True),
    ],
)
def test_a_stale_or_hostile_journal_deletes_nothing(cli, small_copy, journal, marked):
    """Reading runs beside a journal gradalign did not write (or another version did) moves and
    deletes nothing: not a sibling, not the parent, not a `.set-*` directory it did not mark, not
    through a member name that is not a plain one."""
    parent = small_copy["baseline"].parent
    (parent / "precious").mkdir()
    (parent / "precious" / "keep.txt").write_text("data")
    for area in (".set-999999", ".set-999998"):
        (parent / area / "new" / "merged").mkdir(parents=True)
        (parent / area / "mine.txt").write_text("not gradalign's")
        if marked:
            (parent / area / runset.AREA_MARKER).write_bytes(runset._MARKER_TEXT)
    (parent / ".gradalign-commit-999999.json").write_text(json.dumps(journal))
    before = digest(parent)
    assert cli("compare", small_copy["baseline"], small_copy["merged"]).code == 0
    assert digest(parent) == before


def test_a_journal_that_cannot_be_finished_changes_nothing(cli, small_copy):
    """A well-formed journal whose member path now holds the user's own directory: refused in
    one line, the directory and the staged run left as they are."""
    parent = small_copy["baseline"].parent
    (parent / "precious").mkdir()
    (parent / "precious" / "keep.txt").write_text("data")
    area = parent / ".set-999999"
    (area / "new").mkdir(parents=True)
    (area / runset.AREA_MARKER).write_bytes(runset._MARKER_TEXT)
    shutil.copytree(small_copy["merged"], area / "new" / "precious")
    inode, sha = runset._identity(area / "new" / "precious")
    members = {"precious": {"inode": inode, "manifest": sha}}
    journal = {"version": 2, "area": area.name, "phase": "swap", "members": members}
    (parent / ".gradalign-commit-999999.json").write_text(json.dumps(journal))
    before = digest(parent)
    result = cli("compare", small_copy["baseline"], small_copy["merged"])
    one_line_error(result, "cannot be finished", "precious", "nothing was changed")
    assert digest(parent) == before


def test_a_writer_clears_only_the_areas_gradalign_marked(tmp_path):
    """A killed writer's area (marked) goes; a user's directory named like one stays."""
    parent = tmp_path / "runs"
    dead, users = parent / ".set-999999", parent / ".set-999998"
    for area in (dead, users):
        (area / "new" / "merged").mkdir(parents=True)
        (area / "new" / "merged" / "data.bin").write_bytes(b"\0" * 100)
    (dead / runset.AREA_MARKER).write_bytes(runset._MARKER_TEXT)
    record_fake_set(parent, ("merged",), "new")
    assert sorted(p.name for p in parent.iterdir()) == [".set-999998", "merged"]
    assert (users / "new" / "merged" / "data.bin").stat().st_size == 100


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
