"""A norm's scale failing alone beside a choice made per input that passed
(`judge/choices.py` `lone_beside_choice`): read as the choice's echo only where passing
matrices hold one input's share and the scale is off by less than all of itself."""

from __future__ import annotations

from types import SimpleNamespace

from gradalign.judge.choices import lone_beside_choice
from gradalign.judge.jump_losses import LOSS_WITHIN
from gradalign.judge.kink_shape import ONE_INPUT, WHOLE

SCALE = "layers.1.norm.weight"
SHAPES = {SCALE: (32,), "layers.1.mlp.experts.up": (4, 32, 64), "layers.1.mlp.gate.bias": (4,)}


def _grads(share: float) -> SimpleNamespace:
    return SimpleNamespace(shape=lambda name: SHAPES[name], share=lambda name: share)


def _update() -> SimpleNamespace:
    return SimpleNamespace(update=11)


def test_a_scale_beside_a_passing_matrix_of_one_input_is_noted():
    beside = {"layers.1.mlp.experts.up": (ONE_INPUT, frozenset({0, 3}))}
    note = lone_beside_choice(_update(), {SCALE}, beside, _grads(0.045), LOSS_WITHIN)
    assert note is not None and note.startswith(f"update 11: only the gradient of {SCALE}")
    assert "layers.1.mlp.experts.up" in note and "not counted as a failure" in note


def test_without_a_matrix_of_one_input_beside_it_the_scale_is_not_excused():
    assert lone_beside_choice(_update(), {SCALE}, {}, _grads(0.045), LOSS_WITHIN) is None
    vector_only = {"layers.1.mlp.gate.bias": (ONE_INPUT, WHOLE)}  # no rank of its own
    assert lone_beside_choice(_update(), {SCALE}, vector_only, _grads(0.045), LOSS_WITHIN) is None
    kink_rows = {"layers.1.mlp.experts.up": (0, frozenset({5}))}  # a unit's rows, no input
    assert lone_beside_choice(_update(), {SCALE}, kink_rows, _grads(0.045), LOSS_WITHIN) is None


def test_a_scale_off_by_all_of_itself_is_not_an_echo():
    beside = {"layers.1.mlp.experts.up": (ONE_INPUT, frozenset({0, 3}))}
    assert lone_beside_choice(_update(), {SCALE}, beside, _grads(1.0), LOSS_WITHIN) is None
    assert lone_beside_choice(_update(), set(), beside, _grads(0.045), LOSS_WITHIN) is None
