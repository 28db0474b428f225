"""judge/apart.py: without a reference, a gradient at an update the runs enter with weights
that differ is judged by grad_rtol_apart; from the same weights, by grad_rtol."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np

from gradalign.judge.apart import judge_apart, parted
from gradalign.judge.metrics import TensorDiff
from gradalign.judge.results import UpdateResult
from gradalign.judge.tolerances import for_dtype


def _result(update: int, weight_gap: float, grad_rel: float, rtol: float = 0.1) -> UpdateResult:
    """One update: weight `w` apart by `weight_gap`, gradient `g` (norm 1) by `grad_rel`,
    judged at `rtol` (bfloat16's grad_rtol)."""
    r = UpdateResult(update, 1.0, 1.0, 0.0, 0.0, 1.0)
    r.weights.append(TensorDiff("w", weight_gap, 0, 0, 1, weight_gap, 1.0, moved=1.0))
    r.grads.append(TensorDiff("g", grad_rel, grad_rel, grad_rel, 1, grad_rel, rtol))
    return r


def _runs(*states) -> tuple[SimpleNamespace, SimpleNamespace]:
    tensors = [SimpleNamespace(name="w")]
    made = [
        SimpleNamespace(
            update_state=None if s is None else np.array(s, np.int64),
            update_state_known=None,
            tensors=tensors,
        )
        for s in states
    ]
    return made[0], made[1]


def test_a_gradient_entered_from_parted_weights_is_judged_by_grad_rtol_apart():
    tol = for_dtype("bfloat16")
    results = [_result(0, 1e-6, 0.02), _result(1, 1e-6, 0.2), _result(2, 0.0, 0.35)]
    notes = judge_apart(results, tol, *_runs(None, None))
    assert [r.grads[0].ok for r in results] == [True, True, False]
    assert results[1].grads[0].allowed == 0.1 + (0.3 - 0.1) * 1.0
    (note,) = notes
    assert "1 gradient(s) at update(s) 1 (g)" in note and "up to 0.2" in note


def test_from_the_same_weights_grad_rtol_holds():
    """The weights after update 0 are bit for bit the same (a float16 GradScaler skipped that
    step): update 1's gradients are judged by grad_rtol, and fail at 0.2 of their norm."""
    tol = for_dtype("bfloat16")
    results = [_result(0, 0.0, 0.02), _result(1, 1e-6, 0.2)]
    assert judge_apart(results, tol, *_runs([[5], [6]], [[5], [7]])) == []
    assert not results[1].grads[0].ok


def test_fingerprints_decide_where_the_judged_weights_show_no_gap():
    """A weight judged beyond its drift shows no error while its bits differ: parted."""
    before = _result(0, 0.0, 0.0)
    assert parted(before, *_runs([[5]], [[6]]))
    assert not parted(before, *_runs([[5]], [[5]]))
    assert not parted(before, *_runs(None, None))


def test_float32_keeps_one_gradient_tolerance():
    results = [_result(0, 1e-6, 0.0, 1e-4), _result(1, 1e-6, 2e-4, 1e-4)]
    assert judge_apart(results, for_dtype("float32"), *_runs(None, None)) == []
    assert not results[1].grads[0].ok


def _loss(update: int, merged: float, allowed: float) -> UpdateResult:
    """One update of loss 3.0 (the merged run's `merged`), weights apart, no gradients."""
    r = UpdateResult(update, 3.0, merged, abs(merged - 3.0), abs(merged - 3.0), allowed)
    r.weights.append(TensorDiff("w", 1e-6, 0, 0, 1, 1e-6, 1.0, moved=1.0))
    return r


def test_a_loss_entered_from_parted_weights_is_judged_by_loss_rtol_apart():
    """float16 autocast, AdamW, a clip after unscale_: the clean merged run's loss at update 5
    stood 3.0e-4 of itself from the baseline's, where loss_rtol allows 1e-4; from update 1 the
    runs' weights differ, and a 16-bit forward at other weights rounds the loss otherwise. At
    update 0 (same weights) loss_rtol still holds."""
    tol = for_dtype("float16")
    allowed = tol.loss_atol + tol.loss_rtol * 3.0
    results = [_loss(0, 3.0009, allowed), _loss(1, 3.0009, allowed), _loss(2, 3.006, allowed)]
    notes = judge_apart(results, tol, *_runs(None, None))
    assert [r.loss_ok for r in results] == [False, True, False]
    (note,) = notes
    assert "the loss at update(s) 1 differed" in note and "loss_rtol_apart 0.001" in note
    float32 = [_loss(0, 3.0009, allowed), _loss(1, 3.0009, allowed)]
    assert judge_apart(float32, for_dtype("float32"), *_runs(None, None)) == []
    assert not float32[1].loss_ok
