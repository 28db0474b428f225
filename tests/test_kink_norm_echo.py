"""A kink crossed behind a norm over groups of units, at a later update of a divergence
followed from a kink (judge/later_events.py `later_kink`): the conv feeding the norm holds most
of its error in the kinked unit's row and the rest in the other rows of the unit's group, the
norm's own bias all of it in that unit. Read as a kink there, and only where a second gradient
names the same unit."""

from __future__ import annotations

import numpy as np
import pytest

from gradalign.judge.kink_evidence import Whole
from gradalign.judge.later_events import later_kink

CHANNELS, UNIT, GROUP = 16, 9, (8, 10, 11)  # GroupNorm(4, 16): channel 9 is in channels 8 to 11
FOLLOWED = 1e-3  # the size the divergence is followed at


def _pair(conv_rows: dict[int, float], bias_rows: dict[int, float], seed: int = 0) -> Whole:
    """The reference's gradients of a 16-channel 3x3 conv and its norm's bias, and the merged
    run's, off by each row's share of 1% (conv) or 0.6% (bias) of the tensor's norm."""
    rng = np.random.default_rng(seed)
    ref = {
        "conv.weight": rng.standard_normal((CHANNELS, CHANNELS, 3, 3)),
        "norm.bias": rng.standard_normal(CHANNELS),
    }
    merged = {}
    for (name, rows), size in zip(
        (("conv.weight", conv_rows), ("norm.bias", bias_rows)), (1e-2, 6e-3), strict=True
    ):
        err = np.zeros_like(ref[name])
        for row, energy in rows.items():
            direction = rng.standard_normal(err[row].shape)
            err[row] = direction / np.linalg.norm(direction) * np.sqrt(energy)
        norm = np.linalg.norm(err)
        merged[name] = ref[name] + (err / norm * size * np.linalg.norm(ref[name]) if norm else 0)
    return Whole({k: v.astype(np.float32) for k, v in merged.items()}, ref)


ECHOED = {UNIT: 0.835, **{row: 0.055 for row in GROUP}}


def test_a_kink_behind_a_norm_is_read_in_the_unit_both_gradients_name():
    found = later_kink(_pair(ECHOED, {UNIT: 1.0}), FOLLOWED)
    assert found is not None
    name, share, where = found
    assert name == "conv.weight" and share == pytest.approx(1e-2, rel=1e-3)
    assert f"most of it in row {UNIT}" in where and "norm.bias's gradient holds 90%" in where


@pytest.mark.parametrize(
    "conv, bias",
    [
        (ECHOED, {3: 1.0}),  # the bias names another unit
        (ECHOED, {}),  # no second gradient off: one tensor's rows are no kink's evidence
        ({row: 1 / CHANNELS for row in range(CHANNELS)}, {UNIT: 1.0}),  # a bug's spread error
        ({UNIT: 0.45, **{row: 0.55 / 3 for row in GROUP}}, {UNIT: 1.0}),  # no unit's majority
    ],
)
def test_no_kink_without_a_units_majority_that_a_second_gradient_names(conv, bias):
    assert later_kink(_pair(conv, bias), FOLLOWED) is None
