"""A gradient summed in a 16-bit buffer, within what the runs may differ by: rounding leaves no
float32 sum of many terms a 16-bit number, so where every value of the merged gradient is one
and the baseline's are not, the run fails by `grad-accum-dtype` whatever its numbers
(judge/below_noise.py `narrow_sums`). Least squares under SGD (tests/least_squares.py), wide
enough to read, judged by fixed tolerances that let 0.3% through; and model zoo runs whose
kinks parted them beyond that rounding."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from gradalign import api
from gradalign.judge import below_noise
from gradalign.runs.portable import write_run
from tests.least_squares import Shape, reference_and_baseline, train

from .zoo_runs import _compare, _one_thread_judge, one_thread, zoo

WIDE = Shape(rows=200)  # 1,200 gradient values: enough to read (undeclared.EVIDENT)
# judged by fixed tolerances that let 0.3% of a gradient and of a step through
LOOSE = {"grad_rtol": 0.02, "weight_rtol": 0.02, "loss_rtol": 0.02}


def _bfloat16_from(update: int):
    def narrow(u, g):
        return g.astype(ml_dtypes.bfloat16).astype(np.float32) if u >= update else g

    return narrow


@pytest.fixture(scope="module")
def wide(tmp_path_factory) -> dict:
    root = tmp_path_factory.mktemp("narrow")
    ref, base = reference_and_baseline(root, lambda dtype: train(dtype, shape=WIDE))
    return {"root": root, "base": base, "ref": ref}


def _merged(wide, name: str, spike=None):
    run = train(np.float32, k=4, spike=spike, feed=True, shape=WIDE)
    path = write_run(wide["root"] / name, accum_steps=4, **run)
    return api.compare(wide["base"], path, reference="none", tolerances=LOOSE)


def test_a_gradient_summed_in_bfloat16_within_the_tolerance_fails_by_it(wide):
    c = _merged(wide, "bf16-from-5", _bfloat16_from(5))
    assert c.verdict == "fail" and c.diagnosis[0].code == "grad-accum-dtype", c.diagnosis
    assert c.diagnosis[0].evidence["update"] == 5
    assert all(r.ok for r in c.results)  # every number within what LOOSE allows
    (check,) = [k for k in c.checks if k.name == below_noise.NARROW_CHECK]
    assert check.status == "fail" and "at update 5" in check.detail


def test_a_bfloat16_sum_scaled_after_it_fails_by_it_too(wide):
    """Each value a bfloat16 number times one factor (a clip that engaged after the sum): no
    value is 16-bit, but the tensor holds at most 2^7 mantissas, where the baseline's hold
    about as many as values."""

    def scaled(u, g):
        return _bfloat16_from(5)(u, g) * np.float32(0.9993) if u >= 5 else g

    c = _merged(wide, "bf16-scaled-from-5", scaled)
    assert c.verdict == "fail" and c.diagnosis[0].code == "grad-accum-dtype", c.diagnosis
    assert c.diagnosis[0].evidence["update"] == 5
    assert "times one factor" in c.diagnosis[0].message


def test_without_the_reading_it_passes(wide, monkeypatch):
    monkeypatch.setattr(below_noise, "narrow_sums", lambda c: None)
    assert _merged(wide, "bf16-unread", _bfloat16_from(5)).verdict == "pass"


def test_a_clean_merged_run_and_a_sixteen_bit_baseline_are_not_read_so(wide, tmp_path):
    assert _merged(wide, "clean").verdict == "pass"
    # a baseline computed in bfloat16 (exact there) beside a merged run summing in float32:
    # the merged values are wider, nothing to read
    narrow = {**train(np.float32, shape=WIDE, spike=_bfloat16_from(0), feed=True)}
    base = write_run(tmp_path / "base16", accum_steps=1, **narrow)
    merged = write_run(tmp_path / "merged32", accum_steps=4, **train(np.float32, k=4, shape=WIDE))
    c = api.compare(base, merged, reference="none", tolerances=LOOSE)
    assert not any(k.name == below_noise.NARROW_CHECK for k in c.checks)


@pytest.mark.parametrize(
    ("seed", "model", "optimizer", "k", "bug_from"),
    [(195331, "convtext", "rmsprop", 8, 8), (195346, "encoder", "adam-eps6", 2, 20)],
)
def test_gradients_summed_in_bfloat16_after_kinks_are_named(
    tmp_path, seed, model, optimizer, k, bug_from
):
    """Model zoo runs 195331 and 195346 (float32, 40 updates) with gradients summed in bfloat16
    from after their first kink, a few tenths of a percent off, within the divergence the kinks'
    size and the runs' parting allow; the first passed (its parting followed), the second
    passed before that too. Named now, at the update the bug starts."""
    row = _one_thread_judge(
        tmp_path, model, optimizer, k, seed, "bf16-accum", updates=40, bug_from=bug_from
    )
    assert row["verdict"] == "fail" and row["codes"][:1] == ["grad-accum-dtype"], row


def _sixteen_bit_baseline(tmp_path):
    """A baseline whose every gradient value is a bfloat16 number (computed in bfloat16, as a
    linear map's under autocast), declared float32."""
    run = train(np.float32, shape=WIDE, spike=_bfloat16_from(0), feed=True)
    return write_run(tmp_path / "base16", accum_steps=1, grad_dtype="float32", **run)


def _summed(tmp_path, name: str, narrow, grad_dtype: str | None = "float32"):
    run = train(np.float32, k=4, spike=narrow, feed=True, shape=WIDE)
    return write_run(tmp_path / name, accum_steps=4, grad_dtype=grad_dtype, **run)


def test_a_sum_of_sixteen_bit_gradients_kept_sixteen_bit_fails_beside_a_sixteen_bit_baseline(
    tmp_path,
):
    """The baseline's values are bfloat16 numbers too: the merged run's, declared float32 and
    summed over K=4, are bfloat16 numbers at update 5 and the next: named there (`_summed_narrow`).
    Declared of no dtype, or 16-bit at update 5 alone (a window whose other micro-batches added
    nothing), it is not read so; a merged run summing in float32 neither."""
    base = _sixteen_bit_baseline(tmp_path)
    c = api.compare(
        base, _summed(tmp_path, "m", _bfloat16_from(5)), reference="none", tolerances=LOOSE
    )
    assert c.verdict == "fail" and c.diagnosis[0].code == "grad-accum-dtype", c.diagnosis
    assert c.diagnosis[0].evidence["update"] == 5
    assert c.diagnosis[0].evidence["summed_declared_float32"] is True
    assert "sums K=4 micro-batches' 16-bit gradients in float32" in c.diagnosis[0].message

    def once(u, g):
        return _bfloat16_from(5)(u, g) if u == 5 else g

    for merged in (
        _summed(tmp_path, "undeclared", _bfloat16_from(5), grad_dtype=None),
        _summed(tmp_path, "once", once),
        _summed(tmp_path, "wide", None),
    ):
        c = api.compare(base, merged, reference="none", tolerances=LOOSE)
        assert not any(d.code == "grad-accum-dtype" for d in c.diagnosis), (merged, c.diagnosis)


@pytest.mark.parametrize(
    ("seed", "model", "optimizer", "k", "reading"),
    [
        (201001, "encoder", "rprop", 2, "summed in float32 hold"),
        (201002, "lnmlp", "sgd-mom", 4, "sums K=4"),
    ],
)
def test_a_bfloat16_sum_under_bfloat16_autocast_is_named(
    tmp_path, seed, model, optimizer, k, reading
):
    """Model zoo runs 201001 and 201002 (bfloat16 autocast, 20 updates, the sum rounded to
    bfloat16 from update 6) passed within the noise: under autocast most of the baseline's values
    are bfloat16 numbers too (a linear map's gradient). The encoder's LayerNorms and embedding,
    summed in float32, hold the baseline's wide values; in the MLP every baseline value is a
    bfloat16 number, and the merged run's sum over K=4 in float32 would seldom be one."""
    loop = {"updates": 20, "autocast": "bfloat16"}
    with one_thread():
        zoo.record(tmp_path / "ref", model, optimizer, 1, seed, float64=True, updates=20)
        zoo.record(tmp_path / "base", model, optimizer, 1, seed, reference="../ref", **loop)
        zoo.record(
            tmp_path / "merged", model, optimizer, k, seed, bug="bf16-accum", bug_from=6, **loop
        )
    c = _compare(tmp_path)
    assert c.verdict == "fail" and c.diagnosis[0].code == "grad-accum-dtype", c.diagnosis
    assert c.diagnosis[0].evidence["update"] == 6
    assert reading in c.diagnosis[0].message, c.diagnosis[0].message
    # the encoder by its wide tensors alone, the MLP by its sums
    assert c.diagnosis[0].evidence["summed_declared_float32"] is (model == "lnmlp")
