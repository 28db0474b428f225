"""Big logs: what a run of many updates costs to judge. A log of 50k updates (200k micro-step
lines) must not cost a pass over every window for each window."""

from __future__ import annotations

import numpy as np
import pytest

from gradalign.runs.model import Run


def _run(updates: int, k: int, sizes: list[int] | None = None) -> Run:
    micro = sum(sizes) if sizes else updates * k
    return Run(
        source="big.log",
        kind="log",
        accum_steps=k,
        updates=updates,
        micro_loss=np.arange(micro, dtype=np.float64),
        tensors=[],
        window_sizes=None if sizes is None else np.array(sizes, dtype=np.int64),
    )


@pytest.fixture
def starts_computed(monkeypatch) -> list[int]:
    """How often a run's window starts (a cumulative sum over every window) are computed."""
    calls: list[int] = []
    original = Run.starts.fget

    def counting(self: Run) -> np.ndarray:
        calls.append(1)
        return original(self)

    monkeypatch.setattr(Run, "starts", property(counting))
    return calls


def test_window_means_take_one_pass(starts_computed):
    run = _run(1000, 4)
    losses = run.window_losses()
    assert losses.tolist() == [4 * i + 1.5 for i in range(1000)]
    assert [run.window(i) for i in (0, 999)] == [range(0, 4), range(3996, 4000)]
    assert len(starts_computed) == 0  # K micro-steps each: no cumulative sum at all
    with pytest.raises(IndexError):
        run.window(1000)


def test_irregular_windows_compute_their_starts_once(starts_computed):
    run = _run(3, 2, sizes=[2, 3, 1])
    assert run.window_losses().tolist() == [0.5, 3.0, 5.0]
    assert run.window_sums(np.array([1, 2, 3, 4, 5, 6])).tolist() == [3, 12, 6]
    assert len(starts_computed) == 2
    assert [run.window(i) for i in range(3)] == [range(0, 2), range(2, 5), range(5, 6)]
