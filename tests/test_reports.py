"""CI outputs: JUnit XML shaped like pytest's own, Markdown (and the GitHub step summary),
`::error` annotations, plots and the self-contained HTML report; all deterministic, all checked
before any work, and the exit code stays the gate."""

from __future__ import annotations

import dataclasses
import logging
import os
import shutil
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from gradalign import api
from gradalign.judge.results import Diagnosis
from gradalign.report.github import annotations
from gradalign.report.html import to_html
from gradalign.report.junit import to_junit
from gradalign.report.markdown import to_markdown
from gradalign.report.plots import PLOTS, render_pngs


@pytest.fixture(scope="module")
def verified(tmp_path_factory) -> dict:
    """`verify` with every report, clean and with a missing loss scale, in a GitHub-like job."""
    root = tmp_path_factory.mktemp("reports")
    found = {}
    for name in ("clean", "bug"):
        out = root / name
        out.mkdir()
        reports = {
            "junit": out / "j.xml",
            "markdown": out / "m.md",
            "plot": out / "p",
            "html": out / "r.html",
        }
        found[name] = {"reports": reports, "summary": out / "summary.md", "root": out}
    return found


def _run_verify(cli, entry: dict, fault: str | None, monkeypatch) -> object:
    monkeypatch.setenv("GITHUB_STEP_SUMMARY", str(entry["summary"]))
    monkeypatch.setenv("GITHUB_ACTIONS", "true")
    r = entry["reports"]
    args = ["verify", "--updates", "3", "--hidden", "16", "--batch-size", "16"]
    args += ["--out", entry["root"] / "runs", *(["--fault", fault] if fault else [])]
    args += ["--junit", r["junit"], "--markdown", r["markdown"]]
    args += ["--plot", r["plot"], "--html", r["html"]]
    return cli(*args)


def test_verify_writes_all_four_reports_and_the_step_summary(cli, verified, monkeypatch):
    entry = verified["clean"]
    entry["summary"].write_text("earlier step\n")
    result = _run_verify(cli, entry, None, monkeypatch)
    assert result.code == 0, result.err
    r = entry["reports"]
    suites = ET.parse(r["junit"]).getroot().findall("testsuite")
    assert len(suites) == 1
    cases = suites[0].findall("testcase")
    names = [c.get("name") for c in cases]
    checks = result.out.split("checks")[-1]
    judged = api.compare(entry["root"] / "runs" / "baseline", entry["root"] / "runs" / "merged")
    assert len(names) == len(set(names)) == len(judged.checks)
    assert all(name in checks for name in names)
    assert r["markdown"].read_text().startswith("### ✅ gradalign: PASS")
    assert sorted(p.name for p in r["plot"].iterdir()) == sorted(PLOTS)
    assert r["html"].read_text().count("data:image/png;base64,") == 3
    summary = entry["summary"].read_text()
    assert summary.startswith("earlier step\n### ✅ gradalign: PASS")  # appended, not replaced
    assert "::error" not in result.err  # a pass annotates nothing


def test_a_failure_in_a_github_job(cli, verified, monkeypatch):
    entry = verified["bug"]
    result = _run_verify(cli, entry, "no-loss-scale", monkeypatch)
    assert result.code == 1  # the exit code stays the gate
    errors = [line for line in result.err.splitlines() if line.startswith("::error")]
    assert 1 <= len(errors) <= 3
    assert "update 0" in errors[0] and "loss-scale" in errors[0] and "\n" not in errors[0]
    root = ET.parse(entry["reports"]["junit"]).getroot()
    failures = root.findall("testsuite/testcase/failure")
    texts = [f.text for f in failures]
    assert texts and all("loss-scale" in t and "fix: divide" in t for t in texts)
    assert {f.get("type") for f in failures} == {"loss-scale"}  # the named cause, for grouping
    assert root.find("testsuite").get("failures") == str(len(failures))
    markdown = entry["reports"]["markdown"].read_text()
    assert markdown.startswith("### ❌ gradalign: FAIL")
    assert "**Cause: `loss-scale`**" in markdown and "<details>" in markdown
    assert "loss-scale" in entry["reports"]["html"].read_text()


