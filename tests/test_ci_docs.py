"""docs/CI.md, executed: the user's model and experiment it shows, the commands that make the
golden, and the commands of its GitHub Actions and GitLab jobs, run as written."""

from __future__ import annotations

import re
import shlex
import xml.etree.ElementTree as ET

import pytest

from gradalign import api

from .conftest import ROOT, SMALL

DOC = (ROOT / "docs" / "CI.md").read_text(encoding="utf-8")


def blocks(language: str) -> list[str]:
    return re.findall(rf"^```{language}\n(.*?)^```", DOC, re.M | re.S)


def block(language: str, first_line: str) -> str:
    found = [b for b in blocks(language) if b.startswith(first_line)]
    assert len(found) == 1, f"docs/CI.md must hold one {language} block starting {first_line!r}"
    return found[0]


def commands(text: str) -> list[list[str]]:
    """The gradalign command lines of a block (shell lines, YAML `run:` and `- ` items)."""
    found = []
    for line in text.splitlines():
        line = re.sub(r"^\s*(- )?(run: )?", "", line)
        if line.startswith("gradalign "):
            found.append(shlex.split(line, comments=True)[1:])
    return found


def test_the_golden_commands(cli, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    api.record_baseline(SMALL, "runs/baseline")
    api.record_merged(SMALL, "runs/merged")  # what the golden check line judges
    lines = commands(next(b for b in blocks("bash") if "golden write runs/baseline" in b))
    assert [line[:2] for line in lines] == [
        ["golden", "write"],
        ["golden", "check"],
        ["merged", "--against"],
        ["golden", "check"],
    ]
    for args in lines:
        result = cli(*args)
        assert result.code == 0, (args, result.out, result.err)
    assert len(list((tmp_path / "ci" / "golden").glob("*.json"))) == 1


@pytest.fixture
def user_repository(tmp_path, monkeypatch):
    """A user's repository as the page shows it: mynets.py, ci/exp.yaml and the golden."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "mynets.py").write_text(block("python", "# mynets.py"))
    (tmp_path / "ci").mkdir()
    (tmp_path / "ci" / "exp.yaml").write_text(block("yaml", "# ci/exp.yaml"))
    return tmp_path


def test_the_github_and_gitlab_jobs(cli, user_repository, monkeypatch):
    once = commands(next(b for b in blocks("bash") if "gradalign baseline" in b))
    assert [line[0] for line in once] == ["baseline", "golden"]
    for args in once:
        result = cli(*args)
        assert result.code == 0, (args, result.err)

    github = block("yaml", "# .github/workflows/gradalign.yml")
    gitlab = block("yaml", "# .gitlab-ci.yml")
    gates = {"github": commands(github), "gitlab": commands(gitlab)}
    assert all(len(lines) == 1 for lines in gates.values())
    summary = user_repository / "step-summary.md"
    for name, (args,) in gates.items():
        if name == "github":
            monkeypatch.setenv("GITHUB_STEP_SUMMARY", str(summary))
            monkeypatch.setenv("GITHUB_ACTIONS", "true")
        else:
            monkeypatch.delenv("GITHUB_STEP_SUMMARY")
            monkeypatch.delenv("GITHUB_ACTIONS")
        result = cli(*args)
        assert result.code == 0, (name, result.out, result.err)
        junit = args[args.index("--junit") + 1]
        assert ET.parse(user_repository / junit).getroot().find("testsuite") is not None
        assert (user_repository / args[args.index("--html") + 1]).stat().st_size > 10_000
        assert len(list((user_repository / args[args.index("--plot") + 1]).glob("*.png"))) == 3
    assert summary.read_text().startswith("### ✅ gradalign: PASS")
    assert "path: reports/" in github and "- reports/" in gitlab  # the artifacts uploaded
    assert re.search(r"junit: (\S+)", gitlab)[1] == junit  # GitLab reads the file written
