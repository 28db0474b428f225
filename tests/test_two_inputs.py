"""Two tokens routed otherwise at one update (`judge/two_inputs.py`, read by
`kink_shape.one_input` in fused experts' slabs): the slabs stacked on one side hold the error in
two outer products, over two slabs or more; four tokens, a spread error or a uniform offset over
every slab are not read so."""

from __future__ import annotations

import numpy as np
import pytest

import gradalign
from gradalign.judge.kink_shape import ONE_INPUT, one_input, slab_input

from .zoo_runs import _followed, one_thread, zoo

E, OUT, IN = 4, 48, 32


def _tokens(rng, slabs: dict[int, list[int]], inputs: np.ndarray) -> np.ndarray:
    """An error of fused experts [E, OUT, IN]: in each slab, the outer products of its tokens'
    δ (drawn per slab) with their inputs (`inputs[t]`), plus rounding 1e-4 of their size."""
    err = rng.standard_normal((E, OUT, IN)) * 1e-4
    for slab, tokens in slabs.items():
        for t in tokens:
            err[slab] += np.outer(rng.standard_normal(OUT), inputs[t])
    return err


def _read(err: np.ndarray):
    ref = np.zeros_like(err)
    return one_input(err, ref)


def test_two_tokens_moved_between_the_same_two_experts_are_read_in_their_slabs():
    rng = np.random.default_rng(0)
    inputs = rng.standard_normal((3, IN))
    assert _read(_tokens(rng, {1: [0, 1], 3: [0, 1]}, inputs)) == (ONE_INPUT, frozenset({1, 3}))


def test_two_tokens_that_joined_one_expert_from_two_others_are_read_in_three_slabs():
    rng = np.random.default_rng(1)
    inputs = rng.standard_normal((3, IN))
    three = _tokens(rng, {0: [0], 1: [1], 3: [0, 1]}, inputs)  # run 266508's shape
    assert _read(three) == (ONE_INPUT, frozenset({0, 1, 3}))
    four = _tokens(rng, {0: [0], 1: [1], 2: [0], 3: [1]}, inputs)  # two routes, four experts
    assert _read(four) == (ONE_INPUT, frozenset({0, 1, 2, 3}))


def test_four_tokens_a_spread_error_or_a_uniform_offset_are_not():
    rng = np.random.default_rng(1)
    inputs = rng.standard_normal((4, IN))
    apart = _tokens(rng, {1: [0, 1], 3: [2, 3]}, inputs)  # four tokens: two planes
    assert _read(apart) is None
    each = _tokens(rng, {0: [0], 1: [1], 2: [2], 3: [3]}, inputs)  # four tokens, one a slab
    assert _read(each) is None
    spread = rng.standard_normal((E, OUT, IN))
    spread[0] *= 1e-3
    spread[2] *= 1e-3  # two slabs hold it, each of full rank
    assert _read(spread) is None
    uniform = np.full((E, OUT, IN), 1e-3) + rng.standard_normal((E, OUT, IN)) * 1e-6
    assert _read(uniform) is None  # c·Σw in the loss: c in every element, no input's share


def test_a_router_s_input_among_the_two_tokens_is_the_slab_s():
    rng = np.random.default_rng(2)
    inputs = rng.standard_normal((3, IN))
    err = _tokens(rng, {1: [0, 1], 3: [0, 1]}, inputs)
    fused = (err, np.zeros_like(err))
    router = np.outer(rng.standard_normal(E), inputs[0])
    assert slab_input((router, np.zeros_like(router)), fused, 1)
    other = np.outer(rng.standard_normal(E), inputs[2])  # a third token's input
    assert not slab_input((other, np.zeros_like(other)), fused, 1)


