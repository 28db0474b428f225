"""Two tokens routed otherwise among experts held as separate modules (`judge/siblings.py`,
read by `TensorPair.one_input` through `_among_siblings`): the same-role tensors stacked hold
the error in two outer products, as fused experts' slabs do (tests/test_two_inputs.py); the
router's error lies in the two tokens' inputs and each bias's in its weight's two δ. Four
tokens, a spread error, a uniform offset, a layer's own inputs, or a tensor standing alone are
not read so."""

from __future__ import annotations

import numpy as np

from gradalign.judge.kink_evidence import Whole
from gradalign.judge.kink_shape import ONE_INPUT, WHOLE
from gradalign.judge.siblings import sibling_groups

from .zoo_runs import _followed, one_thread, zoo

E, HIDDEN, IN = 4, 48, 24


def _experts(rng, tokens: dict[int, list[int]], inputs: np.ndarray, noise: float = 1e-4) -> dict:
    """First layers' errors of E experts held apart (`experts.i.0.weight`, HIDDEN x IN): each
    expert's tokens' δ (drawn per expert) times their inputs, plus rounding of `noise`."""
    err = {f"experts.{i}.0.weight": rng.standard_normal((HIDDEN, IN)) * noise for i in range(E)}
    for i, held in tokens.items():
        for t in held:
            err[f"experts.{i}.0.weight"] += np.outer(rng.standard_normal(HIDDEN), inputs[t])
    return err


def _pair(errors: dict, rng) -> Whole:
    """Two runs' tensors whose differences are `errors`."""
    second = {name: rng.standard_normal(e.shape) for name, e in errors.items()}
    return Whole({name: second[name] + e for name, e in errors.items()}, second)


def test_the_groups_a_name_stands_in_are_its_indices_of_one_shape():
    names = [f"layers.{j}.experts.{i}.w1" for j in range(2) for i in range(3)]
    names += ["layers.0.experts.0.w2", "layers.0.norm", "layers.0.experts.x.w1"]
    shapes = {n: (8, 4) for n in names} | {"layers.0.experts.0.w2": (4, 8)}
    groups = sibling_groups("layers.0.experts.1.w1", names, shapes.__getitem__)
    assert groups == [
        ["layers.0.experts.1.w1", "layers.1.experts.1.w1"],
        ["layers.0.experts.0.w1", "layers.0.experts.1.w1", "layers.0.experts.2.w1"],
    ]
    # no other tensor named as it is but for one index: no group
    assert sibling_groups("layers.0.experts.0.w2", names, shapes.__getitem__) == []
    assert sibling_groups("layers.0.norm", names, shapes.__getitem__) == []


def test_two_tokens_moved_between_separate_experts_are_read_across_them():
    rng = np.random.default_rng(0)
    inputs = rng.standard_normal((4, IN))
    pair = _pair(_experts(rng, {0: [0, 1], 3: [0, 1]}, inputs), rng)
    for i in (0, 3):
        name = f"experts.{i}.0.weight"
        assert pair.one_input(name) == (ONE_INPUT, WHOLE)
        assert pair.stacked_among(name) == tuple(f"experts.{j}.0.weight" for j in range(E))
    alone = _pair(
        {"experts.0.0.weight": _experts(rng, {0: [0, 1]}, inputs)["experts.0.0.weight"]}, rng
    )
    assert alone.one_input("experts.0.0.weight") is None  # rank two with no sibling to share it


def test_four_tokens_a_spread_error_an_offset_or_a_layer_s_own_inputs_are_not():
    rng = np.random.default_rng(1)
    inputs = rng.standard_normal((4, IN))
    apart = _pair(_experts(rng, {0: [0, 1], 3: [2, 3]}, inputs), rng)  # two planes
    assert apart.one_input("experts.0.0.weight") is None
    spread = _pair(_experts(rng, {}, inputs, noise=1.0), rng)
    assert spread.one_input("experts.0.0.weight") is None
    offset = {name: np.full(e.shape, 1e-2) + e for name, e in _experts(rng, {}, inputs).items()}
    assert _pair(offset, rng).one_input("experts.0.0.weight") is None
    layers = {}  # each layer's two tokens are its own hidden states: no shared inputs
    for j in range(2):
        own = rng.standard_normal((2, IN))
        layers[f"layers.{j}.w1"] = sum(np.outer(rng.standard_normal(HIDDEN), x) for x in own)
    assert _pair(layers, rng).one_input("layers.0.w1") is None


def test_the_router_and_the_biases_beside_two_tokens_hold_their_shares():
    rng = np.random.default_rng(2)
    inputs = rng.standard_normal((3, IN))
    errors = _experts(rng, {0: [0, 1], 3: [0, 1]}, inputs)
    errors["router.weight"] = sum(np.outer(rng.standard_normal(E), x) for x in inputs[:2])
    errors["other.weight"] = np.outer(rng.standard_normal(E), inputs[2])  # a third token's
    deltas = [rng.standard_normal(HIDDEN) for _ in range(2)]
    errors["experts.0.0.weight"] = sum(
        np.outer(d, x) for d, x in zip(deltas, inputs[:2], strict=True)
    )
    errors["experts.0.0.bias"] = 0.3 * deltas[0] - 1.7 * deltas[1]
    errors["experts.3.0.bias"] = rng.standard_normal(HIDDEN)  # no δ of expert 3's own
    pair = _pair(errors, rng)
    assert pair.within_inputs("router.weight", "experts.0.0.weight")
    assert not pair.within_inputs("other.weight", "experts.0.0.weight")
    assert pair.along_input("experts.0.0.bias", "experts.0.0.weight")
    assert not pair.along_input("experts.3.0.bias", "experts.3.0.weight")


def test_a_tiny_mixture_whose_two_tokens_moved_between_separate_experts_passes(
    tmp_path, monkeypatch
):
    """Model zoo run 285856 (the zoo's tiny mixture of experts, its experts separate modules,
    bfloat16 autocast, Adam with eps 1e-6, K=4, clipped at 1.0, warmup and cosine decay): at
    update 7 two tokens moved between experts 0 and 3, failing both experts' weights and biases
    and the router at up to 2x allowed. Without the reading across separate experts it fails
    there, `unexplained` (on the AMD EPYC host it was found on)."""
    with one_thread():
        zoo.judge(tmp_path, "moe", "adam-eps6", 4, 285856, None, autocast="bfloat16", clip=1.0,
                  schedule=True)  # fmt: skip
    _followed(
        tmp_path, monkeypatch, "gradalign.judge.kink_pair.TensorPair._among_siblings", 7,
        r"update 7: .*two inputs' shares of experts\.\d\.\d\.weight", lambda *a: None,
    )  # fmt: skip
