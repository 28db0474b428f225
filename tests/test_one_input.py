"""One input's share of a gradient gained or lost whole (judge/kink_shape.py `one_input`,
judge/kinks.py): a choice made per input (a token routed to another expert, an argmax, a tie)
that went one way in one run and the other way in the other leaves a rank-one error, spread over
every row and column, at one update; it is excused as a kink's jump is, and a spread error, or a
rank-one error stepped with at every update, is not. Runs written with numpy (linear least
squares under SGD, tests/least_squares.py), the recorded gradient altered as a flip would."""

from __future__ import annotations

import numpy as np
import pytest

from gradalign import api
from gradalign.judge.kink_shape import (
    ONE_INPUT,
    WHOLE,
    along_input,
    held_in_many_rows,
    one_input,
    same_input,
)
from gradalign.runs.portable import write_run
from tests.least_squares import Shape, reference_and_baseline, train

SHAPE = Shape(rows=16, cols=12, updates=10, lr=0.05)  # 12 columns: many, for a rank


def _train(dtype, k: int = 1, spike=None, feed: bool = False) -> dict:
    return train(dtype, k=k, spike=spike, feed=feed, shape=SHAPE)


def _outer(seed: int, size: float, g: np.ndarray) -> np.ndarray:
    """An outer product of two random vectors, of norm `size` times the gradient's."""
    rng = np.random.default_rng(seed)
    term = np.outer(rng.normal(size=SHAPE.rows), rng.normal(size=SHAPE.cols))
    return term / np.linalg.norm(term) * size * np.linalg.norm(g)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("one-input")
    return root, reference_and_baseline(root, _train)[1]


def _merged(runs, name: str, spike, feed: bool = False):
    root, base = runs
    path = write_run(root / name, accum_steps=4, **_train(np.float32, 4, spike, feed))
    return api.compare(base, path)


def test_one_input_flipped_at_one_update_is_noted_not_failed(runs):
    """The merged run's gradient at update 5 gained one input's share (1e-3 of the gradient,
    far beyond its rounding), the weights and the loss within noise: noted, and it passes."""

    def flip(u, g):
        return g + _outer(3, 1e-3, g) if u == 5 else g

    c = _merged(runs, "flip", flip)
    assert c.verdict == "pass", [d.message for d in c.diagnosis]
    assert any("one input's share of w" in n for n in c.notes), c.notes


def test_an_error_spread_over_two_inputs_fails(runs):
    """The same size in two outer products of equal weight (a spread error: no one input's
    share, no kink's few rows) fails at update 5 (a mutation reading any error as one input's
    passes it)."""

    def spread(u, g):
        return g + (_outer(3, 1e-3, g) + _outer(4, 1e-3, g)) / np.sqrt(2) if u == 5 else g

    c = _merged(runs, "spread", spread)
    assert c.verdict == "fail"
    assert next(r.update for r in c.results if not r.ok) == 5


def test_one_input_stepped_with_at_every_update_fails(runs):
    """One input's share added at every update from 3 and stepped with (a loop that counts a
    sample twice): the weights leave their noise and the jumps are not isolated; it fails."""

    def twice(u, g):
        return g + _outer(3, 2e-2, g) if u >= 3 else g

    c = _merged(runs, "twice", twice, feed=True)
    assert c.verdict == "fail"


def test_one_input_reads_rank_one_errors_of_many_rows_and_columns():
    """`one_input` on arrays: a rank-one error beside 1% noise is one input's; random noise,
    a 1-D tensor, one of few columns, and a rest beyond the bound given are not."""
    rng = np.random.default_rng(5)
    ref = rng.normal(size=(32, 24))
    term = np.outer(rng.normal(size=32), rng.normal(size=24))
    noise = rng.normal(size=(32, 24)) * 0.01 * np.linalg.norm(term) / np.sqrt(32 * 24)
    assert one_input(ref + term + noise, ref) == (ONE_INPUT, WHOLE)
    assert one_input(ref + noise, ref) is None  # spread
    assert one_input(ref[0] + term[0], ref[0]) is None  # 1-D: any error is "rank one"
    assert one_input(ref[:, :4] + term[:, :4], ref[:, :4]) is None  # few columns
    rest = float(np.linalg.norm(noise))
    assert one_input(ref + term + noise, ref, rest=rest / 10) is None
    conv = rng.normal(size=(16, 4, 3, 3))  # trailing axes flattened: 36 columns
    flipped = conv + np.outer(rng.normal(size=16), rng.normal(size=36)).reshape(conv.shape)
    assert one_input(flipped, conv) == (ONE_INPUT, WHOLE)


