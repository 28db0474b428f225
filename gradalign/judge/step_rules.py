"""What two runs' steps show at each element, read against the rounding of the stored weights:
how far the first step's gain lets another run step (`first_step_spread`), and a step decided
by the gradient's sign (`sign_decided`). judge/drift.py's `noise_steps` reads both.
"""

from __future__ import annotations

import numpy as np

from ..runs.model import Run

SIGN_TAU = 4.0  # a sign-decided element's gradient within this many times its own noise
MANTISSA = {"float64": 52, "float32": 23, "float16": 10, "bfloat16": 7}  # stored bits
STEP_ROUNDINGS = 8  # a step computed in the run's dtype errs by up to this many of its units
ABOVE_ROUNDING = 4  # a weight difference this many roundings wide is the gradient's


def first_step_spread(
    gb: np.ndarray,
    gr: np.ndarray,
    rms: float,
    b: np.ndarray,
    pb: np.ndarray,
    r: np.ndarray,
    pr: np.ndarray,
    bits: int,
) -> np.ndarray:
    """At the first update (pb == pr): per element, how much further than the baseline another
    run may step on a gradient error of the tensor's RMS, |b − r|·(rms/|gb − gr| − 1), where
    the baseline's error |gb − gr| was drawn below the RMS and its weight difference |b − r|
    stands ABOVE_ROUNDING times above the rounding of its weight and step (in a dtype of `bits`
    mantissa bits): there the gain |b − r| / |gb − gr| is the optimizer's. 0 elsewhere."""
    dg = np.subtract(gb, gr)
    np.abs(dg, out=dg)
    dw = np.subtract(b, r)
    np.abs(dw, out=dw)
    use = np.equal(pb, pr)
    use &= dg > 0
    use &= dg < rms
    rounding = ulp(np.subtract(b, pb), bits)
    rounding *= STEP_ROUNDINGS
    rounding += ulp(b, bits)
    rounding *= ABOVE_ROUNDING
    use &= dw > rounding
    # every element's gain, selected where used (a gather and scatter of the used ones cost
    # several times these whole-array passes)
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        gain = np.divide(rms, dg)
        gain -= 1.0
        gain *= dw
    return np.where(use, gain, 0.0).astype(np.result_type(b, r), copy=False)


def ulp(x: np.ndarray, bits: int) -> np.ndarray:
    """The spacing of numbers of `bits` stored mantissa bits around each x (at 0: that of 1)."""
    x = np.asarray(x, dtype=np.float64)
    # 2^(e − 1023 − bits) for a normal x of biased exponent e, built from its bits; frexp and
    # ldexp (a few times as slow) where that is no normal number, or x is 0, subnormal or not finite
    biased = (x.view(np.int64) >> 52) & 0x7FF
    biased -= bits
    out = (biased << 52).view(np.float64)
    irregular = (biased <= 0) | (biased >= 0x7FF - bits)
    if irregular.any():
        odd = x[irregular]
        _, exponent = np.frexp(np.where(odd == 0, 1.0, odd))
        out[irregular] = np.ldexp(1.0, exponent - 1 - bits)
    return out


def stored_bits(run: Run) -> dict[str, int]:
    """Each recorded tensor's stored mantissa bits (where its dtype is a float dtype)."""
    return {t.name: MANTISSA[t.dtype] for t in run.tensors if t.dtype in MANTISSA}


def sign_decided(
    own: np.ndarray,
    size: np.ndarray,
    b: np.ndarray,
    step_b: np.ndarray,
    r: np.ndarray,
    step_r: np.ndarray,
    bits: int,
    carried: np.ndarray | None = None,
) -> np.ndarray:
    """From each element's own gradient noise `own` = |gb − gr| and size `size` = |gr|, the
    weights after the update (b, r) and both runs' steps (`step_b` = |Δb|, `step_r` = |Δr|;
    `noise_steps` has them all, read once, and none is written here): per element, whether its
    gradient is within SIGN_TAU times its own noise,
    |gr| <= SIGN_TAU·|gb − gr|, or it drifted before (`carried` > 0) and its gradients stand far
    enough apart that a step following their size would differ beyond the rounding
    (|Δb|·|gb − gr| / |gr| above it: under SGD in float32 the gradients agree to a few ulps and
    the steps with them, which says nothing of a sign), while both runs stepped it
    (beyond the rounding of the weights' `bits` mantissa bits) by the same size to that
    rounding: a step decided by the gradient's sign, which a gradient a quarter or more off its
    own size leaves unchanged. An optimizer whose step follows the gradient's size (SGD, Adam
    after its first step) steps such an element a visible share apart in the two runs. One that
    drifted keeps its state apart: Rprop sizes a step by the signs seen, and where the noise
    chose one sign in one run and the other in the next, the step sizes stand 2.88 times apart
    from then on (1.2 times its size in one, half in the other; model zoo run 186787, a ResNet's
    output bias under Rprop in bfloat16: 1.88 times the baseline's step further at each update,
    0.0063 off by update 8 where its drift allowed 0.0048)."""
    tolerance = ulp(b, bits)
    tolerance += ulp(r, bits)
    tolerance *= ABOVE_ROUNDING
    decided = np.less_equal(size, own * SIGN_TAU)
    if carried is not None:  # drifted before: where a step that follows the gradient's size
        # would stand apart beyond the rounding, |Δb|·|gb − gr| / |gr| > tolerance
        with np.errstate(divide="ignore", invalid="ignore"):
            shown = np.greater(step_b * own / size, tolerance)
        shown &= np.greater(carried, 0.0)
        decided |= shown
    decided &= step_b > tolerance
    decided &= np.abs(step_b - step_r) <= tolerance
    return decided