def test_a_width_2_mixture_whose_two_tokens_moved_passes(tmp_path, monkeypatch):
    """Model zoo run 266511 (transformers' Qwen2-MoE at width 2 under float16 autocast, SGD
    with momentum, K=8, clipped at 0.5): at update 3 layer 0's fused experts held the error in
    slabs 1 and 3, each rank two, the same two inputs; the router's weight and the post-attention
    norm's scale failed beside them. Without the two-token reading it fails at update 3."""
    pytest.importorskip("transformers")
    loop = {"updates": 20, "clip": 0.5, "width": 2}
    model, optimizer, seed = "hf-qwen2moe", "sgd-mom", 266511
    with one_thread():
        zoo.record(tmp_path / "base", model, optimizer, 1, seed, reference="../ref",
                   autocast="float16", **loop)  # fmt: skip
        skips = gradalign.skipped_updates(tmp_path / "base")
        zoo.record(tmp_path / "ref", model, optimizer, 1, seed, float64=True, skip_updates=skips,
                   **loop)  # fmt: skip
        zoo.record(tmp_path / "merged", model, optimizer, 8, seed, autocast="float16", **loop)
    _followed(
        tmp_path, monkeypatch, "gradalign.judge.kink_shape.stacked_inputs", 3,
        r"update 3: .*one input's share", lambda *a: 0.0,
    )  # fmt: skip


@pytest.mark.parametrize(
    "model, optimizer, k, seed, options, update",
    [
        # two tokens joined expert 3 of layer 1, one from expert 0 and one from expert 1
        ("hf-qwen2moe", "sgd-mom", 4, 266508, {"autocast": "float16", "width": 2, "clip": 0.5}, 10),
        # against a float32 reference: a token from expert 1 to 3, slab 3 rank two
        ("hf-gptoss", "asgd", 8, 266102, {"autocast": "float16", "reference_dtype": "float32"}, 8),
    ],
)
def test_two_tokens_over_the_slabs_stacked_pass(
    tmp_path, monkeypatch, model, optimizer, k, seed, options, update
):
    """Model zoo runs 266508 (transformers' Qwen2-MoE at width 2 under float16 autocast, SGD
    with momentum, K=4, clipped at 0.5) and 266102 (gpt-oss under float16 against a float32
    reference, ASGD, K=8): no two slabs held 90% of the fused experts' error, each rank one or
    two; stacked, 99.8% and 93% of it lay in two outer products. Without the stacked reading
    each fails at its route, `unexplained`, in the layer's experts and router alone. (On an AMD
    EPYC host run 266102's route failed layer 1's attention biases too, which no rule reads:
    skipped there, an open false alarm, README.)"""
    pytest.importorskip("transformers")
    with one_thread():
        zoo.judge(tmp_path, model, optimizer, k, seed, None, updates=20, **options)
    _followed(
        tmp_path, monkeypatch, "gradalign.judge.kink_shape.stacked_inputs", update,
        rf"update {update}: .*one input's share", lambda *a: 0.0, within=".mlp.",
    )  # fmt: skip


def test_a_sketched_route_in_one_expert_s_rows_is_read_as_one_input_s_share(tmp_path, monkeypatch):
    """Model zoo run 266535 (transformers' Mixtral at width 2 under float16 autocast, Adadelta,
    K=2, clipped at 0.5), recorded with sketches: at update 3 the unit sums' estimates put 90%
    of layer 1's `down_proj` error in expert 1, a kink's one row, where the slab grids read one
    input's share in experts 0 and 1 (as the values do, recorded whole: it passes so). Fused
    experts' rows along their first axis are experts, not units a kink crosses: without that
    the sketched run fails at update 3, `unexplained`."""
    pytest.importorskip("transformers")
    loop = {"updates": 20, "autocast": "float16", "width": 2, "clip": 0.5, "sketch": True}
    with one_thread():
        zoo.judge(tmp_path, "hf-mixtral", "adadelta", 2, 266535, None, **loop)
    _followed(
        tmp_path, monkeypatch, "gradalign.judge.kink_pair.fused_experts", 3,
        r"update 3: .*one input's share", lambda *a: False,
    )  # fmt: skip
