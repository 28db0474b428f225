"""A tensor's rank read from its grid sums past `RANK_ELEMENTS` (judge/kink_pair.py): the
grid sums made from both runs' values, as a sketch-mode run makes them, hold one input's share
in one outer product and two tokens' in two, while a spread error stays spread; below the
bound the values are read, as before. The bound keeps the judge's time and memory at a failing
update from growing with the power iterations at any size."""

from __future__ import annotations

import numpy as np
import pytest

from gradalign.judge import kink_pair
from gradalign.judge.kink_evidence import Whole
from gradalign.judge.kink_shape import ONE_INPUT, _energies

E, OUT, IN = 4, 48, 40


def _pair(err: np.ndarray, name: str = "experts", **more: np.ndarray) -> Whole:
    ref = np.random.default_rng(9).standard_normal(err.shape)
    first = {name: ref + err, **more}
    second = {name: ref, **{k: np.zeros_like(v) for k, v in more.items()}}
    return Whole(first, second)


def _routed(rng, slabs: dict[int, list[int]], inputs: np.ndarray) -> np.ndarray:
    """Fused experts' error: each slab's tokens' outer products, plus rounding 1e-4 of them."""
    err = rng.standard_normal((E, OUT, IN)) * 1e-4
    for slab, tokens in slabs.items():
        for t in tokens:
            err[slab] += np.outer(rng.standard_normal(OUT), inputs[t])
    return err


@pytest.fixture(params=["values", "grid sums"])
def bound(request, monkeypatch):
    """Each reading twice: from the values (the default bound) and from grid sums (a bound
    below these tensors' sizes)."""
    if request.param == "grid sums":
        monkeypatch.setattr(kink_pair, "RANK_ELEMENTS", 64)
    return "" if request.param == "values" else ", read from its grid sums"


def test_one_token_routed_to_another_expert_is_one_input_s_share(bound):
    rng = np.random.default_rng(0)
    pair = _pair(_routed(rng, {0: [0], 2: [0]}, rng.standard_normal((2, IN))))
    assert pair.one_input("experts") == (ONE_INPUT, frozenset({0, 2}))
    assert pair.rank_read("experts") == bound


def test_two_tokens_over_three_slabs_are_read_stacked(bound):
    rng = np.random.default_rng(1)
    pair = _pair(_routed(rng, {0: [0], 1: [1], 3: [0, 1]}, rng.standard_normal((2, IN))))
    assert pair.one_input("experts") == (ONE_INPUT, frozenset({0, 1, 3}))


def test_a_spread_error_four_tokens_or_a_uniform_offset_are_not_read(bound):
    rng = np.random.default_rng(2)
    spread = rng.standard_normal((E, OUT, IN)) * 1e-3
    assert _pair(spread).one_input("experts") is None
    four = _routed(rng, {0: [0], 1: [1], 2: [2], 3: [3]}, rng.standard_normal((4, IN)))
    assert _pair(four).one_input("experts") is None
    uniform = np.full((E, OUT, IN), 1e-3) + rng.standard_normal((E, OUT, IN)) * 1e-6
    assert _pair(uniform).one_input("experts") is None


def test_a_matrix_s_rank_one_error_is_read_and_a_spread_one_not(bound):
    rng = np.random.default_rng(3)
    flip = np.outer(rng.standard_normal(64), rng.standard_normal(40))
    flip += rng.standard_normal(flip.shape) * 1e-4
    assert _pair(flip, "w").one_input("w") is not None
    assert _pair(rng.standard_normal((64, 40)), "w").one_input("w") is None
    assert _pair(flip, "w").rank_read("w") == bound


def test_a_router_s_input_is_the_slab_s_whether_either_is_read_by_its_grid_sums(bound):
    rng = np.random.default_rng(4)
    inputs = rng.standard_normal((3, IN))
    err = _routed(rng, {1: [0], 3: [0]}, inputs)
    same = np.outer(rng.standard_normal(E), inputs[0])
    other = np.outer(rng.standard_normal(E), inputs[2])  # another token's input
    assert _pair(err, router=same).same_slab_input("router", "experts", 1)
    assert not _pair(err, router=other).same_slab_input("router", "experts", 1)


def test_a_tensor_of_more_elements_than_the_bound_is_read_by_its_grid_sums():
    """At the real bound: 8 experts of 2048 x 1024 (16.8M elements), the reading the values
    would take about 16 s and 800 MiB for (bench/rank_reading.py)."""
    shape = (8, 2048, 1024)
    assert np.prod(shape) > kink_pair.RANK_ELEMENTS
    rng = np.random.default_rng(5)
    x, d = rng.standard_normal(shape[2]), rng.standard_normal(shape[1])
    err = np.zeros(shape, dtype=np.float32)
    err[0] -= np.outer(d, x).astype(np.float32)
    err[2] += np.outer(rng.standard_normal(shape[1]), x).astype(np.float32)
    pair = Whole({"experts": err}, {"experts": np.zeros(shape, dtype=np.float32)})
    assert pair.one_input("experts") == (ONE_INPUT, frozenset({0, 2}))
    assert pair.rank_read("experts") == ", read from its grid sums"


def test_row_and_column_energies_read_a_block_at_a_time_are_the_whole_tensor_s():
    rng = np.random.default_rng(6)
    ref = rng.standard_normal((3000, 20, 6)).astype(np.float32)  # 360,000: two blocks
    merged = ref + rng.standard_normal(ref.shape).astype(np.float32) * 1e-3
    (rows, columns), (own_rows, own_columns) = _energies({"t": merged}, {"t": ref}, "t", ref.shape)
    err = merged.astype(np.float64) - ref
    assert rows == pytest.approx((err.reshape(3000, -1) ** 2).sum(axis=1), rel=1e-12)
    assert columns == pytest.approx((err**2).sum(axis=(0, 2)), rel=1e-12)
    assert own_columns == pytest.approx((ref.astype(np.float64) ** 2).sum(axis=(0, 2)), rel=1e-12)
    assert own_rows.shape == (3000,)
    vector = _energies({"t": merged[:, 0, 0]}, {"t": ref[:, 0, 0]}, "t", (3000,))
    assert len(vector[0]) == 1 and vector[0][0] == pytest.approx(err[:, 0, 0] ** 2, rel=1e-12)
