"""What the tests of gradalign's promises about your files share (tests/test_promises_outputs.py,
tests/test_promises_commits.py, tests/test_promises_writers.py): a directory's exact state, and
a complete verify set of a small config to write over, beside and against."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

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


SPLIT = ("baseline", "baseline-fp64", "merged")
