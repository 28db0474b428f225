"""What gradalign promises about the files it writes: nothing lost, no input touched.

Each test is a defect once reproduced by hand (a careless or hostile use), kept as a promise:
- outputs never touch inputs, and a refusal comes before any training;
- a report lands where it is asked for, whole: into a pipe or through a link without replacing
  it, never beside an earlier report of another verdict, never half a set when interrupted;
- a reference named by a run and gone is said, one still there but unreadable is refused.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time

import pytest

from . import file_promises
from .conftest import ROOT, one_line_error
from .file_promises import digest

verified = file_promises.verified  # the fixture, shared


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
    pass for a run refused later (exit 2). A refusal of one report path removes the reports
    it was asked to write, and says so; files that are no report are never touched."""
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
    one_line_error(refused, "notes.json: exists and is not a gradalign report", "removed the")
    assert sorted(p.name for p in out.iterdir()) == ["notes.json"]
    assert (out / "notes.json").read_text() == '{"verdict": "mine"}'


def test_a_refused_compare_keeps_files_others_wrote_at_its_paths(
    cli, small_runs, tmp_path, monkeypatch
):
    """The job's step summary, which began with an earlier gate's report and holds another
    step's lines after it, was deleted whole; a user's own loss.png in the plot folder was
    deleted as a plot (it is now refused before any work: a report replaces only an earlier
    report). Only what this tool wrote, by its own marks, is removed."""
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
    one_line_error(refused, "loss.png: exists and is not a gradalign report", "removed the earl")
    assert {p: p.read_bytes() for p in kept} == kept
    assert sorted(p.name for p in plots.iterdir()) == ["loss.png"]


@pytest.mark.parametrize("option", ["--json", "--junit", "--markdown", "--html"])
def test_a_report_never_replaces_a_file_that_is_not_a_report(cli, small_runs, tmp_path, option):
    """`--json g.json` replaced a golden file, `--junit nets.py` a source file, as `-o` would
    not: a report replaces an earlier report (or an empty file), nothing else, also through a
    link."""
    base, merged = small_runs["baseline"], small_runs["merged"]
    mine = tmp_path / "mine.txt"
    mine.write_text('{"golden": "a user\'s file"}\n')
    link = tmp_path / "link"
    link.symlink_to(mine)
    for target in (mine, link):
        one_line_error(cli("compare", base, merged, option, target), "is not a gradalign report")
        assert mine.read_text() == '{"golden": "a user\'s file"}\n'
    report, empty = tmp_path / "report", tmp_path / "empty"
    empty.write_text("")
    for target in (report, report, empty):  # written, then replaced; an empty file taken
        assert cli("compare", base, merged, option, target).code == 0
        assert target.stat().st_size > 0


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


# -- reports are written whole, where asked -------------------------------------------------------


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


def test_ctrl_c_while_reports_are_written_leaves_the_whole_set(
    cli, small_runs, tmp_path, monkeypatch
):
    """An interrupt between two report files is held until all are written, then exits 130:
    CI never finds a passing JUnit file beside a missing HTML one. Its last line says they were
    written whole (it said "nothing half-written was left in place", read as none written)."""
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
    assert result.err.strip().splitlines()[-1] == (
        "interrupted after its 4 report file(s) were written whole"
    )


# -- a reference: gone is said, unreadable is refused ---------------------------------------------


def test_a_named_reference_that_is_missing_is_a_note_and_a_corrupt_one_is_refused(cli, verified):
    """Gone, the reference leaves the fixed tolerances (a note says so); still there but
    unreadable, it is an error: a gate must not quietly judge by weaker bounds."""
    base, merged, ref = verified / "baseline", verified / "merged", verified / "baseline-fp64"
    (ref / "manifest.json").write_text("{not json")
    one_line_error(cli("compare", base, merged), "baseline-fp64", "manifest")
    shutil.rmtree(ref)
    ref.symlink_to(ref.name)  # a link to itself: there, and no run; it was "missing"
    one_line_error(cli("compare", base, merged), "baseline-fp64", "a link that leads to no run")
    ref.unlink()
    gone = cli("compare", base, merged)
    assert gone.code == 0 and "which is missing" in gone.out