def test_without_github_nothing_is_annotated_or_appended(cli, tmp_path, small_runs, monkeypatch):
    monkeypatch.delenv("GITHUB_STEP_SUMMARY", raising=False)
    monkeypatch.delenv("GITHUB_ACTIONS", raising=False)
    result = cli("compare", small_runs["baseline"], small_runs["merged"])
    assert result.code == 0 and "::" not in result.err
    assert list(tmp_path.iterdir()) == []


def test_a_step_summary_that_cannot_be_appended_keeps_the_verdict_and_the_reports(
    cli, tmp_path, small_runs, monkeypatch
):
    """A full disk (or a read-only summary file) under `$GITHUB_STEP_SUMMARY`: the run passed,
    yet it exited 2 and removed its own reports as "earlier reports of other runs"."""
    monkeypatch.setenv("GITHUB_STEP_SUMMARY", "/dev/full")
    report, junit = tmp_path / "r.json", tmp_path / "r.xml"
    result = cli("compare", small_runs["baseline"], small_runs["merged"], "--json", report,
                 "--junit", junit)  # fmt: skip
    assert result.code == 0, result.err
    assert report.exists() and junit.exists()
    (line,) = [x for x in result.err.splitlines() if "GITHUB_STEP_SUMMARY" in x]
    assert line.startswith("warning: GITHUB_STEP_SUMMARY /dev/full: cannot append the summary")


PYTEST_JUNIT = """
import pytest
def test_passes(): pass
def test_fails(): assert 1 == 2, "boom"
@pytest.mark.skip(reason="not today")
def test_skipped(): pass
"""


def _shape(root: ET.Element) -> dict:
    """The structure of a JUnit document: tags and attribute names, per level."""
    suites = root.findall("testsuite")
    return {
        "root": root.tag,
        "root_attrs": set(root.attrib),
        "suite_attrs": set().union(*(s.attrib for s in suites)),
        "case_attrs": set().union(*(c.attrib for c in root.iter("testcase"))),
        "failure_attrs": set(root.find(".//failure").attrib),
        "skipped_attrs": set(root.find(".//skipped").attrib),
        "children": {child.tag for s in suites for child in s} - {"properties"},
    }


def test_junit_has_the_structure_of_pytests_own(tmp_path, small_runs):
    (tmp_path / "test_shape.py").write_text(PYTEST_JUNIT)
    theirs_file = tmp_path / "pytest.xml"
    junit = f"--junitxml={theirs_file}"
    subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "test_shape.py", junit],
        cwd=tmp_path,
        capture_output=True,
        check=False,
    )
    theirs = _shape(ET.parse(theirs_file).getroot())
    good = api.compare(small_runs["baseline"], small_runs["merged"], reference="none")
    failing = dataclasses.replace(
        good, checks=[dataclasses.replace(good.checks[1], status="fail"), *good.checks]
    )
    failing.checks.append(dataclasses.replace(good.checks[0], name="x", status="not checked"))
    ours = _shape(ET.fromstring(to_junit([("a", good), ("b", failing)])))
    assert ours["root"] == theirs["root"] == "testsuites"
    # the totals on the root, as Jenkins and JUnit 5 write them (pytest writes only a name)
    totals = {"tests", "failures", "errors", "skipped", "time"}
    assert ours["root_attrs"] <= theirs["root_attrs"] | totals
    root = ET.fromstring(to_junit([("a", good), ("b", failing)]))
    for key in ("tests", "failures", "skipped"):
        assert int(root.get(key)) == sum(int(s.get(key)) for s in root.findall("testsuite")) > 0
    assert ours["suite_attrs"] <= theirs["suite_attrs"]  # no timestamp or hostname: same bytes
    assert {"name", "tests", "failures", "errors", "skipped"} <= ours["suite_attrs"]
    assert ours["case_attrs"] == theirs["case_attrs"] == {"classname", "name", "time"}
    assert ours["failure_attrs"] <= theirs["failure_attrs"] | {"type"}
    assert ours["skipped_attrs"] == theirs["skipped_attrs"] == {"type", "message"}
    assert ours["children"] == theirs["children"] == {"testcase"}
    names = [c.get("name") for c in ET.fromstring(to_junit([("b", failing)])).iter("testcase")]
    assert len(names) == len(set(names))  # unique even when two checks share a name
    # Jenkins splits a classname at its last dot: a run folder's dots must not make a package
    dotted = ET.fromstring(to_junit([("runs/k4.v2 vs ../base.1", good)]))
    suite = dotted.find("testsuite")
    assert suite.get("name") == "runs/k4.v2 vs ../base.1"  # the name itself is kept whole
    classes = {c.get("classname") for c in suite.iter("testcase")}
    assert classes == {"gradalign.runs/k4_v2 vs __/base_1"}


