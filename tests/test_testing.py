"""`gradalign.testing.assert_aligned`: a pass returns the comparison; a failure raises an
AssertionError that reads like pytest-regressions' (counts, first failure, cause and fix, a
capped table)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

import gradalign
from gradalign.api import compare
from gradalign.config import TrainConfig
from gradalign.errors import BadInput
from gradalign.record.faults import get_fault
from gradalign.record.loop import train
from gradalign.testing import assert_aligned

from .conftest import SMALL


@pytest.fixture(scope="module")
def buggy(tmp_path_factory, small_runs):
    fault = get_fault("no-loss-scale", TrainConfig())
    return train(SMALL, tmp_path_factory.mktemp("bug") / "merged", fault=fault)


def test_an_aligned_pair_passes(small_runs):
    comparison = assert_aligned(small_runs["baseline"], small_runs["merged"])
    assert comparison.verdict == "pass"


def test_a_failing_call_names_the_cause(small_runs, buggy):
    with pytest.raises(AssertionError) as info:
        assert_aligned(small_runs["baseline"], buggy)
    message = str(info.value)
    first, *rest = message.splitlines()
    assert re.search(r"is not the same training as .*: 3 of \d+ checks failed", first), first
    assert "failing quantities in 4 of 4 updates" in first
    assert rest[0].startswith("first failure: update 0, gradient of 0.weight: error ")
    assert "> allowed" in rest[0]
    kinds = {line.split(":")[0]: line for line in rest[1:4]}  # per kind: count, max and mean
    assert set(kinds) == {"gradient", "weights", "loss"}
    counts = sum(int(re.search(r": (\d+) failing", line).group(1)) for line in kinds.values())
    assert f"{counts} failing quantities" in first
    assert all(re.search(r"error/allowed max \S+x \(update \d", v) for v in kinds.values())
    assert any(
        line.startswith("cause loss-scale: the micro-batch losses were not divided by K=4")
        for line in rest
    )
    assert "  fix: divide each micro-batch's loss by K before backward()" in rest
    table = rest[rest.index("") + 1 :]
    assert table[0].split() == ["update", "quantity", "tensor", "error", "allowed", "err/allowed"]
    assert len(table) == 1 + 10 + 1 and table[-1].startswith("(showing 10 of ")


def test_tolerances_are_passed_by_name(small_runs):
    assert_aligned(small_runs["baseline"], small_runs["merged"], reference="none")
    with pytest.raises(AssertionError):  # nothing allowed: float32 sums in another order differ
        assert_aligned(
            small_runs["baseline"],
            small_runs["merged"],
            reference="none",
            grad_rtol=0.0,
            weight_rtol=0.0,
            weight_atol=0.0,
        )
    with pytest.raises(BadInput, match="unknown tolerance"):
        assert_aligned(small_runs["baseline"], small_runs["merged"], weight_rtoll=1.0)


def test_a_refusal_shows_its_message_without_gradalign_frames(tmp_path, small_runs):
    """A test that gives a missing run reads one line, as the command prints it, not a
    traceback through the judge (pytest hides the frame of `assert_aligned` itself)."""
    with pytest.raises(BadInput, match="no such") as info:
        assert_aligned(small_runs["baseline"], tmp_path / "never-recorded")
    package = Path(gradalign.__file__).parent
    inside = [e.path for e in info.traceback if Path(e.path).is_relative_to(package)]
    assert inside == [package / "testing.py"], inside
    assert info.value.__cause__ is None and info.value.__suppress_context__


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """A float64 rerun of the small baseline."""
    float64 = SMALL.replace(accum_steps=1, dtype="float64")
    return train(float64, tmp_path_factory.mktemp("f64") / "r")


@pytest.mark.parametrize(
    "judged",
    [{"reference": True}, {"reference": "none"}, {"grad_rtol": 0.5, "weight_rtol": 0.25}],
    ids=["a reference", "none", "overrides"],
)
def test_the_every_one_command_judges_as_the_test_did(
    small_runs, buggy, reference, tmp_path, cli, judged
):
    """The message's command for the whole list left out the reference and the tolerances: it
    judged another way (no noise floor, other bounds) and listed other failures."""
    import json
    import shlex

    if judged.get("reference") is True:
        judged = {"reference": reference}
    with pytest.raises(AssertionError) as info:
        assert_aligned(small_runs["baseline"], buggy, **judged)
    last = str(info.value).splitlines()[-1]
    words = shlex.split(re.search(r"every one: (.*)\)$", last).group(1))
    assert words[:2] == ["gradalign", "compare"] and words[-2:] == ["--json", "report.json"]
    report = tmp_path / "report.json"
    assert cli(*words[1:-1], report).code == 1
    judged_by = json.loads(report.read_text())
    test = compare(small_runs["baseline"], buggy, **_split(judged))  # as assert_aligned judged
    assert judged_by["tolerances"] == test.tolerances.to_dict()
    assert judged_by["reference"] == (test.reference.source if test.reference else None)
    assert judged_by["verdict"] == test.verdict


def _split(judged: dict) -> dict:
    """assert_aligned's keywords as api.compare takes them."""
    tolerances = {k: v for k, v in judged.items() if k != "reference"}
    return {"reference": judged.get("reference"), "tolerances": tolerances}


def test_strict_is_an_option_not_a_tolerance(small_runs):
    """`strict=True` was taken for a tolerance ("unknown tolerance 'strict'")."""
    comparison = assert_aligned(small_runs["baseline"], small_runs["merged"], strict=True)
    assert comparison.verdict == "pass"


def test_findings_in_words_are_counted_with_the_rest():
    """The gradient norm's failures are words, not ratios: they were left out of the per-kind
    lines (118 failing quantities, the lines adding up to 107), and their text stretched the
    table's error column to ~90 characters."""
    from gradalign.report.assertion import FINDING_WIDTH, _per_kind, _table
    from gradalign.report.summary import Failure

    text = "the whole-model gradient norm 1.31 times the reference's, 1.062 allowed " * 2
    found = [
        Failure(0, "gradient", "w", 2.0, 1.0, None),
        Failure(0, "gradient norm", text, None, None),
        Failure(1, "gradient norm", text, None, None),
    ]
    assert _per_kind(found)[1] == "gradient norm: 2 failing"
    rows = _table(found)
    assert text[: FINDING_WIDTH - 3] + "..." in rows[2] and max(map(len, rows)) < len(text), rows
