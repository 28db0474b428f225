"""A loss error is one scalar's draw: each update's noise is at least the RMS of the baseline's
loss errors over the updates around it (`judge/noise.py` `nearby_loss_noise`), where the runs
part as they go; one loss recorded otherwise stays out of its neighbours' pools."""

from __future__ import annotations

import numpy as np
import pytest

from gradalign.judge.noise import POOL, nearby_loss_noise

from .zoo_runs import _followed, one_thread, zoo


def test_errors_grown_as_the_runs_part_pool_around_each_update():
    own = np.array([1e-7] * 10 + [3e-5, 8e-6, 1.5e-5, 1e-5, 2e-4])
    found = nearby_loss_noise(own, np.ones(own.size, bool))
    late = own[-5:-1]  # 2e-4 over ten times the window's median: left out of update 13's pool
    assert np.isclose(found[13], np.sqrt(np.mean(late**2)))
    assert found[13] > own[13] and found[12] > own[12]
    assert np.all(found[: 10 - POOL] < 1e-6)  # early updates keep early noise


def test_one_loss_recorded_otherwise_widens_no_neighbour():
    own = np.full(12, 1e-7)
    own[6] = 3e-2  # a golden's loss edited 1% off
    found = nearby_loss_noise(own, np.ones(own.size, bool))
    assert np.all(np.delete(found, 6) <= 1e-7 * (1 + 1e-12))
    judged = np.ones(own.size, bool)
    judged[5] = False  # skipped by both runs: no draw
    own[5] = np.nan
    assert np.isfinite(nearby_loss_noise(own, judged)).all()
    assert nearby_loss_noise(own, np.zeros(own.size, bool)).tolist() == [0.0] * own.size


def test_a_float32_mixture_parted_late_passes_its_losses(tmp_path, monkeypatch):
    """Model zoo run 267552 (transformers' Qwen2-MoE at width 2 in float32, Adam with eps 1e-6,
    K=8, clipped at 0.5): the baseline's loss errors 1e-7 to 1e-6 until update 14, then up to
    2e-4; at update 18 the merged run's loss stood 6.3e-5 from the reference's, its own 9.7e-6
    there, every gradient and weight within 1.7 times its noise. Without the pool around each
    update it fails its loss at update 18 (`loss-averaging`)."""
    pytest.importorskip("transformers")
    loop = {"updates": 20, "clip": 0.5, "width": 2}
    with one_thread():
        zoo.record(tmp_path / "ref", "hf-qwen2moe", "adam-eps6", 1, 267552, float64=True, **loop)
        zoo.record(
            tmp_path / "base", "hf-qwen2moe", "adam-eps6", 1, 267552, reference="../ref", **loop
        )
        zoo.record(tmp_path / "merged", "hf-qwen2moe", "adam-eps6", 8, 267552, **loop)
    _followed(
        tmp_path, monkeypatch, "gradalign.judge.compare.nearby_loss_noise", 18, "",
        lambda own, judged: np.zeros(own.shape),
    )  # fmt: skip
