"""judge/apart.py: without a reference, a gradient at an update the runs enter with weights
that differ is judged by grad_rtol_apart; from the same weights, by grad_rtol."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

from gradalign.judge.apart import entered_apart, judge_apart, parted
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


def _judge_apart(results: list[UpdateResult], tol, base, merged) -> list[str]:
    """`judge_apart` after each result was marked as compare's loop marks it."""
    for before, result in zip([None, *results], results, strict=False):
        result.entered_apart = entered_apart(before, result.update, base, merged)
    return judge_apart(results, tol)


def test_a_gradient_entered_from_parted_weights_is_judged_by_grad_rtol_apart():
    tol = for_dtype("bfloat16")
    results = [_result(0, 1e-6, 0.02), _result(1, 1e-6, 0.2), _result(2, 0.0, 0.35)]
    notes = _judge_apart(results, tol, *_runs(None, None))
    assert [r.grads[0].ok for r in results] == [True, True, False]
    assert results[1].grads[0].allowed == 0.1 + (0.3 - 0.1) * 1.0
    (note,) = notes
    assert "1 gradient(s) at update(s) 1 (g)" in note and "up to 0.2" in note


def test_from_the_same_weights_grad_rtol_holds():
    """The weights after update 0 are bit for bit the same (a float16 GradScaler skipped that
    step): update 1's gradients are judged by grad_rtol, and fail at 0.2 of their norm."""
    tol = for_dtype("bfloat16")
    results = [_result(0, 0.0, 0.02), _result(1, 1e-6, 0.2)]
    assert _judge_apart(results, tol, *_runs([[5], [6]], [[5], [7]])) == []
    assert not results[1].grads[0].ok


def test_fingerprints_decide_where_the_judged_weights_show_no_gap():
    """A weight judged beyond its drift shows no error while its bits differ: parted."""
    before = _result(0, 0.0, 0.0)
    assert parted(before, *_runs([[5]], [[6]]))
    assert not parted(before, *_runs([[5]], [[5]]))
    assert not parted(before, *_runs(None, None))


def test_float32_keeps_one_gradient_tolerance():
    results = [_result(0, 1e-6, 0.0, 1e-4), _result(1, 1e-6, 2e-4, 1e-4)]
    assert _judge_apart(results, for_dtype("float32"), *_runs(None, None)) == []
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
    notes = _judge_apart(results, tol, *_runs(None, None))
    assert [r.loss_ok for r in results] == [False, True, False]
    (note,) = notes
    assert "the loss at update(s) 1 differed" in note and "loss_rtol_apart 0.001" in note
    float32 = [_loss(0, 3.0009, allowed), _loss(1, 3.0009, allowed)]
    assert _judge_apart(float32, for_dtype("float32"), *_runs(None, None)) == []
    assert not float32[1].loss_ok


def _sign_steps(noise: float, seed: int, extra=None) -> dict:
    """A run of an optimizer that steps each element by lr·sign(g) (RMSprop's and Adam's first
    steps): 4 updates of a 64x64 weight declared to compute in bfloat16. Its gradient is the
    shared true one plus this run's draw of noise: 1e-3 of the gradient's RMS at update 0 (both
    runs start from the same weights), `noise` of it later (the runs entered apart). `extra(u,
    w)` alters the weights after update u (a bug in the step)."""
    truth, own = np.random.default_rng(0), np.random.default_rng(seed)
    w = truth.normal(size=(64, 64)).astype(np.float32)
    init, snaps, grads = {"w": w.copy()}, [], []
    for u in range(4):
        g = truth.normal(size=w.shape) + own.normal(size=w.shape) * (noise if u else 1e-3)
        w = (w - 1e-2 * np.sign(g)).astype(np.float32)
        if extra is not None:
            w = extra(u, w)
        grads.append({"w": g.astype(np.float32)})
        snaps.append({"w": w.copy()})
    return {"init_weights": init, "update_weights": snaps, "grads": grads,
            "micro_losses": [1.0] * 4, "optimizer_steps": [1] * 4}  # fmt: skip


@pytest.mark.parametrize("streaming", [True, False])
def test_the_drift_counts_where_a_gradient_passes_by_grad_rtol_apart(tmp_path, streaming):
    """Gradients 20% apart after update 0 pass by grad_rtol_apart (0.3 in bfloat16), not by
    grad_rtol (0.1); the elements whose sign the noise flipped step 2·lr apart. The drift counts
    those steps where the gradient passes by the tolerance that judges it: counted at grad_rtol
    alone, a clean run failed by its weights at update 1 (a GPT-NeoX under RMSprop and bfloat16
    autocast without a reference, 1.55x). The allowance stays each element's: a quarter of the
    elements stepped 30·lr further than their gradients' noise explains still fails."""
    from gradalign.judge.compare import compare
    from gradalign.runs.portable import write_run
    from gradalign.runs.reader import read_run_dir

    def judged(merged):
        return compare(read_run_dir(base), read_run_dir(merged), streaming=streaming)

    declared = {"compute_dtype": "bfloat16", "accum_steps": 1}
    base = write_run(tmp_path / "base", **declared, **_sign_steps(0.2, 1))
    clean = write_run(tmp_path / "clean", **declared, **_sign_steps(0.2, 2))
    result = judged(clean)
    assert result.verdict == "pass", [
        (r.update, [w.ratio for w in r.weights]) for r in result.results
    ]
    assert any("pass by grad_rtol_apart 0.3" in note for note in result.notes)
    assert max(r.grads[0].rel_l2 for r in result.results[1:]) > 0.1  # beyond grad_rtol

    def pushed(u, w):  # a quarter of the elements stepped 30·lr further at update 2
        if u == 2:
            w[:16] -= 0.3
        return w

    bug = write_run(tmp_path / "bug", **declared, **_sign_steps(0.2, 2, pushed))
    failed = judged(bug)
    assert failed.verdict == "fail"
    assert next(r.update for r in failed.results if not all(w.ok for w in r.weights)) == 2
