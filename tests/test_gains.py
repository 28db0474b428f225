"""One element stepped far by the optimizer's gain there (judge/gains.py), on runs written with
numpy: the reference takes Adam-like steps (its first step lr·sign(g), whatever |g|), so an
element whose first gradient is small shows a large step per unit of gradient. The merged run
draws a gradient error of a few times the tensor's RMS there, and its weight there moves far out
of the baseline's noise. That is followed; the same weight error where the reference's gain is
ordinary, spread over many elements, or beside a failing gradient still fails."""

from __future__ import annotations

import numpy as np

from gradalign import api

from .conftest import write_w_run

SHAPE, UPDATES, LR, K = (10, 5), 6, 1e-2, 4
HIGH = 7  # the element whose first gradient is small: its gain is large
NOISE_G, NOISE_W = 1e-6, 1e-9  # per element: gradient noise, weight noise added per update
SMALL, CROSS = 5e-6, 3  # a gradient of 5 noise draws at element HIGH, at update CROSS


def _reference(
    small_first_grad: bool, small_at: int | None = None
) -> tuple[np.ndarray, list, list]:
    """Sign steps (Adam's first, then Rprop's or Lion's); `small_at`: an update at which element
    HIGH's gradient is SMALL, a few times the noise (its sign is the reference's all the same)."""
    rng = np.random.default_rng(0)
    init = rng.normal(size=SHAPE) * 1e-2
    grads = [rng.normal(size=SHAPE) * 1e-1 for _ in range(UPDATES)]
    if small_first_grad:
        grads[0].flat[HIGH] = 1e-3
    if small_at is not None:
        grads[small_at].flat[HIGH] = SMALL
    weights, w = [], init.copy()
    for u, g in enumerate(grads):
        w = w - LR * np.sign(g) * (1.0 if u == 0 else 0.5)
        weights.append(w.copy())
    return init, weights, grads


def _run(path, ref, seed: int, k: int, extra=None, grad_extra=None, reference=None):
    """A float32 run at `ref`'s trajectory plus its own noise; `extra(u)` adds to its weights
    after update u, `grad_extra(u)` to its gradients."""
    init, weights, grads = ref
    rng = np.random.default_rng(seed)
    walk = np.zeros(SHAPE)
    ws, gs = [], []
    for u in range(UPDATES):
        walk += rng.normal(size=SHAPE) * NOISE_W
        g = grads[u] + rng.normal(size=SHAPE) * NOISE_G
        if grad_extra is not None:
            g = g + grad_extra(u)
        w = weights[u] + walk + (extra(u) if extra is not None else 0.0)
        ws.append(w.astype(np.float32))
        gs.append(g.astype(np.float32))
    return write_w_run(path, k, init.astype(np.float32), ws, gs, reference=reference)


def _judged(tmp_path, *, gain: bool = True, extra=None, grad_extra=None, small_at=None):
    ref = _reference(small_first_grad=gain, small_at=small_at)
    init, weights, grads = ref
    write_w_run(tmp_path / "ref", 1, init.astype(np.float32).astype(np.float64), weights, grads)
    base = _run(tmp_path / "base", ref, 1, 1, reference="../ref")
    merged = _run(tmp_path / "merged", ref, 2, K, extra=extra, grad_extra=grad_extra)
    return api.compare(base, merged)


def _one_element(size: float, elements=(HIGH,), grad_update: int = 1):
    """The merged run's gradient at `elements` off by 3 RMS at `grad_update`, its weights there
    off by `size` from that update on."""

    def weights(u):
        out = np.zeros(SHAPE)
        if u >= grad_update:
            out.flat[list(elements)] = size
        return out

    def grads(u):
        out = np.zeros(SHAPE)
        if u == grad_update:
            out.flat[list(elements)] = 3 * NOISE_G
        return out

    return weights, grads


def _noted(result) -> list[str]:
    return [n for n in result.notes if "the optimizer's gain there" in n]


def test_a_high_gain_elements_divergence_is_followed(tmp_path):
    weights, grads = _one_element(2e-5)
    result = _judged(tmp_path, extra=weights, grad_extra=grads)
    assert result.verdict == "pass", [c.detail for c in result.checks if c.status == "fail"]
    (note,) = _noted(result)
    assert note.startswith(f"update 1: w element {HIGH} stepped to")
    stepped = result.results[1].weights[0]
    assert stepped.error > 100 * stepped.noise and stepped.ok