def test_reports_of_other_kinds_never_land_on_the_step_summary_or_a_look_alike(
    cli, small_runs, tmp_path, monkeypatch
):
    """`--json $GITHUB_STEP_SUMMARY` replaced the job's summary (only the Markdown report is
    appended to it); a user's `# Notes on gradalign: PASS criteria` and a JSON of their own with
    `verdict`/`checks`/`diagnosis` keys were taken for reports and replaced."""
    base, merged = small_runs["baseline"], small_runs["merged"]
    summary = tmp_path / "summary.md"
    summary.write_text("## an earlier step\n")
    monkeypatch.setenv("GITHUB_STEP_SUMMARY", str(summary))
    for option in ("--json", "--junit", "--html"):
        one_line_error(cli("compare", base, merged, option, summary), "is not a gradalign report")
    assert summary.read_text() == "## an earlier step\n"
    assert cli("compare", base, merged, "--markdown", summary).code == 0
    assert summary.read_text().startswith("## an earlier step\n") and "gradalign: PASS" in (
        summary.read_text()
    )
    notes, triage = tmp_path / "notes.md", tmp_path / "triage.json"
    notes.write_text("# Notes on gradalign: PASS criteria\n\nmine\n")
    triage.write_text('{"verdict": "mine", "checks": [], "diagnosis": []}')
    one_line_error(cli("compare", base, merged, "--markdown", notes), "not a gradalign report")
    one_line_error(cli("compare", base, merged, "--json", triage), "not a gradalign report")
    assert notes.read_text().endswith("mine\n") and triage.read_text().startswith('{"verdict"')


def test_an_earlier_report_behind_a_link_is_replaced_on_a_refusal(cli, small_runs, tmp_path):
    """A report written through a link stayed after a refused command (the cleanup skipped
    links), showing the earlier run's pass: the file behind the link now says the error, and
    an earlier HTML report behind one is removed."""
    (tmp_path / "ci").mkdir()
    link, page = tmp_path / "junit.xml", tmp_path / "page.html"
    link.symlink_to(tmp_path / "ci" / "last.xml")
    page.symlink_to(tmp_path / "ci" / "last.html")
    reports = ("--junit", link, "--html", page)
    assert cli("compare", small_runs["baseline"], small_runs["merged"], *reports).code == 0
    assert "<failure" not in (tmp_path / "ci" / "last.xml").read_text()
    refused = cli("compare", small_runs["baseline"], tmp_path / "absent", *reports)
    one_line_error(refused, "absent", "removed the earlier report")
    assert link.is_symlink() and '<error message="' in (tmp_path / "ci" / "last.xml").read_text()
    assert not (tmp_path / "ci" / "last.html").exists()


def test_selftest_json_never_replaces_a_users_file(cli, tmp_path):
    """`selftest --json` went around the report checks and replaced any file."""
    precious = tmp_path / "precious.json"
    precious.write_text('{"format": "gradalign-golden", "mine": true}')
    started = time.monotonic()
    one_line_error(cli("selftest", "-o", tmp_path / "st", "--json", precious), "not a gradalign")
    assert time.monotonic() - started < 30  # refused before any case ran
    assert precious.read_text() == '{"format": "gradalign-golden", "mine": true}'
    earlier = tmp_path / "s.json"  # an earlier selftest's own report is replaced, as a rerun does
    earlier.write_text(json.dumps({"ok": True, "cases": [{"setup": "sgd", "fault": None}]}))
    from gradalign.report.files import check_replaceable

    check_replaceable([earlier])


def test_an_interrupt_after_a_golden_is_replaced_says_so(cli, small_runs, tmp_path, monkeypatch):
    """`golden write` (or `golden check --update`) interrupted right after the golden file was
    put in place ended "nothing half-written was left in place", though a committed golden had
    changed: the last line names it."""
    from gradalign.report import output

    real = output.write_text_atomic

    def interrupted(path, text, *args, **kwargs):
        real(path, text, *args, **kwargs)
        if str(path).endswith("g.json"):
            os.kill(os.getpid(), signal.SIGINT)

    monkeypatch.setattr(output, "write_text_atomic", interrupted)
    golden = tmp_path / "g.json"
    result = cli("golden", "write", small_runs["baseline"], "--out", golden, "--reference", "none")
    assert result.code == 130, result.err
    assert golden.is_file()
    last = result.err.strip().splitlines()[-1]
    assert last == f"interrupted after the golden file {golden} was written whole", last
