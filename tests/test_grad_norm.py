"""The whole model's gradient norm against the reference (judge/grad_norm.py): a merged norm off
the reference's by more than NORM_FACTOR times the baseline's own, on one side, for NORM_RUN
updates in a row fails, however wide each tensor's noise floor; a clean run's lone spike, a
norm that wanders as the baseline's does, or one without a reference is not failed by it. The
three judges (whole tensors, streamed, sketched) give the same norms."""

from __future__ import annotations

import math

import numpy as np
import pytest

from gradalign import api
from gradalign.config import TrainConfig
from gradalign.judge.compare import compare
from gradalign.judge.grad_norm import (
    NORM,
    NORM_FACTOR,
    NORM_FLOOR,
    NORM_RUN,
    grad_norm_check,
    norm_excess,
)
from gradalign.judge.results import FAIL, NOT_CHECKED, PASS, UpdateResult
from gradalign.report.json_report import to_dict
from gradalign.report.summary import failures_of
from gradalign.runs.reader import read_run_dir


def _results(base: list[float], merged: list[float]) -> list[UpdateResult]:
    """Updates whose whole-model norms stand base[i] and merged[i] times a reference's."""
    rng = np.random.default_rng(0)
    out = []
    for i, (b, m) in enumerate(zip(base, merged, strict=True)):
        ref = float(rng.uniform(0.2, 2.0))
        r = UpdateResult(i, 1.0, 1.0, 0.0, 0.0, 1.0)
        r.grad_norms = (b * ref, m * ref, ref)
        out.append(r)
    return out


def _wandering(n: int, size: float, seed: int) -> list[float]:
    return list(np.exp(np.random.default_rng(seed).normal(0.0, size, n)))


def test_a_gradient_cleared_to_a_third_fails_from_its_first_update():
    base = _wandering(20, 0.01, 1)
    merged = base[:6] + [0.35 * x for x in _wandering(14, 0.01, 2)]
    results = _results(base, merged)
    check = grad_norm_check(results)
    assert check.status == FAIL
    assert [r.update for r in results if r.grad_failed] == list(range(6, 20))
    assert "14/20 updates beyond" in check.detail and "first, update 6" in check.detail
    assert all(not r.ok for r in results[6:]) and all(r.ok for r in results[:6])
    assert norm_excess(results) > 10  # how near: the bench's reading of the same rule


def test_a_clean_run_that_wanders_as_its_baseline_does_passes():
    for seed in range(20):  # both runs part from the reference alike: 5% RMS each
        base, merged = _wandering(30, 0.05, seed), _wandering(30, 0.05, 100 + seed)
        results = _results(base, merged)
        assert grad_norm_check(results).status == PASS, seed
        assert norm_excess(results) < 1
        assert not any(r.problems for r in results)


def test_a_lone_spike_or_one_that_changes_side_passes():
    base = _wandering(20, 0.01, 3)
    spike = list(base)
    spike[12] = 1.6  # a clean run's norm may spike at one update (model zoo run 241056)
    assert grad_norm_check(_results(base, spike)).status == PASS
    sides = list(base)
    sides[8], sides[9] = 1.5, 0.6  # beyond twice, on either side
    assert grad_norm_check(_results(base, sides)).status == PASS
    assert NORM_RUN == 2


def test_the_allowed_factor_is_the_baselines_own_noise_times_the_factor_with_a_floor():
    quiet = [1.0 + 1e-6 * (-1) ** i for i in range(10)]  # float32 runs: the floor
    inside = math.exp(0.9 * NORM_FACTOR * NORM_FLOOR)
    beyond = math.exp(1.1 * NORM_FACTOR * NORM_FLOOR)
    assert grad_norm_check(_results(quiet, [inside] * 10)).status == PASS
    assert grad_norm_check(_results(quiet, [beyond] * 10)).status == FAIL
    loud = [math.exp(0.1 * (-1) ** i) for i in range(10)]  # the baseline 10% off, RMS
    assert grad_norm_check(_results(loud, [math.exp(0.9 * NORM_FACTOR * 0.1)] * 10)).status == PASS
    assert grad_norm_check(_results(loud, [math.exp(1.1 * NORM_FACTOR * 0.1)] * 10)).status == FAIL


def test_where_the_baselines_norm_wanders_for_a_stretch_the_merged_may_wander_as_far():
    """The baseline 1% off the reference's norm but 12% at updates 20 to 26 (model zoo run
    284111: 2.8% RMS over 300 updates, up to 23% between 112 and 149); the merged run 45% off
    at two updates in a row, inside that stretch (6 times its 12% allows 2.05x) or outside it
    (6 times the run's 5.1% RMS allows 1.36x)."""
    base = _wandering(40, 0.01, 5)
    for i in range(20, 27):
        base[i] = math.exp(0.12 * (-1) ** i)
    inside, outside = list(base), list(base)
    inside[22] = inside[23] = 1.45
    outside[32] = outside[33] = 1.45
    assert grad_norm_check(_results(base, inside)).status == PASS
    check = grad_norm_check(_results(base, outside))
    assert check.status == FAIL and "first, update 32" in check.detail
    assert "or its RMS over the 7 updates around where larger" in check.detail


