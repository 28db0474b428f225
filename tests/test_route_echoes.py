"""A token's route seen with what it echoes into (judge/choices.py `routed`, said by
judge/stepped_choice.py `route_clause`): where the failing gradients furthest off hold one
input's share and every other failing gradient stands off by a share of itself ROUTE_GAP times
smaller, the `unexplained` message names the route and its echoes. Like shares everywhere (a
bug), or a matrix above the split whose error is spread, get no such clause. The runs of
tests/test_choice_parted.py (an expert's, a router's and a head's least squares, numpy), the
token's share stepped with at update 3 and the head off beside it."""

from __future__ import annotations

import numpy as np
import pytest

import tests.test_choice_parted as heads
from gradalign.judge.choices import ROUTE_GAP
from gradalign.judge.signatures import failing
from gradalign.judge.stepped_choice import route_clause

base = heads.base  # the module's runs: the float64 reference and the baseline
CHOICE = heads.CHOICE
ROUTE = "the shape of a token routed to another expert"


def _spread(g: dict, name: str, share: float, seed: int = 4) -> None:
    """`name` off by `share` of itself, spread over every element."""
    error = np.random.default_rng(seed).normal(size=g[name].shape)
    g[name] += (error / np.linalg.norm(error) * share * np.linalg.norm(g[name])).astype(
        g[name].dtype
    )


def _routed(head_share: float, expert_spread: bool = False):
    """At update CHOICE: the token's share in the expert and the router (`_choice`: 1e-2 to
    5e-2 of each), the head off by `head_share` of itself; `expert_spread`: the expert's weight
    off by as much, spread, instead of one input's share."""

    def spike(u: int, g: dict) -> dict:
        if u == CHOICE:
            heads._choice(g)
            _spread(g, "head.weight", head_share)
            if expert_spread:
                _spread(g, "expert.weight", 2e-2, seed=5)
        return g

    return spike


def _said(base, name: str, spike):
    c = heads._compare(base, name, spike, feed={CHOICE})
    assert c.verdict == "fail"
    assert next(r.update for r in c.results if not r.ok) == CHOICE
    return c, c.diagnosis[0].message


def test_a_route_with_its_echoes_is_said(base):
    """The head 1e-3 of itself off beside the token's share (10 times less than the expert's
    weight, ROUTE_GAP is 4): the run fails, and the message names the route and the echo."""
    c, said = _said(base, "route-echo", _routed(1e-3))
    assert c.diagnosis[0].code == "unexplained"
    assert ROUTE in said, said
    assert "expert.weight" in said and "router.weight" in said and "in head.weight" in said
    gap = float(said.split("a share of itself ")[1].split(" times")[0])
    assert gap >= ROUTE_GAP, said


@pytest.mark.parametrize("head_share", [2e-2, 4e-3])
def test_like_shares_everywhere_are_no_route(base, head_share):
    """The head off by a share like the token's (2e-2, among the expert's 1e-2 and the
    router's 3e-2) or just within ROUTE_GAP of the expert's (4e-3): no split, no clause."""
    c, said = _said(base, f"route-like-{head_share}", _routed(head_share))
    assert ROUTE not in said, said
    assert route_clause(c, failing(c)) is None


def test_a_spread_matrix_above_the_split_is_no_route(base):
    """The expert's weight 2e-2 of itself off, spread, beside the router's token share: a
    matrix above the split holds no one input's share, and no clause is said."""
    c, said = _said(base, "route-spread", _routed(1e-3, expert_spread=True))
    assert ROUTE not in said, said
    assert route_clause(c, failing(c)) is None
