"""The drift's per-element arithmetic (judge/drift.py) runs branch-free for speed: these tests hold
it to the plain formulas its docstrings state, written here with boolean indexing as they read,
bit for bit on finite inputs that mix every case (elements dominated by their noise and not,
gradients of 0, ties, elements that drifted before, the first update's spread, weights near 0,
subnormal and huge)."""

from __future__ import annotations

import numpy as np
import pytest

from gradalign.judge import drift, step_rules
from gradalign.judge.drift import TAU
from gradalign.judge.step_rules import ABOVE_ROUNDING, SIGN_TAU, STEP_ROUNDINGS


def _ulp(x, bits):
    _, exponent = np.frexp(np.where(x == 0, 1.0, x))
    return np.ldexp(1.0, exponent - 1 - bits)


def _spread(gb, gr, rms, b, pb, r, pr, bits):
    dg, dw = np.abs(gb - gr), np.abs(b - r)
    rounding = _ulp(b, bits) + STEP_ROUNDINGS * _ulp(b - pb, bits)
    use = (pb == pr) & (dg > 0) & (dg < rms) & (dw > ABOVE_ROUNDING * rounding)
    out = np.zeros_like(dw)
    out[use] = dw[use] * (rms / dg[use] - 1.0)
    return out


def _sign_decided(gb, gr, b, pb, r, pr, bits, carried):
    tolerance = ABOVE_ROUNDING * (_ulp(b, bits) + _ulp(r, bits))
    step_b, step_r = np.abs(b - pb), np.abs(r - pr)
    near = np.abs(gr) <= SIGN_TAU * np.abs(gb - gr)
    if carried is not None:
        with np.errstate(divide="ignore", invalid="ignore"):
            shown = step_b * np.abs(gb - gr) / np.abs(gr) > tolerance
        near |= (carried > 0) & shown
    return near & (step_b > tolerance) & (np.abs(step_b - step_r) <= tolerance)


def _noise_steps(gb, gr, rms, b, pb, r, pr, bits=None, carried=None, idle_step=0.0, first=False):
    noise = TAU * np.maximum(np.abs(gb - gr), rms)
    size = np.abs(gr)
    dominated = size <= noise
    if bits is not None and not first:
        dominated |= _sign_decided(gb, gr, b, pb, r, pr, bits, carried)
    steps = np.abs(b - pb) + np.abs(r - pr)
    explained = np.zeros_like(steps)
    rest = ~dominated
    explained[rest] = noise[rest] / size[rest] * steps[rest]
    if carried is not None:
        later = (carried > 0) & rest
        explained[later] = steps[later]
    out = np.where(dominated, steps, 0.0)
    if idle_step > 0:  # dominated, stepped by neither run, on a gradient not 0
        out[dominated & (steps == 0) & ((gb != 0) | (gr != 0))] = idle_step
    if bits is not None and first:
        out[rest] += _spread(gb, gr, rms, b, pb, r, pr, bits)[rest]
    return out, float(np.sum(explained * explained)), float(steps.max())


def _shared_steps(gb, gm, rms, b, pb, m, pm):
    noise = TAU * np.maximum(np.abs(gb - gm), rms)
    size = np.maximum(np.abs(gb), np.abs(gm))
    share = np.ones_like(size)
    above = size > noise
    share[above] = noise[above] / size[above]
    share[(size == 0) & ((b == pb) != (m == pm))] = 0.0
    share[((b - pb) * (m - pm) < 0) & (gb != gm)] = 1.0
    return (np.abs(b - pb) + np.abs(m - pm)) * share


