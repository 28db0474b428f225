"""Gate gradient accumulation in your own test suite.

    from gradalign.testing import assert_aligned

    def test_my_accumulation(tmp_path):
        record(tmp_path / "k1", accum_steps=1)   # your loop, recording with gradalign.Recorder
        record(tmp_path / "k4", accum_steps=4)
        assert_aligned(tmp_path / "k1", tmp_path / "k4")

A failing call raises AssertionError with the counts, the first failing update and tensor, the
errors against the allowed bounds, the named cause with its fix, and a capped table. Judging
needs no torch.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from .judge.results import FAIL, Comparison

__all__ = ["assert_aligned"]


def assert_aligned(
    baseline: str | Path,
    merged: str | Path,
    reference: str | Path | None = None,
    *,
    strict: bool = False,
    **tolerances: Any,
) -> Comparison:
    """Judge `merged` against `baseline` (run directories or logs) as `gradalign compare` does;
    raise AssertionError when they are not the same training, else return the Comparison.

    `reference`: a float64 rerun of the baseline to calibrate by (default: the one the baseline's
    manifest names; "none" for the fixed tolerances). `strict`: fail where the report warns
    that a check could not see a bug (as `--strict`). `tolerances`: overrides by name
    (`noise_factor=8`, `weight_rtol=1e-3`...). Unreadable or incomparable runs raise
    `gradalign.errors.BadInput`, which is not a verdict; its one-line message shows without
    gradalign's own frames, as the command's does."""
    __tracebackhide__ = True  # pytest: show the message, not this frame
    from .api import compare
    from .errors import BadInput
    from .report.assertion import assertion_message

    try:
        comparison = compare(
            baseline, merged, reference=reference, tolerances=tolerances, strict=strict
        )
    except BadInput as refused:
        raise refused.with_traceback(None) from None
    if comparison.verdict == FAIL:
        raise AssertionError(assertion_message(comparison))
    return comparison
