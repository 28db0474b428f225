"""A layer after a token's route (`judge/choices.py` `read_after`): a matrix whose error is one
input's share of an input of its own joins the choice only where it stands off by ROUTE_GAP
times less of itself than the choice's furthest tensor."""

from __future__ import annotations

from types import SimpleNamespace

from gradalign.judge.choices import ROUTE_GAP, read_after
from gradalign.judge.kink_shape import ONE_INPUT, WHOLE

EXPERT, OUT, BIAS = "experts.0.0.weight", "out.weight", "out.bias"
SHAPES = {EXPERT: (48, 24), OUT: (6, 24), BIAS: (6,)}
CHOICE = {EXPERT: (ONE_INPUT, WHOLE)}


def _grads(
    shares: dict[str, float], ranked: dict[str, tuple | None], along: bool = False
) -> SimpleNamespace:
    return SimpleNamespace(
        shape=lambda name: SHAPES[name],
        share=lambda name: shares[name],
        one_input=lambda name, few=False: ranked.get(name),
        along_input=lambda bias, weight: along,
    )


def test_a_rank_one_matrix_far_below_the_choice_s_share_joins_it():
    grads = _grads({EXPERT: 0.25, OUT: 0.018}, {OUT: (ONE_INPUT, WHOLE)})
    assert read_after([OUT], CHOICE, grads) == {OUT: (ONE_INPUT, WHOLE)}


def test_a_matrix_off_like_the_choice_or_spread_or_a_vector_does_not():
    near = _grads({EXPERT: 0.25, OUT: 0.25 / ROUTE_GAP * 1.01}, {OUT: (ONE_INPUT, WHOLE)})
    assert read_after([OUT], CHOICE, near) == {}
    spread = _grads({EXPERT: 0.25, OUT: 0.018}, {OUT: None})
    assert read_after([OUT], CHOICE, spread) == {}
    rows = _grads({EXPERT: 0.25, OUT: 0.018}, {OUT: (0, frozenset({2}))})  # a unit, no input
    assert read_after([OUT], CHOICE, rows) == {}
    vector = _grads({EXPERT: 0.25, BIAS: 0.018}, {BIAS: (ONE_INPUT, WHOLE)})
    assert read_after([BIAS], CHOICE, vector) == {}
    assert read_after([OUT], {}, _grads({OUT: 0.018}, {OUT: (ONE_INPUT, WHOLE)})) == {}


def test_a_bias_along_a_layer_read_after_the_route_joins_it_too():
    held = (ONE_INPUT, WHOLE)
    along = _grads({EXPERT: 0.25, OUT: 0.018, BIAS: 0.03}, {OUT: held}, along=True)
    assert read_after([OUT, BIAS], CHOICE, along) == {OUT: held, BIAS: held}
    astray = _grads({EXPERT: 0.25, OUT: 0.018, BIAS: 0.03}, {OUT: held}, along=False)
    assert read_after([OUT, BIAS], CHOICE, astray) == {OUT: held}
    alone = _grads({EXPERT: 0.25, BIAS: 0.03}, {}, along=True)  # no weight read after
    assert read_after([BIAS], CHOICE, alone) == {}
