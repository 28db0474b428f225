"""A choice made per input stepped with at once (judge/divergence_start.py `choice`): the runs
part there as at a kink, and the divergence is followed at the choice's size
(judge/kink_divergence.py), where most of the model's gradients pass beside it. A later error
beyond that size, or one input's share in every layer (a sample counted twice), still fails.
test_choice_parted.py's three least squares heads, the head widened to 64 rows (most of the
model's elements, as the layers a token's route does not touch are in a mixture of experts)."""

from __future__ import annotations

import numpy as np
import pytest

import tests.test_choice_parted as heads
from gradalign import api
from gradalign.runs.portable import write_run

CHOICE, LATER = heads.CHOICE, heads.PARTED


@pytest.fixture(scope="module")
def wide(tmp_path_factory):
    with pytest.MonkeyPatch.context() as patched:
        patched.setitem(heads.SHAPES, "head.weight", (64, heads.COLS))
        root = tmp_path_factory.mktemp("choice-followed")
        write_run(root / "ref", accum_steps=1, **heads._train(np.float64))
        base = write_run(
            root / "base", accum_steps=1, reference="../ref", **heads._train(np.float32)
        )
        yield root, base  # the head stays widened for the module's merged runs


def _judged(wide, name: str, spike, feed):
    root, base = wide
    merged = write_run(root / name, accum_steps=4, **heads._train(np.float32, 4, spike, feed))
    return api.compare(base, merged)


def _everywhere(u: int, g: dict) -> dict:
    """The token's share (`_choice`), and the same input's share in the head too: one sample's
    share of every layer, as a loop that counts a sample twice."""
    if u == CHOICE:
        heads._choice(g)
        x = np.random.default_rng(3).normal(size=heads.COLS)  # `_choice`'s input
        head = g["head.weight"]
        term = np.outer(np.random.default_rng(8).normal(size=head.shape[0]), x)
        head += (term / np.linalg.norm(term) * 0.05 * np.linalg.norm(head)).astype(head.dtype)
    return g


def test_a_choice_stepped_with_at_once_is_followed(wide, monkeypatch):
    """The token's share at update 3, stepped with (its weights out of their noise at once):
    followed at its size, noted, and it passes; read as no choice, it fails at update 3."""
    with monkeypatch.context() as unread:
        unread.setattr("gradalign.judge.kink_divergence.choice", lambda *a: None)
        c = _judged(wide, "stepped-unread", heads._spike(share=0), {CHOICE})
    assert c.verdict == "fail"
    assert next(r.update for r in c.results if not r.ok) == CHOICE
    c = _judged(wide, "stepped", heads._spike(share=0), {CHOICE})
    assert c.verdict == "pass", [d.message for d in c.diagnosis]
    assert any(
        n.startswith(f"update {CHOICE}:") and "choice made per input" in n and "follow" in n
        for n in c.notes
    ), c.notes


def test_a_later_error_beyond_the_choice_s_size_fails(wide):
    """After the followed choice, the head half of itself off at update 7: beyond factor times
    the choice's size, it fails there."""
    c = _judged(wide, "stepped-later", heads._spike(share=0.5), True)
    assert c.verdict == "fail"
    assert next(r.update for r in c.results if not r.ok) == LATER


def test_one_input_s_share_in_every_layer_is_not_followed(wide):
    """The same input's share in the head too, stepped with: every layer moved, as by a sample
    counted twice, not a token's route; it fails at update 3."""
    c = _judged(wide, "everywhere", _everywhere, {CHOICE})
    assert c.verdict == "fail"
    assert next(r.update for r in c.results if not r.ok) == CHOICE
