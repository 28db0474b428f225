"""Helpers for the framework integration tests: the example scripts they run, the frameworks they
need, and the verdict, codes and margin of a comparison."""

from __future__ import annotations

import importlib
import os
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
