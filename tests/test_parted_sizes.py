"""Gradients on parted paths judged by their size (judge/parted_sizes.py), on runs written with
numpy: from update PART on, the baseline's and the merged run's gradients share no direction
with the reference's (each its own random direction), as a long 16-bit run's do. The baseline's
size stands 10x the reference's at update HONEST (the honest paths' spread); the merged run's
gradient spikes at update SPIKE. A spike within that spread passes with a note (and fails
without the rule); one far beyond it, the same spike on paths that did not part, and a scale the
merged run keeps from some update on still fail. A golden file made from the baseline and
its reference judges them alike (it keeps each gradient's size and the reference's)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from gradalign.judge import golden, honest
from gradalign.judge.compare import compare
from gradalign.runs.reader import read_run_dir

from .conftest import write_w_run

SHAPE, UPDATES, K, LR = (16, 16), 18, 4, 1e-2
PART, HONEST, SPIKE = 4, 6, 13  # parted from PART on; the baseline's 10x at HONEST


def _reference() -> tuple[np.ndarray, list, list]:
    rng = np.random.default_rng(0)
    init = rng.normal(size=SHAPE) * 0.1
    grads = [rng.normal(size=SHAPE) * 0.1 for _ in range(UPDATES)]
    weights, w = [], init.copy()
    for g in grads:
        w = w - LR * g
        weights.append(w.copy())
    return init, weights, grads


def _run(path, ref, seed: int, k: int, sizes, parted: bool = True, reference=None):
    """A float32 run at the reference's weights (within 1e-9); its gradient the reference's
    (within 1e-6) before PART, from there its own direction of `sizes[u]` times the reference's
    size (`parted` False: the reference's gradient times `sizes[u]`)."""
    init, weights, grads = ref
    rng = np.random.default_rng(seed)
    ws, gs = [], []
    for u in range(UPDATES):
        g = grads[u] + rng.normal(size=SHAPE) * 1e-6
        if u >= PART:
            own = rng.normal(size=SHAPE) if parted else grads[u]
            g = own * (sizes[u] * np.linalg.norm(grads[u]) / np.linalg.norm(own))
        ws.append((weights[u] + rng.normal(size=SHAPE) * 1e-9).astype(np.float32))
        gs.append(g.astype(np.float32))
    return write_w_run(path, k, init.astype(np.float32), ws, gs, reference=reference)


def _judged(tmp_path, merged_sizes, parted: bool = True):
    ref = _reference()
    init, weights, grads = ref
    write_w_run(tmp_path / "ref", 1, init.astype(np.float32).astype(np.float64), weights, grads)
    base_sizes = [10.0 if u == HONEST else 1.0 for u in range(UPDATES)]
    base = _run(tmp_path / "base", ref, 1, 1, base_sizes, parted, reference="../ref")
    merged = _run(tmp_path / "merged", ref, 2, K, merged_sizes, parted)
    base, merged = read_run_dir(base), read_run_dir(merged)
    ref = read_run_dir(tmp_path / "ref")
    kept = json.loads(json.dumps(golden.build(base, ref)))  # as a golden file holds it
    return (
        *(compare(base, merged, reference=ref, streaming=s) for s in (None, False)),
        golden.judge(kept, "golden.json", merged),
    )


def _spike(size: float) -> list[float]:
    return [size if u == SPIKE else 1.0 for u in range(UPDATES)]


def _noted(result) -> list[str]:
    return [n for n in result.notes if "pass by their size on parted paths" in n]


def _failing(result) -> list[int]:
    return [r.update for r in result.results if not r.ok]


def test_a_spike_within_the_honest_paths_spread_passes_with_a_note(tmp_path):
    for result in _judged(tmp_path, _spike(8.0)):  # streamed, whole tensors, a golden alike
        assert result.verdict == "pass", _failing(result)
        (note,) = _noted(result)
        assert note.startswith(f"update(s) {SPIKE}: the gradients of w ")
        spiked = result.results[SPIKE].grads[0]
        assert spiked.noise < spiked.error <= spiked.allowed


def test_the_same_spike_fails_without_the_rule(tmp_path, monkeypatch):
    monkeypatch.setattr(honest, "widen_parted_sizes", lambda results, factor: [])
    for result in _judged(tmp_path, _spike(8.0)):
        assert result.verdict == "fail"
        assert _failing(result) == [SPIKE]


@pytest.mark.parametrize(
    ("sizes", "parted"),
    [
        (_spike(100.0), True),  # far beyond the 10x the honest paths stood apart
        (_spike(8.0), False),  # the paths did not part: the check still reads directions
        ([1.0 if u < 10 else 8.0 for u in range(UPDATES)], True),  # a scale kept from 10 on
    ],
    ids=["beyond-the-spread", "not-parted", "scale-kept"],
)
def test_what_parted_sizes_do_not_explain_still_fails(tmp_path, sizes, parted):
    for result in _judged(tmp_path, sizes, parted):
        assert result.verdict == "fail"
        assert _failing(result)
        assert not _noted(result) or parted
