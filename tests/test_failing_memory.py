"""A failing compare's memory stays a passing one's, not the model's (judge/fits.py: the
diagnoses read a slice at a time): a numpy model of 24 tensors whose merged run never clears
its gradients is named `grad-not-cleared` within the peak of numpy's and Python's allocations
that judging its clean twin takes (at `1863033`, fitting the carry on the model's gradients
concatenated in float64 took 4.9 times that peak: 240 tensors' bytes against 49)."""

from __future__ import annotations

import tracemalloc

import numpy as np

from gradalign import api
from gradalign.runs.portable import write_run

from .least_squares import as_run

TENSORS, ROWS, COLS, UPDATES, BATCH, LR = 24, 512, 256, 3, 16, 0.05


def _train(dtype, k: int = 1, carry: bool = False) -> dict:
    """Least squares on TENSORS independent weights (each ROWS x COLS, one input batch), SGD;
    `carry`: the window's gradient never cleared, the last window's carried into the next."""
    rng = np.random.default_rng(0)
    x = rng.normal(size=(UPDATES * BATCH, COLS)).astype(np.float32).astype(dtype)
    names = [f"layer{t}.weight" for t in range(TENSORS)]
    y = {n: (x @ rng.normal(size=(COLS, ROWS)) * 0.1).astype(dtype) for n in names}
    w = {n: (rng.normal(size=(ROWS, COLS)) * 0.1).astype(np.float32).astype(dtype) for n in names}
    init = {n: v.copy() for n, v in w.items()}
    snaps, grads, losses, held = [], [], [], {n: np.zeros_like(v) for n, v in w.items()}
    for u in range(UPDATES):
        total = {n: np.zeros_like(v) for n, v in w.items()}
        for j in range(k):
            rows = slice(u * BATCH + j * BATCH // k, u * BATCH + (j + 1) * BATCH // k)
            micro = 0.0
            for n in names:
                err = x[rows] @ w[n].T - y[n][rows]
                micro += float((err**2).mean())
                total[n] += (2 * err.T @ x[rows] / err.size).astype(dtype)
            losses.append(micro)
        g = {n: (total[n] / k + (held[n] if carry else 0)).astype(dtype) for n in names}
        held = g
        grads.append(g)
        w = {n: (w[n] - LR * g[n]).astype(dtype) for n in names}
        snaps.append({n: v.copy() for n, v in w.items()})
    return as_run(init, snaps, grads, losses)


def _peak(base, merged):
    tracemalloc.start()
    try:
        return api.compare(base, merged), tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def test_a_failing_compare_of_many_tensors_takes_what_a_passing_one_does(tmp_path):
    write_run(tmp_path / "ref", accum_steps=1, **_train(np.float64))
    base = write_run(tmp_path / "base", accum_steps=1, reference="../ref", **_train(np.float32))
    clean = write_run(tmp_path / "clean", accum_steps=4, **_train(np.float32, 4))
    carry = write_run(tmp_path / "carry", accum_steps=4, **_train(np.float32, 4, carry=True))
    passed, passing = _peak(base, clean)
    failed, failing = _peak(base, carry)
    assert passed.verdict == "pass", passed.diagnosis
    assert failed.verdict == "fail" and failed.diagnosis[0].code == "grad-not-cleared"
    assert failing < 1.5 * passing, (failing / passing, "times the passing compare's peak")
