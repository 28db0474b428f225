"""Least-squares fits over a whole model read a slice at a time (judge/fits.py): the
coefficients and shares a fit of the concatenated model gives, within a few slices of memory
whatever the model's size (a diagnosis used to widen the whole gradient three times)."""

from __future__ import annotations

import tracemalloc

import numpy as np
import pytest

from gradalign.judge.fits import columns, explained, fit, gram, tensor_fits
from gradalign.runs.store import SLICE


def _model(rng, sizes: tuple[int, ...]) -> dict[str, np.ndarray]:
    return {f"t{i}": rng.standard_normal(n).astype(np.float32) for i, n in enumerate(sizes)}


def _difference(m, b, p):
    return m - b, p, b


def test_a_fit_over_every_tensor_is_the_fit_of_the_model_concatenated():
    rng = np.random.default_rng(0)
    sizes = (SLICE * 2 + 5, 7, 1000)
    base, prev = _model(rng, sizes), _model(rng, sizes)
    noise = _model(rng, sizes)
    merged = {n: base[n] + 0.3 * prev[n] + 1e-3 * noise[n] for n in base}
    source = columns((merged, base, prev), list(base), _difference)
    g = gram(source, 3)
    whole = [np.concatenate([np.asarray(t[n], np.float64) for n in base]) for t in (merged, base)]
    delta, carried = whole[0] - whole[1], np.concatenate([prev[n] for n in base]).astype(float)
    (a,), rest = fit(source, g, (1,))
    expected = float(delta @ carried) / float(carried @ carried)
    assert a == pytest.approx(expected, rel=1e-12)
    residual = np.linalg.norm(delta - expected * carried) / np.linalg.norm(delta)
    assert explained(g[0, 0], rest) == pytest.approx(1 - residual, rel=1e-9)
    (a2, b2), _ = fit(source, g, (1, 2))  # on the carried gradient and the baseline's
    solved, *_ = np.linalg.lstsq(np.stack([carried, whole[1]], axis=1), delta, rcond=None)
    assert (a2, b2) == pytest.approx(tuple(solved), rel=1e-9)


def test_a_zero_basis_or_two_along_one_line_fit_nothing():
    rng = np.random.default_rng(1)
    base = _model(rng, (50,))
    zeros = {"t0": np.zeros(50, np.float32)}
    source = columns((base, zeros, zeros), ["t0"], _difference)
    g = gram(source, 3)
    assert fit(source, g, (1,)) == (pytest.approx([0.0]), pytest.approx(g[0, 0]))
    twice = {"t0": 2 * base["t0"]}
    source = columns((twice, zeros, base), ["t0"], lambda m, b, p: (m - b, p, 3 * p))
    assert explained(*(lambda g: (g[0, 0], fit(source, g, (1, 2))[1]))(gram(source, 3))) == 0.0


def test_each_tensor_s_own_fit():
    rng = np.random.default_rng(2)
    start = _model(rng, (300, 400))
    base = _model(rng, (300, 400))
    merged = {"t0": base["t0"] + 0.5 * start["t0"], "t1": base["t1"] - 0.25 * start["t1"]}
    fits = tensor_fits(
        ((n, columns((merged, base, start), [n], lambda m, b, w: (m - b, w, b))) for n in base), 3
    )
    assert fits["t0"].a == pytest.approx(0.5, rel=1e-6)
    assert fits["t1"].a == pytest.approx(-0.25, rel=1e-6)
    assert all(f.rest < 1e-9 * f.gram[0, 0] for f in fits.values())


def test_a_fit_over_a_large_model_holds_a_few_slices_not_the_model():
    """Three sets of 40 tensors of a slice each (120 slices of float64 concatenated, as the fits
    used to read them): the fit allocates under 16 slices of float64 on the way."""
    rng = np.random.default_rng(3)
    one = rng.standard_normal(SLICE).astype(np.float32)
    sets = [{f"t{i}": one * (1 + 0.01 * i + j) for i in range(40)} for j in range(3)]
    names = list(sets[0])
    tracemalloc.start()
    try:
        source = columns(sets, names, _difference)
        g = gram(source, 3)
        fit(source, g, (1, 2))
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 16 * SLICE * 8, peak
