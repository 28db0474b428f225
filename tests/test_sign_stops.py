"""An optimizer that decides by a gradient's sign whether to step (Rprop stops an element whose
sign flipped, halving its step size) turns a gradient that is rounding noise into a whole step
in one run and none in another. Against a float64 reference, a noise-dominated element that
neither the baseline nor the reference stepped may be stepped by the merged run as far as the
tensor's elements stepped at the update before (`drift.noise_steps`' idle_step; model zoo run
181005, float16 autocast, an output bias whose gradient crossed zero at update 4: +2.6e-6 in
the baseline, +2.4e-6 in the reference, −1.9e-6 in the merged run, which stepped 1.2 times the
element's last step where they stood still; 1.0e5 times the noise floor, `unexplained`).

The runs are written with numpy (gradalign.runs.portable): Rprop's rule on gradients that are
one true gradient plus each run's own noise, so the signs are chosen, not a machine's rounding."""

from __future__ import annotations

import numpy as np
import pytest

from gradalign.judge.compare import compare
from gradalign.runs.portable import write_run
from gradalign.runs.reader import read_run_dir

N, UPDATES, CROSSING = 64, 8, 4  # elements, updates, the update element 0's gradient crosses 0
NOISE = 5e-6  # each float32 run's gradient noise (the reference has none)


def _true_gradient(u: int) -> np.ndarray:
    g = 1e-2 * np.cos(np.arange(N) * 0.7 + u * 0.3)
    g[0] = -3e-3  # element 0 turns at the crossing (`_rprop`'s `crossing`)
    return g


def _rprop(
    dtype,
    k: int,
    seed: int | None,
    crossing: float,
    stops: bool = True,
    stall: bool = False,
    updates: int = UPDATES,
) -> dict:
    """Rprop (torch's defaults: etas 0.5 and 1.2, steps 1e-6 to 50, lr 1e-3) on the true
    gradient plus this run's noise (`seed`; None: the reference, none), element 0's gradient at
    the crossing set to `crossing`; `stops=False`: an optimizer that steps element 0 on there
    whatever its sign did (a bug of the merged run's own); `stall`: one that leaves element 0
    still there whatever its sign did."""
    rng = None if seed is None else np.random.default_rng(seed)
    w = np.zeros(N, dtype=dtype)
    step = np.full(N, 1e-3, dtype=dtype)
    prev = np.zeros(N, dtype=dtype)
    snaps, grads = [], []
    for u in range(updates):
        g = _true_gradient(u)
        if rng is not None:
            g = g + rng.normal(size=N) * NOISE
        if u == CROSSING:
            g[0] = crossing
        g = g.astype(dtype)  # the gradient recorded
        sign = np.sign(g * prev)
        grown = np.where(sign > 0, step * 1.2, np.where(sign < 0, step * 0.5, step))
        step = np.clip(grown, 1e-6, 50).astype(dtype)
        stepped = np.where(sign < 0, 0, g).astype(dtype)  # a flipped element stops, forgets
        if u == CROSSING and not stops:
            stepped[0] = g[0]
        if u == CROSSING and stall:
            stepped[0] = 0
        w = (w - np.sign(stepped) * step).astype(dtype)
        prev = stepped
        grads.append({"w": g})
        snaps.append({"w": w.copy()})
    losses = [1.0 - 0.01 * u for u in range(updates) for _ in range(k)]
    return {
        "init_weights": {"w": np.zeros(N, dtype=dtype)},
        "update_weights": snaps,
        "grads": grads,
        "micro_losses": losses,
        "optimizer_steps": [1] * updates,
    }


def _judged(
    root,
    crossings: tuple[float, float, float],
    stops=True,
    streaming=False,
    stall=False,
    updates: int = UPDATES,
):
    """The reference's, the baseline's and the merged run's gradient of element 0 at the
    crossing; the merged run's verdict."""
    ref, base, merged = crossings
    if not (root / "base").exists():
        ref_run = _rprop(np.float64, 1, None, ref, updates=updates)
        write_run(root / "ref", accum_steps=1, **ref_run)
        base_run = _rprop(np.float32, 1, 1, base, updates=updates)
        write_run(root / "base", accum_steps=1, reference="../ref", **base_run)
        merged_run = _rprop(np.float32, 4, 2, merged, stops, stall, updates)
        write_run(root / "merged", accum_steps=4, **merged_run)
    return compare(read_run_dir(root / "base"), read_run_dir(root / "merged"),
                   reference=read_run_dir(root / "ref"), streaming=streaming)  # fmt: skip


