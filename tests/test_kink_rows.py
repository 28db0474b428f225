"""How many rows a kink may hold its error in (judge/kink_shape.py `units_holding`): JUMP_ROWS of
the tensor's rows rounded up, at least one. Two units crossed at once in a tensor of 101 to 200
rows are a kink (model zoo run 197901: two units of a 192-row feed-forward layer held 53% and
47% of its gradient's error, and the run failed); in one of 100 rows or fewer a kink is one row.
A bug's error spread over a few more rows, or over every row, is none."""

from __future__ import annotations

import numpy as np
import pytest
from safetensors.numpy import load_file

from gradalign.judge.kink_shape import KINK_UNITS, kink_units

from .zoo_runs import _compare, _one_thread_runs


def _rows(n: int, held: dict[int, float]) -> np.ndarray:
    """An error of `n` rows of 8, the rows `held` holding those shares of its energy, the
    rest a thousandth."""
    error = np.full((n, 8), 1e-3)
    rest = 1.0 - sum(held.values())
    error *= np.sqrt(max(rest, 0.0) / float((error**2).sum()))
    for row, share in held.items():
        error[row] = np.sqrt(share / 8)
    return error


@pytest.mark.parametrize("n", [101, 128, 192, 200])
def test_two_units_of_a_tensor_of_more_than_100_rows_are_a_kink(n):
    found = kink_units(_rows(n, {3: 0.53, 7: 0.46}), np.zeros((n, 8)), KINK_UNITS)
    assert found == (0, frozenset({3, 7}))


@pytest.mark.parametrize("n", [64, 100])
def test_a_tensor_of_100_rows_or_fewer_holds_a_kink_in_one_row(n):
    assert kink_units(_rows(n, {3: 0.53, 7: 0.46}), np.zeros((n, 8)), KINK_UNITS) is None
    assert kink_units(_rows(n, {3: 0.99}), np.zeros((n, 8)), KINK_UNITS) == (0, frozenset({3}))


def test_three_rows_or_a_spread_error_are_no_kink_of_two_units():
    n = 192
    assert kink_units(_rows(n, {1: 0.32, 2: 0.32, 3: 0.32}), np.zeros((n, 8)), KINK_UNITS) is None
    spread = np.random.default_rng(0).standard_normal((n, 8))
    assert kink_units(spread, np.zeros((n, 8)), KINK_UNITS) is None


def test_two_units_crossed_at_once_in_a_wide_encoder_are_excused(tmp_path):
    """Model zoo run 197901: an encoder at width 4 under SGD with momentum, K=2, 60 updates. At
    update 38 two units of layer 1's feed-forward (192 rows) crossed their kinks, 53% and 47% of
    its gradient's error, and three tensors of layer 0 upstream stood off by smaller shares;
    every other update passed. Read in one row at most, the jump was no kink and the run failed
    there at 1.4x; now both judges pass it with the jump's note (else this machine's rounding
    took another path: skipped). One thread, as the bench."""
    root = _one_thread_runs(tmp_path, "encoder", "sgd-mom", 2, 197901, updates=60, width=4)
    name, file = "enc.layers.1.linear1.weight", "grads/update_000038.safetensors"
    merged, ref = (
        load_file(root / run / file)[name].astype(np.float64) for run in ("merged", "ref")
    )
    rows = np.sort(((merged - ref) ** 2).sum(axis=1))[::-1] / ((merged - ref) ** 2).sum()
    if not (rows[0] < 0.9 <= rows[0] + rows[1]):  # read apart from the rule under test
        pytest.skip("this machine's rounding took another path here (no two-unit jump at 38)")
    for streaming in (False, True):
        c = _compare(root, streaming)
        assert c.verdict == "pass", (streaming, [d.code for d in c.diagnosis])
        (note,) = [n for n in c.notes if n.startswith("update 38:")]
        assert "2 row(s) or column(s)" in note, note
