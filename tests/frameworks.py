"""Helpers for the framework integration tests: the example scripts they run, the frameworks they
need, and the verdict, codes and margin of a comparison."""

from __future__ import annotations

import importlib
import importlib.util
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

from gradalign import api

EXAMPLES = Path(__file__).resolve().parent.parent / "examples" / "frameworks"


def require(module: str) -> ModuleType:
    """Import a framework; skip when it is missing, unless GRADALIGN_REQUIRE_FRAMEWORKS is set
    (CI installs the extras, so there a missing framework fails instead of skipping)."""
    if os.environ.get("GRADALIGN_REQUIRE_FRAMEWORKS"):
        return importlib.import_module(module)
    return pytest.importorskip(module)


def example(name: str) -> ModuleType:
    """An example script of examples/frameworks, imported as the README runs it."""
    if str(EXAMPLES) not in sys.path:
        sys.path.insert(0, str(EXAMPLES))
    return importlib.import_module(name)


def recorded(tmp_path_factory: pytest.TempPathFactory, script: ModuleType, *argv: str) -> Path:
    """Run an example as the README does (`python SCRIPT OUT ARGV...`); returns OUT."""
    out = tmp_path_factory.mktemp(script.__name__) / "runs"
    script.main([str(out), *argv])
    return out


def judged(baseline: Path, merged: Path) -> tuple[str, list[str], float]:
    """(verdict, error codes, worst err/allowed over all weights and gradients)."""
    comparison = api.compare(baseline, merged)
    codes = [d.code for d in comparison.diagnosis if d.severity == "error"]
    diffs = [d for r in comparison.results for d in (*r.weights, *r.grads)]
    return comparison.verdict, codes, max(d.ratio for d in diffs)


def all_checked(baseline: Path, merged: Path) -> dict[str, str]:
    """Every check's status: an integration records every fact the judge reads."""
    return {c.name: c.status for c in api.compare(baseline, merged).checks}


README = Path(__file__).resolve().parent.parent / "README.md"


def readme_commands(heading: str) -> list[tuple[list[str], str]]:
    """The commands of the README's `### heading` bash blocks, each with its comment."""
    text = README.read_text()
    start = text.index(f"### {heading}\n")
    end = min(i for i in (text.find("\n### ", start + 1), text.find("\n## ", start)) if i > 0)
    commands = []
    for block in re.findall(r"```bash\n(.*?)```", text[start:end], re.S):
        for line in block.splitlines():
            command, _, comment = line.partition("#")
            if command.strip():
                commands.append((shlex.split(command), comment.strip()))
    return commands


TEARDOWN_ABORT = "terminate called without an active exception"  # pytorch issue 190489


def run_readme(heading: str, cwd: Path) -> dict[str, tuple[str, list[str], float]]:
    """Run the README's commands for `heading` as written, in `cwd` (for the repository's root,
    whose scripts they run): `python SCRIPT ARGS` in-process, `python -m torch.distributed.run
    ...` as a process of its own, `gradalign compare BASE MERGED` (whose comment, `pass` or a
    diagnosis code, must be what it gets); `pip install` lines are left to the test command.
    Returns judged() of each comparison, by the merged run's path (and baseline's, where one
    merged run is compared with two)."""
    from gradalign.cli import main as cli

    results = {}
    previous = Path.cwd()
    os.chdir(cwd)
    try:
        for argv, comment in readme_commands(heading):
            if argv[:3] == ["python", "-m", "torch.distributed.run"]:
                script = README.parent / argv[-2]  # the example, then its runs' directory
                launch = [sys.executable, *argv[1:-2], str(script), argv[-1]]
                done = subprocess.run(launch, capture_output=True, text=True, timeout=600)
                if done.returncode != 0 and TEARDOWN_ABORT in done.stderr:
                    # gloo's threads aborting a process's exit in torch, after its work: 2 of 5
                    # fresh-clone CI runs, 2 of 17 runs of tests/test_integration_ranks.py alone,
                    # none of 12 launches by hand. Launched once more (its runs replaced whole);
                    # any other failure, or this one twice, still fails
                    done = subprocess.run(launch, capture_output=True, text=True, timeout=600)
                assert done.returncode == 0, done.stderr[-3000:]
            elif argv[0] == "python":
                script = Path(argv[1])
                module = example(script.stem) if script.parent.name == "frameworks" else None
                (module or _load(README.parent / script)).main(argv[2:])
            elif argv[0] == "gradalign":
                with pytest.raises(SystemExit) as done:
                    cli(argv[1:])
                verdict, codes, worst = judged(Path(argv[2]), Path(argv[3]))
                expected = comment.split()[0]
                if expected == "pass":
                    assert (done.value.code or 0, verdict, codes) == (0, "pass", []), argv
                else:
                    assert (done.value.code, codes[:1]) == (1, [expected]), (argv, codes)
                results[argv[3]] = results[f"{argv[2]} {argv[3]}"] = (verdict, codes, worst)
            else:
                assert argv[:2] in (["pip", "install"], [".venv/bin/pip", "install"]), argv
    finally:
        os.chdir(previous)
    return results


def _load(path: Path) -> ModuleType:
    spec = importlib.util.spec_from_file_location(path.stem, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