def test_a_merged_norm_of_zero_fails_and_unknown_norms_are_not_checked():
    base = _wandering(6, 0.01, 4)
    check = grad_norm_check(_results(base, [1.0, 1.0, 0.0, 0.0, 0.0, 0.0]))
    assert check.status == FAIL and "first, update 2" in check.detail
    results = _results(base, base)
    for r in results:
        r.grad_norms = None
    assert grad_norm_check(results).status == NOT_CHECKED
    nan = _results(base, base)
    for r in nan[1:]:
        r.grad_norms = (math.nan, 1.0, 1.0)
    assert grad_norm_check(nan).status == NOT_CHECKED  # one update alone


TINY = TrainConfig(hidden=32, updates=6, batch_size=16, accum_steps=4, optimizer="adam")


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("grad_norm")
    out = {}
    for record in ("full", "sketch"):
        config = TINY.replace(record=record)
        base = api.record_baseline(config, root / record / "baseline")
        merged = api.record_merged(config, root / record / "merged")
        out[record] = (base, merged)
    return out


def _judged(base_dir, merged_dir, reference=True, **kwargs):
    base, merged = read_run_dir(base_dir), read_run_dir(merged_dir)
    ref = read_run_dir(base.reference) if reference else None
    return compare(base, merged, reference=ref, **kwargs)


def test_the_three_judges_give_one_norm_and_the_json_keeps_it(runs):
    full = [_judged(*runs["full"], streaming=s) for s in (False, True)]
    sketched = _judged(*runs["sketch"])
    for c in (*full, sketched):
        check = next(x for x in c.checks if x.name == NORM)
        assert c.verdict == "pass" and check.status == PASS, check.detail
    for a, b, s in zip(full[0].results, full[1].results, sketched.results, strict=True):
        assert a.grad_norms is not None and all(x > 0 for x in a.grad_norms)
        assert np.allclose(a.grad_norms, b.grad_norms, rtol=1e-12)
        assert np.allclose(a.grad_norms, s.grad_norms, rtol=1e-12)  # sketches keep exact norms
    row = to_dict(full[1])["per_update"][3]
    assert set(row["grad_norms"]) == {"baseline", "merged", "reference"}
    assert row["grad_norms"]["merged"] == pytest.approx(full[1].results[3].grad_norms[1])
    alone = _judged(*runs["full"], reference=False)
    assert to_dict(alone)["per_update"][3]["grad_norms"] is None
    assert NORM not in [x.name for x in alone.checks]


def test_a_loss_left_undivided_fails_the_norm_check_too(runs, tmp_path):
    config = TINY.replace(record="full")
    merged = api.record_merged(config, tmp_path / "merged", fault="no-loss-scale")
    c = _judged(runs["full"][0], merged)
    check = next(x for x in c.checks if x.name == NORM)
    assert check.status == FAIL and "first, update 0" in check.detail
    assert [d.code for d in c.diagnosis][:1] == ["loss-scale"]
    shown = failures_of(c, NORM)  # the JUnit and Markdown reports list each update's finding
    assert shown and shown[0].update == 0 and "times the reference's" in shown[0].name
    assert any("whole-model gradient norm" in t for t in to_dict(c)["per_update"][0]["problems"])


def test_a_gradient_zeroed_every_micro_step_fails_where_every_tensor_passed(tmp_path):
    """Model zoo run 236502 (transformers' Mixtral under Adamax, K=8, bfloat16 autocast,
    recorded with sketches): gradients zeroed at every micro-step from update 6 passed every
    tensor's noise floor (each allowed a third of its size), the whole-model norm 0.32 to 0.47
    of the reference's where the baseline's stood within 2.3% of it. It fails this check,
    named; the same loop without the bug passes it."""
    pytest.importorskip("transformers")
    from .zoo_runs import one_thread, zoo

    both = {"autocast": "bfloat16", "sketch": True, "updates": 20}
    loop = {"sketch": True, "updates": 20}
    with one_thread():
        zoo.record(tmp_path / "ref", "hf-mixtral", "adamax", 1, 236502, float64=True, **loop)
        zoo.record(tmp_path / "base", "hf-mixtral", "adamax", 1, 236502, reference="../ref",
                   **both)  # fmt: skip
        zoo.record(tmp_path / "merged", "hf-mixtral", "adamax", 8, 236502, **both)
        zoo.record(tmp_path / "bug", "hf-mixtral", "adamax", 8, 236502, **both,
                   bug="zero-grad-every-micro", bug_from=6)  # fmt: skip
    clean = _judged(tmp_path / "base", tmp_path / "merged")
    assert clean.verdict == "pass", [d.message for d in clean.diagnosis]
    assert norm_excess(clean.results) < 1
    bug = _judged(tmp_path / "base", tmp_path / "bug")
    check = next(x for x in bug.checks if x.name == NORM)
    assert check.status == FAIL and "first, update 6" in check.detail, check.detail
    assert bug.diagnosis[0].code == "zero-grad-in-window"
    assert bug.first_divergence["update"] == 6 and bug.first_divergence["in"] == "gradient"


def test_a_pass_never_on_one_side_twice_in_a_row_says_so():
    """A merged norm that crossed the reference's at every update read "within 0x of what is
    allowed ... over any 2 updates in a row": no two updates in a row lie on one side."""
    base = [1.0] * 6
    merged = [1 + 1e-7 * (-1) ** i for i in range(6)]
    check = grad_norm_check(_results(base, merged))
    assert check.status == PASS
    assert "never on one side of the reference's 2 updates in a row" in check.detail
    assert "0x" not in check.detail.split(";")[0], check.detail
    steady = grad_norm_check(_results(base, [1 + 1e-7] * 6))
    assert "within " in steady.detail and "over any 2 updates in a row" in steady.detail