def test_one_input_reads_fused_experts_slab_by_slab():
    """Experts fused in one tensor (experts, out, in), as transformers' mixtures of experts hold
    them: a token that left expert 1 for expert 3 leaves a rank-one error in each of those two
    slabs (the flattened view, 4 rows, says nothing). Three slabs, or a slab of rank two, are
    not one input's share."""
    rng = np.random.default_rng(7)
    ref = rng.normal(size=(4, 16, 12))

    def token(scale: float = 1.0) -> np.ndarray:
        return np.outer(rng.normal(size=16), rng.normal(size=12)) * scale

    moved = ref.copy()
    moved[1] -= token()
    moved[3] += token()
    assert one_input(moved, ref) == (ONE_INPUT, frozenset({1, 3}))
    spread = ref.copy()
    for e in (0, 1, 3):
        spread[e] += token()
    assert one_input(spread, ref) is None  # three experts: no one token's move
    twice = ref.copy()
    twice[2] += token() + token()  # two tokens in one expert: rank two
    assert one_input(twice, ref) is None


def test_fused_experts_held_in_slabs_are_read_by_a_slab_s_rows():
    """However few experts fused weights hold, one input's share read in their slabs is
    evidence by each slab's rows; read whole, a tensor of few rows is none, and rows of a
    kink are read by the first axis as before."""
    slabs = (ONE_INPUT, frozenset({0, 2}))
    assert held_in_many_rows((4, 128, 32), slabs)
    assert not held_in_many_rows((4, 128, 32), (ONE_INPUT, WHOLE))
    assert not held_in_many_rows((4, 4, 32), slabs)  # slabs of few rows: no evidence either
    assert not held_in_many_rows((4, 32), (ONE_INPUT, WHOLE))  # a router of 4 experts
    assert held_in_many_rows((64, 32), (0, frozenset({3})))
    assert not held_in_many_rows((4, 128, 32), (0, frozenset({1})))  # rows: the first axis


def test_a_bias_along_its_weight_holds_the_same_input_s_share():
    """`along_input`: one input's share is δ xᵀ in a weight and δ in its bias; a bias off along
    the weight's error's rows (beside 1% noise) holds the same share, one off in another
    direction, or of another length, does not. `one_input(few=True)` reads a router's 4 rows."""
    rng = np.random.default_rng(11)
    ref, own = rng.normal(size=(24, 12)), rng.normal(size=24)
    delta, x = rng.normal(size=24), rng.normal(size=12)
    noise = rng.normal(size=24) * 0.01 * np.linalg.norm(delta) / np.sqrt(24)
    weight = (ref + np.outer(delta, x), ref)
    assert along_input(weight, (own + 3 * delta + noise, own))
    assert not along_input(weight, (own + rng.normal(size=24), own))
    assert not along_input(weight, (own[:12] + delta[:12], own[:12]))
    router = rng.normal(size=(4, 12))
    flipped = router + np.outer(rng.normal(size=4), x)
    assert one_input(flipped, router) is None  # 4 rows: too few for a rank alone
    assert one_input(flipped, router, few=True) == (ONE_INPUT, WHOLE)


def test_two_weights_reading_one_input_share_its_line():
    """`same_input`: δ₁ xᵀ in an expert's weight and δ₂ xᵀ in a router's (4 rows), beside 1%
    noise, are one input's; δ₂ x'ᵀ, or a weight of other columns, are not."""
    rng = np.random.default_rng(13)
    expert, router = rng.normal(size=(24, 12)), rng.normal(size=(4, 12))
    x, other = rng.normal(size=12), rng.normal(size=12)
    moved = (expert + np.outer(rng.normal(size=24), x), expert)
    noise = rng.normal(size=(4, 12)) * 0.01
    assert same_input(moved, (router + np.outer(rng.normal(size=4), x) + noise, router))
    assert not same_input(moved, (router + np.outer(rng.normal(size=4), other), router))
    wide = rng.normal(size=(4, 16))
    assert not same_input(moved, (wide + np.outer(rng.normal(size=4), rng.normal(size=16)), wide))