def test_two_elements_of_a_small_tensor_are_followed(tmp_path):
    """A bias of a few dozen elements may hold the error in two (10% of it at most)."""
    weights, grads = _one_element(2e-5, elements=(HIGH, HIGH + 10))
    result = _judged(tmp_path, extra=weights, grad_extra=grads)
    assert result.verdict == "pass", [c.detail for c in result.checks if c.status == "fail"]
    (note,) = _noted(result)
    assert note.startswith(f"update 1: w element {HIGH}, {HIGH + 10} stepped to")


def test_the_followed_elements_feed_the_later_gradients(tmp_path, monkeypatch):
    """The followed elements feed every later forward: a later gradient may differ by as many
    times its noise as the followed tensor did (model zoo run 6035: a LayerNorm bias element at
    9.3x its noise under Adagrad, the next update's output-layer gradient at 5.8x). Without
    that carry the same run fails at update 2."""
    weights, grads = _one_element(2e-5)

    def later(u):  # every element's gradient off by 6 noise draws at update 2
        return grads(u) + (np.full(SHAPE, 6 * NOISE_G) if u == 2 else 0.0)

    result = _judged(tmp_path / "carried", extra=weights, grad_extra=later)
    assert result.verdict == "pass", [c.detail for c in result.checks if c.status == "fail"]
    gradient = result.results[2].grads[0]
    assert gradient.error > 4 * gradient.noise and gradient.ok
    monkeypatch.setattr("gradalign.judge.gains.carry", lambda *a: None)
    result = _judged(tmp_path / "not-carried", extra=weights, grad_extra=later)
    assert result.verdict == "fail" and not result.results[2].grads[0].ok


def test_without_the_follow_the_same_run_fails(tmp_path, monkeypatch):
    monkeypatch.setattr("gradalign.judge.honest.follow_gain_divergence", lambda *a: [])
    weights, grads = _one_element(2e-5)
    result = _judged(tmp_path, extra=weights, grad_extra=grads)
    assert result.verdict == "fail" and not result.results[1].ok


def test_the_same_error_where_the_gain_is_ordinary_fails(tmp_path):
    weights, grads = _one_element(2e-5)
    result = _judged(tmp_path, gain=False, extra=weights, grad_extra=grads)
    assert result.verdict == "fail" and not _noted(result)


def test_an_error_larger_than_the_gain_explains_fails(tmp_path):
    weights, grads = _one_element(1e-3)  # Γ ≈ lr/1e-3 = 10; 10 x 3e-6 x 2 is 6e-5
    result = _judged(tmp_path, extra=weights, grad_extra=grads)
    assert result.verdict == "fail" and not _noted(result)


def test_an_error_spread_over_many_elements_fails(tmp_path):
    weights, grads = _one_element(2e-5, elements=tuple(range(0, 50, 5)))
    result = _judged(tmp_path, extra=weights, grad_extra=grads)
    assert result.verdict == "fail" and not _noted(result)


def test_beside_a_failing_gradient_it_is_not_followed(tmp_path):
    weights, _ = _one_element(2e-5)

    def grads(u):  # every element's gradient 1% off at update 1: a bug, not noise
        return np.full(SHAPE, 1e-3) if u == 1 else np.zeros(SHAPE)

    result = _judged(tmp_path, extra=weights, grad_extra=grads)
    assert result.verdict == "fail" and not _noted(result)


def test_a_clean_run_needs_no_follow(tmp_path):
    result = _judged(tmp_path)
    assert result.verdict == "pass" and not _noted(result)


def test_a_sketched_update_says_what_it_needs(tmp_path, monkeypatch):
    """Without the tensors (a sketched run) a high-gain element cannot be told from a bug: the
    run still fails, and a note says what would tell them apart: every update in full up to
    the last that fails (the element is followed from the first to there)."""
    from types import SimpleNamespace

    from gradalign.judge.gains import follow_gain_divergence

    monkeypatch.setattr("gradalign.judge.honest.follow_gain_divergence", lambda *a: [])
    weights, grads = _one_element(2e-5)
    result = _judged(tmp_path, extra=weights, grad_extra=grads)
    sketched = SimpleNamespace(grads=lambda u: None, weights=lambda u: None)
    (note,) = follow_gain_divergence(result.results, sketched, sketched, 4.0)
    last = max(r.update for r in result.results if not r.tensors_ok)
    assert last > 1 and note.startswith("update 1: weights alone failed")
    assert f"up to the last that fails, {last}" in note
    assert f"--record full --updates {last + 1}`" in note
    assert not result.results[1].ok and result.results[0].ok


