"""What gradalign promises wherever its output goes: a pipe whose reader left, a closed stream, a
path that is not UTF-8. The exit code stays the verdict and every report is written.

Each test is a defect once reproduced by hand (the sweep of the command line as CI runs it)."""

from __future__ import annotations

import errno
import io
import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from .conftest import ROOT

ENV = {**os.environ, "PYTHONPATH": str(ROOT)}


def _compare(small_runs: dict[str, Path], *extra: str) -> list[str]:
    base, merged = small_runs["baseline"], small_runs["merged"]
    return [sys.executable, "-m", "gradalign", "compare", str(base), str(merged), *extra]


def test_a_reader_that_leaves_early_changes_neither_the_verdict_nor_the_reports(
    small_runs, tmp_path
):
    """`gradalign compare ... --json r.json | head -1`: rich's own answer to the broken pipe was
    exit 1 ("not aligned") before any report was written."""
    report = tmp_path / "r.json"
    proc = subprocess.Popen(
        _compare(small_runs, "--json", str(report)),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=ENV,
    )
    assert proc.stdout is not None and proc.stderr is not None
    proc.stdout.close()  # the reader is gone before the table is printed
    err = proc.stderr.read().decode()
    assert proc.wait(timeout=120) == 0, err
    assert "Traceback" not in err and "Exception ignored" not in err
    assert report.read_text().startswith("{")


def test_a_closed_stdout_is_no_crash(small_runs, tmp_path):
    """`gradalign compare ... >&-`: Python's sys.stdout is None; the console setup crashed at
    import, a traceback and exit 1."""
    report = tmp_path / "r.json"
    proc = subprocess.run(
        _compare(small_runs, "--json", str(report)),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        env=ENV,
        timeout=120,
        preexec_fn=lambda: os.close(1),
    )
    assert proc.returncode == 0, proc.stderr
    assert "Traceback" not in proc.stderr
    assert report.exists()


def test_runs_under_a_name_that_is_not_utf8_get_every_report(cli, small_runs, tmp_path):
    """A directory named in Latin-1 reaches Python as lone surrogates (PEP 383): JUnit, Markdown
    and HTML failed to encode them (an internal error, exit 3) and JSON held an escape strict
    parsers reject. Every report is now UTF-8, the name's odd byte written as `\\udce9`."""
    folder = tmp_path / os.fsdecode(b"lat\xe9")
    runs = {name: shutil.copytree(path, folder / name) for name, path in small_runs.items()}
    reports = {kind: folder / f"r.{kind}" for kind in ("json", "junit", "markdown", "html")}
    options = [item for kind, path in reports.items() for item in (f"--{kind}", path)]
    result = cli("compare", runs["baseline"], runs["merged"], *options)
    assert result.code == 0, result.err
    for kind, path in reports.items():
        text = path.read_bytes().decode("utf-8")  # strict: no lone surrogate, no odd byte
        assert kind == "json" or "lat\\udce9" in text, path
    assert json.loads(reports["json"].read_text())["baseline"].endswith("lat\\udce9/baseline")


