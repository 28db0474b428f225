"""What gradalign promises a newcomer: the commands are kind to one.

Each test is a defect once reproduced by hand, kept as a promise: the scripts take paths relative
to the caller, the README says how to call gradalign and every exit code, help lists the choices
and bare `gradalign` prints it, and the table never cuts a number at any width and shows its
progress off a terminal.
"""

from __future__ import annotations

import io
import os
import subprocess
import sys

import pytest

from gradalign import api
from gradalign import cli as cli_module
from gradalign.report import progress

from .conftest import ROOT
from .test_promises_refusals import SMALL_ARGS


def test_scripts_take_paths_relative_to_the_caller(tmp_path):
    """Run from another directory, relative paths are the caller's, not the checkout's."""
    runs = "c/runs/verify"
    first = subprocess.run(
        ["bash", str(ROOT / "run.sh"), *SMALL_ARGS, "--out", runs],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert first.returncode == 0, first.stderr
    second = subprocess.run(
        ["sh", str(ROOT / "run_grad.sh"), f"{runs}/baseline", "--out", "c/runs/m"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert second.returncode == 0, second.stderr
    assert (tmp_path / "c" / "runs" / "m" / "manifest.json").is_file()


def test_the_readme_says_how_to_call_gradalign_and_every_exit_code():
    readme = (ROOT / "README.md").read_text()
    assert ".venv/bin/gradalign" in readme and "source .venv/bin/activate" in readme
    table = readme[readme.index("## Exit codes") :]
    codes = {int(line.split("|")[1]) for line in table.splitlines()[4:] if line.startswith("| ")}
    assert codes == {0, 1, 2, 3, 130, 143}
    assert {cli_module.BAD_INPUT, cli_module.INTERNAL, cli_module.INTERRUPTED} <= codes
    assert cli_module.TERMINATED in codes


def test_help_lists_the_choices_and_the_fault_names(cli):
    result = cli("verify", "--help")
    assert result.code == 0
    text = " ".join(result.out.replace("│", " ").split())
    assert "sgd | adam | adamw" in text
    for name in ("no-loss-scale", "zero-grad-every-micro", "bf16-accum", "dropout-reseed"):
        assert name in text, name


def test_bare_gradalign_prints_help_and_version_and_h_work(cli):
    """Bare `gradalign` (or `gradalign golden`) prints help and exits 2: a CI step whose command
    went missing (`gradalign $EMPTY`) must not pass the gate with 0, the code for aligned."""
    for args in ([], ["golden"], ["--debug"]):
        bare = cli(*args)
        assert bare.code == 2 and bare.out.count("Usage") == 1, args  # it was printed twice
        assert bare.err.strip() == "error: no command given: the help above lists them", args
    assert cli("--version").out.strip().startswith("gradalign ")
    assert "Usage" in cli("compare", "-h").out


@pytest.mark.parametrize("command", ["baseline", "merged", "compare", "verify", "selftest"])
def test_help_at_80_columns_cuts_no_word(command):
    """`merged --help` at 80 columns cut a fault's name (`edit-weights-every-mic…`): the option
    column was widened by `--trust-run-code / --no-trust-run-code`."""
    done = subprocess.run(
        [sys.executable, "-m", "gradalign", command, "--help"],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "COLUMNS": "80"},
    )
    assert done.returncode == 0 and "…" not in done.stdout, done.stdout


def test_the_table_never_cuts_a_number(tmp_path):
    old = ROOT / "fixtures" / "runs" / "v0.1.0"
    done = subprocess.run(
        [sys.executable, "-m", "gradalign", "compare", old / "baseline", old / "merged"],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "COLUMNS": "60"},
    )
    assert done.returncode == 0
    assert "…" not in done.stdout


@pytest.mark.parametrize("width", [60, 80, 100, 132])
def test_a_narrow_table_leaves_out_columns_and_never_splits_a_number(width):
    """At 80 columns and less, numbers were folded over two to five lines ("2.31", "7703", "2")
    and FAIL became "FAI"/"L"; the headers read "upda"/"te". Columns now give way, named in a
    note, until every number stays on its line."""
    from rich.console import Console

    from gradalign.report.table import render

    old = ROOT / "fixtures" / "runs" / "v0.1.0"
    tight = {"noise_factor": 0.5, "noise_floor": 0.0}  # a failing comparison: FAIL in every row
    c = api.compare(old / "baseline", old / "merged", tolerances=tight)
    assert c.reference is not None and c.verdict == "fail"
    wide, narrow = (Console(file=io.StringIO(), width=w, color_system=None) for w in (300, width))
    render(c, wide)
    render(c, narrow)

    def body(console):  # the per-update table's rows, each a list of its cells
        lines = console.file.getvalue().splitlines()
        start = next(i for i, line in enumerate(lines) if line.startswith("┡"))
        end = next(i for i, line in enumerate(lines) if line.startswith("└"))
        return [[cell.strip() for cell in line.split("│")[1:-1]] for line in lines[start + 1 : end]]

    full, shown = body(wide), body(narrow)
    assert len(shown) == len(full)  # one line per row: nothing folded
    for whole, row in zip(full, shown, strict=True):
        assert row[0] == whole[0] and row[-1] == whole[-1] == "FAIL"
        assert set(row) <= set(whole)  # every cell whole: a number cut short matches none
    text = " ".join(narrow.file.getvalue().split())
    if len(shown[0]) < len(full[0]):
        assert f"note: left out at this width ({width} columns):" in text
    else:
        assert "left out at this width" not in text


def test_a_long_compare_shows_progress_off_a_terminal(cli, small_runs, monkeypatch):
    monkeypatch.setattr(progress, "PLAIN_FIRST", 0.0)
    monkeypatch.setattr(progress, "PLAIN_EVERY", 0.0)
    result = cli("compare", small_runs["baseline"], small_runs["merged"])
    assert result.code == 0
    assert "compare: 1/4" in result.err and "compare: 4/4" in result.err