@pytest.mark.parametrize("streaming", [False, True])
def test_a_step_where_the_others_stopped_on_a_noise_sign_passes(tmp_path, streaming):
    """The merged run's gradient at the crossing drew the other sign (−1.9e-6 against +2.6e-6
    and +2.4e-6): it stepped element 0 on, 1.2 times its last step, where the baseline and the
    reference stopped; its step sizes stay apart from there. Without the idle step this fails
    at update 4 (a mutation dropping it in `noise_steps` fails here)."""
    c = _judged(tmp_path, (2.4e-6, 2.6e-6, -1.9e-6), streaming=streaming)
    assert c.verdict == "pass", [(r.update, r.ok) for r in c.results]
    b = read_run_dir(tmp_path / "base").load_weights(CROSSING)["w"][0]
    m = read_run_dir(tmp_path / "merged").load_weights(CROSSING)["w"][0]
    assert abs(m - b) > 1e-3  # the merged run did step where the baseline stood still


@pytest.mark.parametrize("streaming", [False, True])
def test_a_step_where_the_gradient_flipped_above_its_noise_fails(tmp_path, streaming):
    """Element 0's gradient turns to +5e-4 at the crossing in every run, 100 times its noise:
    the baseline and the reference stop; a merged run whose optimizer steps it on anyway
    fails there (a mutation granting the idle step to elements that are not noise-dominated
    passes it)."""
    c = _judged(tmp_path, (5e-4, 5e-4, 5e-4), stops=False, streaming=streaming)
    assert c.verdict == "fail"
    assert next(r.update for r in c.results if not r.ok) == CROSSING


@pytest.mark.parametrize("streaming", [False, True])
def test_a_stop_where_the_others_stepped_on_a_sign_near_its_noise_passes(tmp_path, streaming):
    """Element 0's gradient at the crossing is −3e-5 in the reference and −2e-5 in the
    baseline: 1.5 times its own noise (1e-5) by TAU's line, not noise-dominated, but within
    SIGN_TAU times it, and both stepped it the same size (Rprop: the sign decides). The merged
    run drew +5e-6 and stopped it (model zoo run 184813, a GRU's bias under Rprop in bfloat16).
    Without `step_rules.sign_decided` this fails at the crossing (a mutation there fails here)."""
    c = _judged(tmp_path, (-3e-5, -2e-5, 5e-6), streaming=streaming)
    assert c.verdict == "pass", [(r.update, r.ok) for r in c.results]
    b = read_run_dir(tmp_path / "base").load_weights(CROSSING)["w"][0]
    m = read_run_dir(tmp_path / "merged").load_weights(CROSSING)["w"][0]
    assert abs(m - b) > 1e-3  # the baseline stepped where the merged run stood still


@pytest.mark.parametrize("streaming", [False, True])
def test_a_stop_on_a_sign_far_above_its_noise_fails(tmp_path, streaming):
    """The same stop where the gradient stands 30 times its own noise (−3e-4 and −2.9e-4) and
    the merged run's drew the same sign: its optimizer left element 0 still anyway. It fails at
    the crossing (a mutation reading every step of equal size as the sign's passes it)."""
    c = _judged(tmp_path, (-3e-4, -2.9e-4, -2.95e-4), streaming=streaming, stall=True)
    assert c.verdict == "fail"
    assert next(r.update for r in c.results if not r.ok) == CROSSING


@pytest.mark.parametrize("streaming", [False, True])
def test_step_sizes_kept_apart_after_a_noise_sign_pass(tmp_path, streaming):
    """The first case over 24 updates: after the crossing the merged run's Rprop steps element
    0 with a step size 2.88 times the baseline's (grown 1.2 times where the others halved it),
    and the weight parts by 1.88 of the baseline's step at every update. Both runs step it by
    the sign alone, and it drifted before: its whole steps count (model zoo run 186787, a
    ResNet's output bias under Rprop in bfloat16). Without `carried` in
    `step_rules.sign_decided` this fails after the crossing (a mutation there fails here)."""
    c = _judged(tmp_path, (2.4e-6, 2.6e-6, -1.9e-6), streaming=streaming, updates=24)
    assert c.verdict == "pass", [(r.update, r.ok) for r in c.results]