def _long(comparison, copies: int):
    """A comparison with `copies` times its updates (report size and capping)."""
    results = [
        dataclasses.replace(r, update=k * len(comparison.results) + r.update)
        for k in range(copies)
        for r in comparison.results
    ]
    return dataclasses.replace(comparison, results=results)


def test_markdown_is_capped_far_under_githubs_limit(small_runs):
    big = _long(api.compare(small_runs["baseline"], small_runs["merged"]), 1000)
    text = to_markdown(big)
    assert len(text.encode()) < 300 * 1024
    visible = text.split("<details>")[0]
    assert visible.count("\n| ") < 40 and "…" in visible
    assert text.rstrip().endswith("</details>")


def test_markdown_shows_odd_names_as_typed_and_keeps_code_spans(small_runs, tmp_path):
    """A run's path went into the Markdown as it was: `runs/we<i>rd*x*` opened an HTML tag and an
    emphasis in the job's summary. A message's own `code` stays code."""
    odd = tmp_path / "we<i>rd & *x*_y"
    shutil.copytree(small_runs["merged"], odd)
    c = api.compare(small_runs["baseline"], odd, reference="none")
    c.diagnosis.append(Diagnosis("x", "pass `micro(loss, items=n)` here", {}, None, "info"))
    text = to_markdown(c)
    assert "we&lt;i&gt;rd &amp; \\*x\\*\\_y" in text and "<i>" not in text
    assert "pass `micro(loss, items=n)` here" in text
    ringing = tmp_path / "x\x1b[31mred\x07"  # an escape sequence and a bell: shown, not sent
    shutil.copytree(small_runs["merged"], ringing)
    text = to_markdown(api.compare(small_runs["baseline"], ringing, reference="none"))
    assert "\x1b" not in text and "\x07" not in text and "x\\\\x1b\\[31mred\\\\x07" in text


def test_every_report_is_the_same_bytes_twice(small_runs):
    comparison = api.compare(small_runs["baseline"], small_runs["merged"])
    again = api.compare(small_runs["baseline"], small_runs["merged"])
    assert to_junit([("s", comparison)]) == to_junit([("s", again)])
    assert to_markdown(comparison) == to_markdown(again)
    images = render_pngs(comparison)
    assert images == render_pngs(again)
    assert all(data.startswith(b"\x89PNG") for data in images.values())
    assert to_html(comparison, images, {}) == to_html(again, images, {})
    assert annotations(comparison) == []


NO_MATPLOTLIB = """
import importlib.abc, sys
class Blocked(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name == "matplotlib" or name.startswith("matplotlib."):
            raise ImportError("matplotlib is not installed here")
sys.meta_path.insert(0, Blocked())
from gradalign.cli import main
main(sys.argv[1:])
"""


def test_plots_need_the_extra_and_html_says_so(tmp_path, small_runs):
    def run(*args):
        return subprocess.run(
            [sys.executable, "-c", NO_MATPLOTLIB, *map(str, args)],
            capture_output=True,
            text=True,
            env={**os.environ, "COLUMNS": "200"},
        )

    base, merged = small_runs["baseline"], small_runs["merged"]
    done = run("compare", base, merged, "--plot", tmp_path / "p", "--junit", tmp_path / "j.xml")
    assert done.returncode == 2 and "gradalign[plot]" in done.stderr
    assert not (tmp_path / "j.xml").exists()  # refused before any work
    done = run("compare", base, merged, "--html", tmp_path / "r.html")
    assert done.returncode == 0, done.stderr
    assert "gradalign[plot]" in (tmp_path / "r.html").read_text()