def test_a_name_that_is_not_utf8_prints_under_a_strict_utf8_stdout(small_runs, tmp_path):
    """PYTHONIOENCODING=utf-8 (common in CI images) or a UTF-8 desktop locale makes stdout
    strict: the table's run name crashed the print, exit 3."""
    folder = tmp_path / os.fsdecode(b"lat\xe9")
    runs = {name: shutil.copytree(path, folder / name) for name, path in small_runs.items()}
    proc = subprocess.run(
        _compare(runs),
        capture_output=True,
        env={**ENV, "PYTHONIOENCODING": "utf-8:strict"},
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    assert b"lat\\udce9/baseline" in proc.stdout


class _InterruptedImport:
    """A meta path finder that is Ctrl-C arriving while `gradalign.cli` is imported."""

    def find_spec(self, name: str, path: object, target: object = None) -> None:
        if name == "gradalign.cli":
            raise KeyboardInterrupt


def test_ctrl_c_while_the_command_line_imports_is_exit_130_not_a_traceback(monkeypatch, capsys):
    """Importing the command line takes about half a second (numpy, typer, rich); a Ctrl-C then
    printed a numpy traceback and the process died by SIGINT."""
    from gradalign.__main__ import run

    monkeypatch.delitem(sys.modules, "gradalign.cli")
    monkeypatch.setattr(sys, "meta_path", [_InterruptedImport(), *sys.meta_path])
    with pytest.raises(SystemExit) as exit_info:
        run()
    assert exit_info.value.code == 130
    assert capsys.readouterr().err == "interrupted: nothing was written\n"


_TERMINATED_IMPORT = """
import importlib.abc, os, signal, sys, time
class Terminated(importlib.abc.MetaPathFinder):  # SIGTERM while gradalign.cli imports
    def find_spec(self, name, path=None, target=None):
        if name == "gradalign.cli":
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(5)  # the handler runs here
sys.meta_path.insert(0, Terminated())
from gradalign.__main__ import run
sys.argv = ["gradalign", "version"]
run()
"""


def test_sigterm_while_the_command_line_imports_is_exit_143_with_its_line():
    """SIGTERM in the first half second (imports) killed the process without a word; the
    command's own handler comes later. Until then one is in place (a process of its own: the
    default action would end this one)."""
    done = subprocess.run(
        [sys.executable, "-c", _TERMINATED_IMPORT], capture_output=True, text=True, timeout=60
    )
    assert (done.returncode, done.stderr) == (143, "interrupted: nothing was written\n")


_WRAPPED_TERMINATION = """
import importlib.abc, os, signal, sys
class Wrapped(importlib.abc.MetaPathFinder):  # SIGTERM inside a class's __set_name__
    def find_spec(self, name, path=None, target=None):
        if name == "gradalign.cli":
            class Named:
                def __set_name__(self, owner, name):
                    os.kill(os.getpid(), signal.SIGTERM)
                    os.kill(os.getpid(), signal.SIGTERM)  # and again, as `timeout` sends it
                    [i for i in range(10**6)]  # the handlers run here
            class Owner:
                field = Named()
sys.meta_path.insert(0, Wrapped())
from gradalign.__main__ import run
sys.argv = ["gradalign", "version"]
run()
"""


def test_sigterm_twice_or_wrapped_while_the_command_line_imports_is_exit_143():
    """Python wraps an exception raised in a class's __set_name__ (a dataclass an import makes)
    in a RuntimeError, and `timeout` sends SIGTERM to the process and then to its group: the
    first was a traceback and exit 1, the second a traceback raised inside the first's
    handling (1 in 10 of `timeout -s TERM 0.12 gradalign compare ...`)."""
    done = subprocess.run(
        [sys.executable, "-c", _WRAPPED_TERMINATION], capture_output=True, text=True, timeout=60
    )
    assert (done.returncode, done.stderr) == (143, "interrupted: nothing was written\n")


def test_signals_inside_torchs_import_are_held_until_it_ends():
    """An interrupt raised inside torch's import (its C++ extension's init) is std::terminate,
    exit 134 and a C++ message: `signals_deferred` holds it and sends it again after the block,
    to the handler in force before."""
    from gradalign.errors import signals_deferred

    finished = []
    with pytest.raises(KeyboardInterrupt), signals_deferred():
        os.kill(os.getpid(), signal.SIGINT)
        finished.extend(range(10**5))  # Python's handler would have run by now
        finished.append("end")
    assert finished[-1] == "end"
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


def test_ctrl_c_while_the_help_printer_imports_is_exit_130_not_a_traceback(monkeypatch, capsys):
    """main() imports typer's help printer (rich.markdown, markdown_it) before any command
    runs, outside the command's own guard: a Ctrl-C 0.3 to 0.45 s after start was a traceback."""
    from gradalign import cli
    from gradalign.report import terminal

    def interrupted() -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(terminal, "safe_help", interrupted)
    with pytest.raises(SystemExit) as exit_info:
        cli.main(["version"])
    assert exit_info.value.code == 130
    assert capsys.readouterr().err == "interrupted: nothing was written\n"


_LATE = """
import atexit, os, signal, sys, time
import gradalign.cli
from gradalign.__main__ import run

def main():
    {body}

def ctrl_c_while_exiting():
    os.kill(os.getpid(), signal.SIGINT)
    time.sleep(0.2)  # the signal is delivered here, while Python exits

atexit.register(ctrl_c_while_exiting)
gradalign.cli.main = main
run()
"""


@pytest.mark.parametrize(
    ("body", "code", "err"),
    [
        ("sys.exit(1)", 1, ""),  # the verdict stands
        ("raise KeyboardInterrupt", 130, "interrupted: nothing half-written was left in place\n"),
    ],
    ids=["settled", "on-the-way-out"],
)
def test_a_ctrl_c_as_the_command_exits_keeps_its_code_and_says_at_most_one_line(body, code, err):
    """A Ctrl-C once the command had settled its exit code (its reports written) killed the
    process by SIGINT without a word, or printed a traceback: the code it had settled stands,
    and an interrupt on the way out of the command's guard is exit 130 and one line."""
    proc = subprocess.run(
        [sys.executable, "-c", _LATE.format(body=body)],
        capture_output=True,
        text=True,
        env=ENV,
        timeout=120,
    )
    assert (proc.returncode, proc.stderr) == (code, err)


def test_a_settled_command_ends_at_once_after_its_exit_functions():
    """The interpreter's teardown (0.5 to 1.5 s once torch is imported) is skipped; the exit
    functions (a Recorder never closed drops its staged run) still run, and what was printed
    is flushed."""
    script = (
        "import atexit, sys, gradalign.cli\n"
        "from gradalign.__main__ import run\n"
        "atexit.register(lambda: print('exit functions ran', end=''))\n"
        "class Teardown:\n"
        "    def __del__(self): print('teardown')\n"
        "kept = Teardown()\n"
        "def main():\n"
        "    print('said', end=' ')\n"
        "    sys.exit(1)\n"
        "gradalign.cli.main = main\n"
        "run()\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, env=ENV, timeout=120
    )
    assert (proc.returncode, proc.stdout, proc.stderr) == (1, "said exit functions ran", "")


def test_the_installed_command_goes_through_the_guarded_entry_point():
    text = (ROOT / "pyproject.toml").read_text()
    assert 'gradalign = "gradalign.__main__:run"' in text


def test_a_full_stderr_keeps_the_exit_code_of_bad_input(tmp_path):
    """`2>/dev/full` (or a log disk that filled up): writing the one-line error raised, and the
    uncaught exception made Python exit 1, which reads "not aligned"."""
    with open("/dev/full", "w") as full:
        proc = subprocess.run(
            [
                sys.executable,
                "-m",
                "gradalign",
                "compare",
                str(tmp_path / "a"),
                str(tmp_path / "b"),
            ],
            stdout=subprocess.DEVNULL,
            stderr=full,
            env=ENV,
            timeout=120,
        )
    assert proc.returncode == 2


def test_off_a_terminal_the_first_progress_line_comes_after_plain_first_seconds(monkeypatch):
    """The first line was due after PLAIN_FIRST (5 s) but came after PLAIN_EVERY (10 s): the
    clock of the last line started at 0, as if one had been printed at the start."""
    from rich.console import Console

    from gradalign.report import progress

    clock = [100.0]
    monkeypatch.setattr(progress.time, "monotonic", lambda: clock[0])
    console = Console(file=io.StringIO(), width=100)
    with progress.RichFeedback(console).progress("compare", 10) as advance:
        for now in (101.0, progress.PLAIN_FIRST + 100.5, progress.PLAIN_FIRST + 101.0):
            clock[0] = now
            advance()
    lines = console.file.getvalue().splitlines()
    assert lines == [f"compare: 2/10 ({progress.PLAIN_FIRST + 0.5:.0f} s)"]


def test_forced_colours_on_a_pipe_get_plain_progress_lines_not_redraws(monkeypatch):
    """FORCE_COLOR (common in CI) made rich treat a pipe as a terminal, and the live bar wrote
    its carriage returns and cursor codes into the log: about 100 redraws for 100 updates."""
    from rich.console import Console
    from rich.text import Text

    from gradalign.report import progress

    clock = [100.0]
    monkeypatch.setattr(progress.time, "monotonic", lambda: clock[0])
    console = Console(file=io.StringIO(), width=100, force_terminal=True)
    assert console.is_terminal and not progress.redraws(console)
    with progress.RichFeedback(console).progress("compare", 100) as advance:
        for step in range(100):
            clock[0] = 100.0 + step
            advance()
    text = console.file.getvalue()
    assert "\r" not in text and "\x1b[2K" not in text and "\x1b[?25l" not in text
    first = Text.from_ansi(text.splitlines()[0]).plain  # colours stay: they were asked for
    assert first == f"compare: 6/100 ({progress.PLAIN_FIRST:.0f} s)"


@pytest.mark.parametrize("where", ["a directory", "a missing directory", "a run's manifest"])
def test_a_step_summary_that_cannot_be_appended_to_is_refused_before_any_work(
    cli, small_copy, tmp_path, monkeypatch, where
):
    """$GITHUB_STEP_SUMMARY was first tried after judging: a directory or a missing folder turned
    the verdict into exit 2 after all the work, and one inside a run was appended to its
    manifest, and that run was gone."""
    manifest = small_copy["baseline"] / "manifest.json"
    target = {
        "a directory": tmp_path,
        "a missing directory": tmp_path / "absent" / "summary.md",
        "a run's manifest": manifest,
    }[where]
    monkeypatch.setenv("GITHUB_STEP_SUMMARY", str(target))
    before = manifest.read_bytes()
    result = cli("verify", "--updates", "1", "--hidden", "8", "-o", tmp_path / "v")
    assert result.code == 2 and "GITHUB_STEP_SUMMARY" in result.err, result.err
    assert not (tmp_path / "v").exists()  # refused before training
    result = cli("compare", small_copy["baseline"], small_copy["merged"])
    assert result.code == 2 and "GITHUB_STEP_SUMMARY" in result.err, result.err
    assert manifest.read_bytes() == before


@pytest.mark.parametrize("spelled", ["as set", "by another path"])
def test_markdown_into_the_step_summary_keeps_earlier_steps_and_appears_once(
    cli, small_runs, tmp_path, monkeypatch, spelled
):
    """`--markdown "$GITHUB_STEP_SUMMARY"` overwrote the file (earlier steps' summaries gone) and
    then appended the same summary again: shown twice."""
    summary = tmp_path / "summary.md"
    summary.write_text("an earlier step's summary\n")
    monkeypatch.setenv("GITHUB_STEP_SUMMARY", str(summary))
    monkeypatch.chdir(tmp_path)
    named = summary if spelled == "as set" else Path("sub", "..", "summary.md")
    (tmp_path / "sub").mkdir()
    result = cli("compare", small_runs["baseline"], small_runs["merged"], "--markdown", named)
    assert result.code == 0, result.err
    text = summary.read_text()
    assert text.startswith("an earlier step's summary\n")
    assert text.count("gradalign: PASS") == 1, text


def test_a_full_disk_before_the_last_report_replaces_none_of_the_set(
    cli, small_runs, tmp_path, monkeypatch
):
    """The reports were renamed into place one by one: a disk that filled up while the HTML
    report (the largest) was written left the new JSON, JUnit and Markdown beside the old HTML,
    a set from two runs, with exit 2."""
    from gradalign.report import html

    def full(*args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")

    reports = {kind: tmp_path / f"r.{kind}" for kind in ("json", "junit", "markdown", "html")}
    for path in reports.values():
        path.write_text("the earlier run's report\n")
    monkeypatch.setattr(html, "to_html", full)
    options = [item for kind, path in reports.items() for item in (f"--{kind}", path)]
    result = cli("compare", small_runs["baseline"], small_runs["merged"], *options)
    assert result.code == 2, result.err
    assert {p.read_text() for p in reports.values()} == {"the earlier run's report\n"}
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(p.name for p in reports.values())


@pytest.mark.parametrize("args", [["compare", "--help"], [], ["golden"]], ids=" ".join)
def test_help_into_a_pipe_whose_reader_left_is_exit_0(args):
    """`gradalign --help | head -1`: typer's own rich consoles answered the broken pipe with
    exit 1 (rich's default), the code for "not aligned"; bare `gradalign` (no command) is 2."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "gradalign", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=ENV,
    )
    assert proc.stdout is not None and proc.stderr is not None
    proc.stdout.close()
    err = proc.stderr.read().decode()
    assert proc.wait(timeout=120) == (0 if "--help" in args else 2), err
    assert "Traceback" not in err and "Exception ignored" not in err


def test_a_run_gone_non_finite_is_judged_without_numpy_warnings(tmp_path):
    """float16 weights under Adam go NaN: the verdict names it, but numpy's "invalid value
    encountered" warnings (with gradalign's source lines) came first on stderr, three of them,
    from the judge and its worker threads."""
    args = ["--amp-level", "O3", "--optimizer", "adam", "--updates", "3", "--hidden", "16"]
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "gradalign",
            "verify",
            *args,
            "--batch-size",
            "16",
            "-o",
            tmp_path / "r",
        ],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "PYTHONWARNINGS": "default"},
    )
    assert done.returncode == 1, done.stderr
    assert "Warning" not in done.stderr and "gradalign/judge" not in done.stderr, done.stderr


def test_two_reports_into_one_stream_are_refused_and_into_dev_null_are_not(small_runs, tmp_path):
    """`--json /dev/stdout --junit /dev/stdout`: the JSON and the XML came out glued together,
    readable as neither; two reports into one file were refused already."""
    twice = subprocess.run(
        _compare(small_runs, "--json", "/dev/stdout", "--junit", "/dev/stdout"),
        capture_output=True,
        text=True,
        env=ENV,
        timeout=120,
    )
    assert twice.returncode == 2 and "one stream" in twice.stderr, twice.stderr
    assert "Traceback" not in twice.stderr
    nulls = _compare(small_runs, "--json", os.devnull, "--junit", os.devnull)
    assert subprocess.run(nulls, capture_output=True, env=ENV, timeout=120).returncode == 0


def test_a_step_summary_into_the_stream_of_a_report_is_refused(small_runs, tmp_path):
    """`GITHUB_STEP_SUMMARY=/dev/stdout` beside `--json /dev/stdout`: the Markdown summary came
    after the JSON report in one stream, which then parsed as neither. A summary into a file
    beside the JSON report on standard output is fine, as is the summary alone there."""
    both = subprocess.run(
        _compare(small_runs, "--json", "/dev/stdout"),
        capture_output=True,
        text=True,
        env={**ENV, "GITHUB_STEP_SUMMARY": "/dev/stdout"},
        timeout=120,
    )
    assert both.returncode == 2 and "one stream" in both.stderr, both.stderr
    assert "GITHUB_STEP_SUMMARY /dev/stdout" in both.stderr and "Traceback" not in both.stderr
    summary = tmp_path / "summary.md"
    apart = subprocess.run(
        _compare(small_runs, "--json", "/dev/stdout"),
        capture_output=True,
        text=True,
        env={**ENV, "GITHUB_STEP_SUMMARY": str(summary)},
        timeout=120,
    )
    assert apart.returncode == 0 and json.loads(apart.stdout)["verdict"] == "pass", apart.stderr
    assert "gradalign" in summary.read_text()
    alone = subprocess.run(
        _compare(small_runs),
        capture_output=True,
        text=True,
        env={**ENV, "GITHUB_STEP_SUMMARY": "/dev/stdout"},
        timeout=120,
    )
    assert alone.returncode == 0 and "gradalign" in alone.stdout, alone.stderr
