"""Gradients at updates both runs' optimizers skipped (a GradScaler that found an inf: no
optimizer step in either run, recorded) that are not finite are not judged
(judge/skipped_steps.py): recorded after `unscale_()`, they hold the inf that made the scaler
skip, and neither run stepped with them. A cold probe's loop (fp16 autocast, a GradScaler at
init_scale 2**30 skipping updates 0 to 10 in both runs, `rec.grads()` after `unscale_()`)
failed every such update at infx, `cross-sample-loss`; the same loop without `rec.grads()`
passed. A skip in one run only is still `scaler-skips`, and a gradient off at a step taken
still fails."""

from __future__ import annotations

import numpy as np
import pytest

from gradalign.judge.compare import compare
from gradalign.runs.reader import read_run_dir

from .conftest import write_w_run

K, N, SKIPPED = 4, 8, (0, 1, 2)


def _run(path, k: int, skipped=SKIPPED, scale_from: int | None = None, float64: bool = False):
    """One tensor w stepped by SGD (lr 0.1) on the gradient g_u = 0.3 + 0.01·u, except at the
    skipped updates, whose gradients are inf and whose weights do not move; from `scale_from`
    the gradient is K times larger (a loss not divided by K)."""
    dtype = np.float64 if float64 else np.float32
    init = np.linspace(-1.0, 1.0, 16, dtype=np.float32).astype(dtype)
    w, weights, grads = init.copy(), [], []
    for u in range(N):
        g = np.full(16, 0.3 + 0.01 * u, dtype)
        if scale_from is not None and u >= scale_from:
            g = g * K
        if u in skipped:
            g = np.full(16, np.inf, dtype)
        else:
            w = (w - 0.1 * g).astype(dtype)
        weights.append(w.copy())
        grads.append(g)
    steps = [0 if u in skipped else 1 for u in range(N)]
    scales = [2.0 ** (16 - sum(1 for v in skipped if v < u)) for u in range(N)]  # halved a skip
    return read_run_dir(
        write_w_run(path, k, init, weights, grads, optimizer_steps=steps, loss_scale=scales)
    )


@pytest.mark.parametrize("reference", [True, False], ids=["reference", "no-reference"])
def test_gradients_of_steps_both_runs_skipped_are_not_judged(tmp_path, reference):
    base, merged = _run(tmp_path / "b", 1), _run(tmp_path / "m", K)
    ref = _run(tmp_path / "r", 1, float64=True) if reference else None
    c = compare(base, merged, reference=ref)
    assert c.verdict == "pass", [d.code for d in c.diagnosis]
    (note,) = [n for n in c.notes if "both runs' optimizers skipped the step" in n]
    assert note.startswith("update(s) 0, 1, 2:"), note
    grads = next(check for check in c.checks if check.name == "gradients")
    assert "inf" not in grads.detail


def test_a_skip_in_one_run_or_a_gradient_off_at_a_step_taken_still_fails(tmp_path):
    base = _run(tmp_path / "b", 1)
    one_only = compare(base, _run(tmp_path / "one", K, skipped=(0, 1)))
    assert one_only.verdict == "fail" and one_only.diagnosis[0].code == "scaler-skips"
    later = compare(base, _run(tmp_path / "later", K, scale_from=5))
    assert later.verdict == "fail" and later.results[5].grads[0].ok is False
    assert all(d.ok for r in later.results[:5] for d in r.grads)