def _runs(seed: int, n: int = 4096):
    """Two runs' gradients and weights around one update, every case mixed in."""
    rng = np.random.default_rng(seed)
    scale = 10.0 ** rng.integers(-8, 3, n)
    gb = rng.standard_normal(n) * scale
    gr = gb + rng.standard_normal(n) * scale * 10.0 ** rng.integers(-9, 1, n)
    gr[rng.random(n) < 0.05] = 0.0  # gradients of 0, in one run or both
    gb[rng.random(n) < 0.05] = 0.0
    tie = rng.random(n) < 0.05
    gr[tie] = TAU * np.abs(gb[tie] - gr[tie])  # |gr| exactly at its noise
    pb = rng.standard_normal(n) * 10.0 ** rng.integers(-3, 2, n)
    pb[rng.random(n) < 0.02] = 0.0
    pb[:4] = [5e-324, 1e-310, 1e300, -2.2250738585072014e-308]
    pr = np.where(rng.random(n) < 0.9, pb, pb + 1e-3)  # most started from one weight
    b = pb - 1e-3 * gb * (rng.random(n) < 0.9)  # some not stepped at all
    r = pr - 1e-3 * gr + rng.standard_normal(n) * 1e-9 * (rng.random(n) < 0.5)
    still = rng.random(n) < 0.05  # stepped by neither run (Rprop after a sign flip)
    b[still], r[still] = pb[still], pr[still]
    sign = rng.random(n) < 0.1  # stepped by the gradient's sign alone (Rprop, Lion)
    b[sign], r[sign] = pb[sign] - 1e-3 * np.sign(gb[sign]), pr[sign] - 1e-3 * np.sign(gr[sign])
    carried = np.where(rng.random(n) < 0.3, rng.random(n), 0.0)
    return gb, gr, b, pb, r, pr, carried


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("bits", [None, 7, 23, 52])
@pytest.mark.parametrize("with_carried", [False, True])
@pytest.mark.parametrize("idle_step", [0.0, 3e-3])
@pytest.mark.parametrize("first", [False, True])
def test_noise_steps_equal_the_plain_formula_bit_for_bit(
    seed, bits, with_carried, idle_step, first
):
    gb, gr, b, pb, r, pr, carried = _runs(seed)
    rms = float(np.sqrt(np.mean((gb - gr) ** 2)))
    for noise_rms in (rms, 0.0, rms * 1e6):
        before = carried if with_carried else None
        args = (gb, gr, noise_rms, b, pb, r, pr, bits, before, idle_step, first)
        got, want = drift.noise_steps(*args), _noise_steps(*args)
        assert np.array_equal(got[0], want[0])
        assert got[1] == pytest.approx(want[1], rel=1e-12, abs=0.0)
        assert got[2] == want[2]


@pytest.mark.parametrize("seed", range(6))
def test_shared_steps_equal_the_plain_formula_bit_for_bit(seed):
    gb, gm, b, pb, m, pm, _ = _runs(seed)
    rms = float(np.sqrt(np.mean((gb - gm) ** 2)))
    for noise_rms in (rms, 0.0, np.inf):  # inf: a tensor whose gradient is noise as a whole
        got = drift.shared_steps(gb, gm, noise_rms, b, pb, m, pm)
        assert np.array_equal(got, _shared_steps(gb, gm, noise_rms, b, pb, m, pm))


@pytest.mark.parametrize("bits", [7, 10, 23, 52])
def test_the_spacing_of_numbers_equals_frexp_and_ldexp_everywhere(bits):
    rng = np.random.default_rng(bits)
    x = rng.standard_normal(20000) * 10.0 ** rng.integers(-320, 308, 20000)
    special = [0.0, -0.0, np.inf, -np.inf, np.nan, 5e-324, 2.2250738585072014e-308]
    x = np.concatenate([x, special, [1.7976931348623157e308, 1.0, -1.0, 2.0**-1000]])
    got, want = step_rules.ulp(x, bits), _ulp(x, bits)
    assert np.array_equal(got, want, equal_nan=True)


def test_the_first_step_spread_equals_the_plain_formula_on_a_2d_tensor():
    gb, gr, b, pb, r, pr, _ = _runs(7, n=64 * 64)
    rms = float(np.sqrt(np.mean((gb - gr) ** 2)))
    shaped = [x.reshape(64, 64) for x in (gb, gr, b, pb, r, pr)]
    got = step_rules.first_step_spread(*shaped[:2], rms, *shaped[2:], 23)
    want = _spread(*shaped[:2], rms, *shaped[2:], 23)
    assert got.shape == want.shape and np.array_equal(got, want)
    assert np.count_nonzero(want) > 10  # the spread is read somewhere: the test can fail