def test_report_paths_are_checked_before_any_work(cli, tmp_path, small_runs):
    inside = tmp_path / "v" / "merged" / "j.xml"
    result = cli("verify", "--updates", "2", "--out", tmp_path / "v", "--junit", inside)
    assert result.code == 2 and "inside" in result.err
    assert not (tmp_path / "v").exists()
    result = cli("merged", "--out", tmp_path / "m", "--markdown", tmp_path / "m.md")
    assert result.code == 2 and "--against" in result.err


def test_fonts_matplotlib_lacks_are_not_logged(small_runs, caplog):
    """A font cache built by another matplotlib makes every plot log `findfont: Font family
    [...] not found` (21 lines beside a one-line error); a family no machine has does the
    same. The font manager's logger is held at ERROR while the plots draw."""
    matplotlib = pytest.importorskip("matplotlib")
    comparison = api.compare(small_runs["baseline"], small_runs["merged"])
    family = matplotlib.rc_context({"font.family": ["NoSuchFamily"]})
    with family, caplog.at_level(logging.WARNING):
        assert all(png.startswith(b"\x89PNG") for png in render_pngs(comparison).values())
    assert not [r for r in caplog.records if r.name.startswith("matplotlib")], caplog.text


def test_a_config_folder_matplotlib_cannot_make_says_nothing_on_stderr(tmp_path, small_runs):
    """Where matplotlib cannot make its config folder it logs two warnings as it imports
    ("mkdir -p failed", "created a temporary cache directory") above gradalign's one line."""
    pytest.importorskip("matplotlib")
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    env = {**os.environ, "MPLCONFIGDIR": str(blocker / "mpl")}
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "gradalign",
            "compare",
            small_runs["baseline"],
            small_runs["merged"],
            "--plot",
            tmp_path / "plots",
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    assert "atplotlib" not in done.stderr and "mkdir" not in done.stderr, done.stderr
    assert (tmp_path / "plots" / "loss.png").exists()


def test_the_html_report_is_self_contained(tmp_path, small_runs):
    comparison = api.compare(small_runs["baseline"], small_runs["merged"])
    html = to_html(comparison, render_pngs(comparison), {})
    for remote in ("http://", "https://", "<script", "<link", "@import", "url("):
        assert remote not in html
    assert "Content-Security-Policy" in html and html.count("<img") == 3


@pytest.mark.parametrize("name", PLOTS)
def test_each_plot_is_a_real_image(small_runs, name):
    import io

    from PIL import Image

    image = Image.open(io.BytesIO(render_pngs(api.compare(*small_runs.values()))[name]))
    assert image.size[0] >= 600 and len(image.convert("RGB").getcolors(1 << 24)) > 20


def test_plot_directory_lands_outside_runs(cli, small_runs):
    inside = Path(small_runs["merged"]) / "p"
    result = cli("compare", small_runs["baseline"], small_runs["merged"], "--plot", inside)
    assert result.code == 2 and "inside" in result.err