def test_a_followed_tensor_the_baseline_computed_exactly_carries_nothing(tmp_path, monkeypatch):
    """Where the baseline's noise in the followed tensor is 0 there is no scale to carry: the
    follow still widens the tensor and says so, and carries nothing (it raised before)."""
    import dataclasses

    from gradalign.judge.gains import follow_gain_divergence
    from gradalign.runs.reader import read_run_dir

    monkeypatch.setattr("gradalign.judge.honest.follow_gain_divergence", lambda *a: [])
    weights, grads = _one_element(2e-5)
    result = _judged(tmp_path, extra=weights, grad_extra=grads)
    at = result.results[1]
    at.weights[:] = [dataclasses.replace(d, noise=0.0) for d in at.weights]
    later = [d.allowed for r in result.results[2:] for d in r.grads]
    merged, ref = read_run_dir(tmp_path / "merged"), read_run_dir(tmp_path / "ref")
    (note,) = follow_gain_divergence(result.results, merged, ref, 4.0)
    assert note.startswith(f"update 1: w element {HIGH} stepped to")
    assert [d.allowed for r in result.results[2:] for d in r.grads] == later


def _crossing(grad_error: float, size: float):
    """The merged run's gradient at HIGH off by `grad_error` at update CROSS, where the
    reference's is SMALL; its weight there `size` off from then on."""

    def weights(u):
        out = np.zeros(SHAPE)
        out.flat[HIGH] = size if u >= CROSS else 0.0
        return out

    def grads(u):
        out = np.zeros(SHAPE)
        out.flat[HIGH] = grad_error if u == CROSS else 0.0
        return out

    return weights, grads


def _signs_noted(result) -> list[str]:
    return [
        n
        for n in result.notes
        if f"took the other sign than the reference's at update {CROSS}" in n
    ]


def test_a_sign_the_merged_runs_noise_flipped_is_followed_by_both_steps(tmp_path):
    """Model zoo run 244281 (a mixture of experts under Rprop, float16 autocast): one bias
    element's gradient drew the other sign in the merged run alone, within its tensor's noise,
    and its sign step went the other way: its weight two steps off. The reference's gain there
    (a step per unit of gradient, read over its whole history) is ordinary and allows under a
    thousandth of it; the two runs' steps since the sign flipped allow all of it."""
    step = LR * 0.5  # the reference's sign step at CROSS
    weights, grads = _crossing(-3 * SMALL, 2 * step)  # the merged gradient -2 SMALL: crossed
    result = _judged(tmp_path, gain=False, extra=weights, grad_extra=grads, small_at=CROSS)
    assert result.verdict == "pass", [c.detail for c in result.checks if c.status == "fail"]
    (note,) = _signs_noted(result)
    assert note.startswith(f"update {CROSS}: w element {HIGH} stepped to")
    stepped = result.results[CROSS].weights[0]
    assert stepped.error > 1e5 * stepped.noise and stepped.ok
    assert result.results[CROSS].grads[0].ok


def test_the_same_step_where_the_gradient_kept_its_sign_fails(tmp_path):
    """The merged gradient off by as much, the other way: the same sign as the reference's."""
    weights, grads = _crossing(3 * SMALL, 2 * LR * 0.5)
    result = _judged(tmp_path, gain=False, extra=weights, grad_extra=grads, small_at=CROSS)
    assert result.verdict == "fail" and not _noted(result)
    assert result.results[CROSS].grads[0].ok and not result.results[CROSS].ok


def test_a_crossing_allows_no_step_beyond_the_references_steps_there(tmp_path):
    """The merged run stepped 7.5 times the reference's largest step there (its first, LR):
    what a sign flip leaves at most 3 times it."""
    weights, grads = _crossing(-3 * SMALL, 8 * LR)
    result = _judged(tmp_path, gain=False, extra=weights, grad_extra=grads, small_at=CROSS)
    assert result.verdict == "fail" and not _noted(result)
