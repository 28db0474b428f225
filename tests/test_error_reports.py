"""A command that ends in error (exit 2) leaves the error at the report paths it was asked for:
the JSON report (`verdict: error`, the exit code, the message), a JUnit file with one `<error>`,
the Markdown report; in GitHub Actions the step summary and one `::error` line. Before, nothing
was left (a CI job showed "no test results"), and an earlier run's reports were only removed."""

from __future__ import annotations

import json
import subprocess
import sys
import xml.etree.ElementTree as ET

from .conftest import one_line_error


def _reports(folder):
    return {
        "json": folder / "r.json",
        "junit": folder / "r.xml",
        "markdown": folder / "r.md",
        "html": folder / "r.html",
    }


def _options(reports):
    return [item for name, path in reports.items() for item in (f"--{name}", path)]


def test_a_refused_compare_leaves_its_error_at_each_report(cli, small_runs, tmp_path):
    reports = _reports(tmp_path)
    base, merged = small_runs["baseline"], small_runs["merged"]
    assert cli("compare", base, merged, *_options(reports)).code == 0
    refused = cli("compare", base, tmp_path / "absent", *_options(reports))
    one_line_error(refused, "absent: no such run directory", "removed the earlier report")
    data = json.loads(reports["json"].read_text())
    assert data["verdict"] == "error" and data["exit_code"] == 2
    assert "absent: no such run directory" in data["error"]
    assert data["checks"] == [] and data["diagnosis"] == []
    root = ET.parse(reports["junit"]).getroot()
    assert root.get("name") == "gradalign" and root.get("errors") == "1"
    assert root.get("failures") == "0" and root.get("tests") == "1"
    error = root.find("testsuite/testcase/error")
    assert error is not None and error.get("type") == "bad input"
    assert "absent: no such run directory" in error.get("message", "")
    markdown = reports["markdown"].read_text()
    assert markdown.startswith("### ⚠️ gradalign: ERROR\n\n") and "absent" in markdown
    assert not reports["html"].exists()  # the earlier run's page: removed, as it says
    again = cli("compare", base, merged, *_options(reports))  # a later run replaces the error
    assert again.code == 0 and json.loads(reports["json"].read_text())["verdict"] == "pass"
    assert "<error" not in reports["junit"].read_text()


def test_the_same_refusal_leaves_the_same_bytes(cli, small_runs, tmp_path):
    reports = _reports(tmp_path)
    del reports["html"]
    command = ("compare", small_runs["baseline"], tmp_path / "absent", *_options(reports))
    one_line_error(cli(*command))
    first = {name: path.read_bytes() for name, path in reports.items()}
    one_line_error(cli(*command))
    assert {name: path.read_bytes() for name, path in reports.items()} == first


def test_an_error_report_lands_only_where_a_report_may(cli, small_copy, tmp_path):
    """Never on a user's file, never inside a run (the error may be that refusal), never in a
    folder the error would create; a refused report set writes none of its paths."""
    base, merged = small_copy["baseline"], small_copy["merged"]
    mine = tmp_path / "mine.json"
    mine.write_text('{"verdict": "mine"}')
    missing = tmp_path / "no" / "such" / "r.xml"
    one_line_error(cli("compare", base, tmp_path / "absent", "--json", mine, "--junit", missing))
    assert mine.read_text() == '{"verdict": "mine"}' and not (tmp_path / "no").exists()
    inside = base / "r.json"
    one_line_error(cli("compare", base, merged, "--json", inside))
    assert not inside.exists()
    junit = tmp_path / "r.xml"
    one_line_error(cli("compare", base, merged, "--junit", junit, "--html", mine), "not a gradal")
    assert not junit.exists() and mine.read_text() == '{"verdict": "mine"}'


def test_in_github_actions_the_error_reaches_the_summary_and_an_annotation(
    cli, small_runs, tmp_path, monkeypatch
):
    summary = tmp_path / "summary.md"
    summary.write_text("## an earlier step\n")
    monkeypatch.setenv("GITHUB_ACTIONS", "true")
    monkeypatch.setenv("GITHUB_STEP_SUMMARY", str(summary))
    result = cli("compare", small_runs["baseline"], tmp_path / "absent", "--markdown", summary)
    assert result.code == 2
    first, *others = result.err.strip().split("\n")
    assert first.startswith("error: ") and "absent" in first
    assert len(others) == 1 and others[0].startswith("::error title=gradalign%3A bad input::")
    text = summary.read_text()
    assert text.startswith("## an earlier step\n### ⚠️ gradalign: ERROR\n\n")
    assert text.count("gradalign: ERROR") == 1  # --markdown onto the summary: appended once


def test_an_error_report_to_stdout_is_what_stdout_carries(small_runs, tmp_path):
    """`gradalign compare ... --json /dev/stdout | jq .verdict` reads `"error"` on exit 2."""
    command = [sys.executable, "-m", "gradalign", "compare", small_runs["baseline"], "absent"]
    done = subprocess.run(
        [*command, "--json", "/dev/stdout"], capture_output=True, text=True, cwd=tmp_path
    )
    assert done.returncode == 2 and done.stderr.startswith("error: ")
    assert json.loads(done.stdout)["verdict"] == "error"


def test_a_command_line_that_cannot_be_parsed_leaves_its_error_too(cli, small_runs, tmp_path):
    """An unknown option or a bad value is refused before the command runs: `--json` named on
    that line was left unwritten (`... --bogus --json /dev/stdout | jq` read nothing)."""
    reports = _reports(tmp_path)
    del reports["html"]
    base = small_runs["baseline"]
    one_line_error(cli("compare", base, base, "--bogus", *_options(reports)), "--bogus")
    assert "No such option: --bogus" in json.loads(reports["json"].read_text())["error"]
    assert "<error" in reports["junit"].read_text() and "ERROR" in reports["markdown"].read_text()
    one_line_error(cli("compare", base, "-k", "abc", f"--json={reports['json']}"), "abc")
    assert "'abc' is not a valid int" in json.loads(reports["json"].read_text())["error"]
    mine = tmp_path / "mine.json"
    mine.write_text('{"verdict": "mine"}')
    one_line_error(cli("compare", base, "--bogus", "--json", mine))
    assert mine.read_text() == '{"verdict": "mine"}'  # never on a file that is no report
    one_line_error(cli("baseline", "--bogus", "--json", tmp_path / "b.json"))
    assert not (tmp_path / "b.json").exists()  # a command that writes no report