def test_every_report_is_written_when_no_update_could_be_judged(cli, tmp_path):
    """A merged run whose first window is irregular: no update lines up, nothing is judged;
    the comparison fails (window-bookkeeping) and every report is still written."""
    import torch

    import gradalign

    x = torch.randn(64, 4, generator=torch.Generator().manual_seed(0))
    y = torch.randn(64, 1, generator=torch.Generator().manual_seed(1))

    def record(out, k, extra=0):
        torch.manual_seed(0)
        model = torch.nn.Linear(4, 1)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        rows = iter(torch.arange(64).split(8 // k))
        with gradalign.Recorder(out, model, opt, accum_steps=k) as rec:
            for update in range(3):
                for _ in range(k + (extra if update == 0 else 0)):
                    i = next(rows)
                    loss = torch.nn.functional.mse_loss(model(x[i]), y[i])
                    (loss / k).backward()
                    rec.micro(loss, batch=(x[i], y[i]))
                opt.step()
                rec.update()
                opt.zero_grad()
        return out

    base, merged = record(tmp_path / "k1", 1), record(tmp_path / "k2", 2, extra=1)
    reports = {"--json": "r.json", "--junit": "r.xml", "--markdown": "r.md", "--html": "r.html"}
    args = [a for flag, name in reports.items() for a in (flag, tmp_path / name)]
    result = cli("compare", base, merged, *args, "--plot", tmp_path / "plots")
    assert result.code == 1, result.err
    assert all((tmp_path / name).stat().st_size for name in reports.values())
    assert sorted(p.name for p in (tmp_path / "plots").iterdir()) == sorted(PLOTS)


def test_plots_of_names_the_font_cannot_draw_raise_no_warning(tmp_path):
    """A tensor named in a script the default font lacks: matplotlib warned once per missing
    glyph (a dozen lines in a CI log), and where warnings are errors a failing check ended in
    exit 3. Drawn as boxes, silently."""
    import warnings

    import numpy as np

    from gradalign.report.plots import render_pngs
    from gradalign.runs.portable import write_run

    name = "编码器.权重"
    for run, k, scale in (("base", 1, 1.0), ("merged", 2, 2.0)):
        steps = [{name: np.full(4, 1.0 - 0.1 * scale * i, dtype=np.float32)} for i in range(3)]
        write_run(
            tmp_path / run,
            accum_steps=k,
            micro_losses=[1.0, 0.9] * k,
            init_weights=steps[0],
            update_weights=steps[1:],
        )
    c = api.compare(tmp_path / "base", tmp_path / "merged", reference="none")
    assert c.verdict == "fail"
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        images = render_pngs(c)
    assert set(images) == {"loss.png", "error.png", "heatmap.png"}


def test_junit_text_holds_no_character_xml_forbids():
    """A run path holding U+FFFE made a JUnit file no XML parser reads: C0 controls were
    replaced, U+FFFE and U+FFFF were not."""
    from gradalign.report.junit import _clean

    text = "run\ufffe/\uffff/\x01/tab\tok"
    safe = _clean(text)
    assert "\ufffe" not in safe and "\uffff" not in safe
    assert "\x01" not in safe and "\t" in safe
    ET.fromstring(f"<a>{safe}</a>")


def test_the_terminal_tables_worst_tensor_is_a_gradient_where_one_is_worst():
    """An update whose gradient fails while its weights pass (Adam steps a K-times gradient
    nearly as it steps the right one) shows that gradient, marked, as its worst tensor: the
    weight it showed before read as passing beside a FAIL."""
    from gradalign.judge.metrics import TensorDiff
    from gradalign.judge.results import UpdateResult
    from gradalign.report.table import _update_row

    def diff(name: str, error: float) -> TensorDiff:
        return TensorDiff(name, error, 0.0, 0.0, 1.0, error, 1.0, noise=0.5)

    row = UpdateResult(0, 2.0, 2.0, 0.0, 0.0, 1e-6)
    row.weights, row.grads = [diff("w", 0.2), diff("b", 0.1)], [diff("w", 3.0), diff("b", 0.3)]
    cells = _update_row(row, calibrated=True)
    assert cells[4] == "w (grad)" and cells[-3] == "3x" and "FAIL" in cells[-1], cells
    row.grads = [diff("w", 0.05), diff("b", float("nan"))]
    cells = _update_row(row, calibrated=True)
    assert cells[4] == "b (grad)", cells  # NaN is the worst of all
    row.grads = [diff("w", 0.05)]
    assert _update_row(row, calibrated=False)[4] == "w"  # a weight, unmarked


def test_a_control_character_in_a_runs_path_is_escaped_on_the_terminal(cli, tmp_path, small_runs):
    """A run directory named `esc\\x1b[31mred`: the table's title printed the ESC sequence raw
    (JUnit, Markdown, JSON and HTML escaped it already)."""
    import shutil

    merged = shutil.copytree(small_runs["merged"], tmp_path / "esc\x1b[31mred")
    result = cli("compare", small_runs["baseline"], merged)
    assert result.code == 0, result.err
    assert "\x1b[31m" not in result.out and "esc\\x1b[31mred" in result.out
