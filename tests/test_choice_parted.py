"""Runs parted at a choice made per input (judge/kinks.py `_quietly_parted`): after a jump
excused as one input's share (a token routed to another expert: its share of the experts'
and the router's weights, rank one, and of their biases, along them, `_same_inputs`), a later
update whose step left every weight within its noise may fail a part of the model's gradients
by a large share of themselves, the whole turned by a cosine down to CHOICE_COSINE: more
inputs' choices go otherwise as the runs part. Biases off in another direction, no choice
before, the error stepped with, or that part of the model scaled as a whole, still fail. Runs
written with numpy (three least squares heads under SGD: an expert's, 16 x 12 with a bias, a
router's, 4 x 12 with a bias, and a head, 6 x 12), the recorded gradients altered as the flips
would."""

from __future__ import annotations

import numpy as np
import pytest

from gradalign import api
from gradalign.judge.choices import CHOICE_COSINE, WHOLE_COSINE
from gradalign.runs.portable import write_run

COLS, UPDATES, LR, BATCH = 12, 10, 0.05, 16
SHAPES = {"expert.weight": (16, 12), "router.weight": (4, 12), "head.weight": (6, 12)}
SCALES = {"expert.weight": 0.1, "router.weight": 0.1, "head.weight": 0.02}  # initial weights
CHOICE, PARTED = 3, 7  # the update a token's route flips, and a later one where more do
FACTOR = 4.0  # the noise factor (judge/tolerances.py's default)


def _data() -> tuple[np.ndarray, dict[str, np.ndarray]]:
    rng = np.random.default_rng(0)
    x = rng.normal(size=(UPDATES * BATCH, COLS))
    scale = {"expert.weight": 0.1, "router.weight": 0.1, "head.weight": 0.03}
    return x, {n: x @ rng.normal(size=(COLS, rows)) * scale[n] for n, (rows, _) in SHAPES.items()}


def _train(dtype, k: int = 1, spike=None, feed: bool | set[int] = False) -> dict:
    """Three least squares heads (the expert and the router with a bias), their mean squared
    error summed, SGD. `spike(update, grads)` alters the recorded gradients (a dict), with
    `feed` the gradients stepped with too (True: at every update; a set: at those)."""
    x, ys = _data()
    x = x.astype(np.float32).astype(dtype)
    ys = {n: y.astype(np.float32).astype(dtype) for n, y in ys.items()}
    rng = np.random.default_rng(1)
    weights = {n: rng.normal(size=shape) * SCALES[n] for n, shape in SHAPES.items()}
    weights |= {"expert.bias": np.zeros(16), "router.bias": np.zeros(4)}
    weights = {n: a.astype(np.float32).astype(dtype) for n, a in weights.items()}
    init = {n: a.copy() for n, a in weights.items()}
    snaps, grads, losses = [], [], []
    for u in range(UPDATES):
        total = {n: np.zeros_like(a) for n, a in weights.items()}
        for j in range(k):
            rows = slice(u * BATCH + j * BATCH // k, u * BATCH + (j + 1) * BATCH // k)
            errs = {}
            for n in SHAPES:
                bias = weights.get(n.replace("weight", "bias"), 0)
                errs[n] = x[rows] @ weights[n].T + bias - ys[n][rows]
            count = sum(e.size for e in errs.values())
            losses.append(float(sum((e**2).sum() for e in errs.values()) / count))
            for n, e in errs.items():
                total[n] += (2 * e.T @ x[rows] / count).astype(dtype)
                if n.replace("weight", "bias") in total:
                    total[n.replace("weight", "bias")] += (2 * e.sum(0) / count).astype(dtype)
        g = {n: (a / k).astype(dtype) for n, a in total.items()}
        recorded = spike(u, {n: a.copy() for n, a in g.items()}) if spike else g
        grads.append(recorded)
        stepped = recorded if feed is True or (feed and u in feed) else g
        weights = {n: (a - LR * stepped[n]).astype(dtype) for n, a in weights.items()}
        snaps.append({n: a.copy() for n, a in weights.items()})
    return {
        "init_weights": init,
        "update_weights": snaps,
        "grads": grads,
        "micro_losses": losses,
        "optimizer_steps": [1] * UPDATES,
    }


def _choice(g: dict, along: bool = True, same: bool = True) -> None:
    """One token's share moved whole: δ xᵀ in the expert's weight (1e-2 of its gradient) and
    δ in its bias (five times that share of the bias), δ_r xᵀ in the router's weight (three
    times) and δ_r in its bias (five times). `along=False`: each bias's error as large, in
    another direction; `same=False`: the router's of another input, x'."""
    rng = np.random.default_rng(3)
    x, other = rng.normal(size=COLS), rng.normal(size=COLS)
    for module, weight_share in (("expert", 1e-2), ("router", 3e-2)):
        x = x if same or module == "expert" else other
        weight, bias = g[f"{module}.weight"], g[f"{module}.bias"]
        delta = rng.normal(size=bias.shape)
        term = np.outer(delta, x)
        weight += (term / np.linalg.norm(term) * weight_share * np.linalg.norm(weight)).astype(
            weight.dtype
        )
        off = delta if along else rng.normal(size=bias.shape)
        size = 5 * 1e-2 * np.linalg.norm(bias)
        bias += (off / np.linalg.norm(off) * size).astype(bias.dtype)


def _spread(g: dict, share: float) -> None:
    """The head off by `share` of itself, spread over every element."""
    head = g["head.weight"]
    error = np.random.default_rng(4).normal(size=head.shape)
    head += (error / np.linalg.norm(error) * share * np.linalg.norm(head)).astype(head.dtype)


def _spike(
    choice: bool = True,
    share: float = 0.5,
    scaled: bool = False,
    along: bool = True,
    same: bool = True,
):
    def spike(u: int, g: dict) -> dict:
        if choice and u == CHOICE:
            _choice(g, along, same)
        if u == PARTED and share:
            if scaled:
                g["head.weight"] *= np.float32(1 + share)
            else:
                _spread(g, share)
        return g

    return spike


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    root = tmp_path_factory.mktemp("choice-parted")
    write_run(root / "ref", accum_steps=1, **_train(np.float64))
    return root, write_run(root / "base", accum_steps=1, reference="../ref", **_train(np.float32))


def _compare(base, name: str, spike, feed: bool | set[int] = False):
    root, path = base
    merged = write_run(root / name, accum_steps=4, **_train(np.float32, 4, spike, feed))
    return api.compare(path, merged)


def _at(c, update: int):
    return next(r for r in c.results if r.update == update)


def test_a_token_moved_whole_is_one_jump(base):
    """One token's share in the expert's weight and bias and in the router's weight and bias
    (the router's 4 rows too few for a rank alone, each bias further off than its weight): one
    jump, noted, and it passes (mutations reading no bias along its weight, or no rank in a
    matrix of few rows, fail it)."""
    c = _compare(base, "choice", _spike(share=0))
    assert c.verdict == "pass", [d.message for d in c.diagnosis]
    note = next(n for n in c.notes if n.startswith(f"update {CHOICE}:"))
    assert "one input's share of" in note and "router.bias" in note, note


@pytest.mark.parametrize("along, same", [(False, True), (True, False)])
def test_a_share_of_another_input_is_not_the_token_s(base, along, same):
    """The same, each bias's error in another direction than its weight's, or the router's
    weight one input's share of another input than the expert's: it fails there."""
    c = _compare(base, f"choice-{along}-{same}", _spike(share=0, along=along, same=same))
    assert c.verdict == "fail"
    assert next(r.update for r in c.results if not r.ok) == CHOICE


def test_a_part_of_the_model_off_after_a_choice_is_noted_not_failed(base):
    """The head half of itself off at update 7 (1/factor is a quarter), the model's gradient
    turned between CHOICE_COSINE and WHOLE_COSINE, after one token's share at update 3: noted,
    and it passes (a mutation back to 1/factor, or to WHOLE_COSINE, fails it)."""
    c = _compare(base, "parted", _spike())
    cosine = _at(c, PARTED).grad_cosine
    assert CHOICE_COSINE < cosine < WHOLE_COSINE, cosine  # the case the rule is for
    assert c.verdict == "pass", [d.message for d in c.diagnosis]
    assert any("one input's share of expert.weight" in n for n in c.notes), c.notes
    assert any(n.startswith(f"update(s) {PARTED}:") and "all of itself" in n for n in c.notes)


def test_without_a_choice_before_the_same_failure_fails(base):
    """No token's route flipped before: the head half of itself off at update 7 fails there."""
    c = _compare(base, "unparted", _spike(choice=False))
    assert c.verdict == "fail"
    assert next(r.update for r in c.results if not r.ok) == PARTED


def test_the_same_error_stepped_with_fails(base):
    """The error stepped with (the weights leave their noise: no quiet update) fails."""
    c = _compare(base, "stepped", _spike(), feed=True)
    assert c.verdict == "fail"
    assert not all(d.ok for d in _at(c, PARTED).weights)


@pytest.mark.parametrize("share", [0.5, 1.5])
def test_a_part_of_the_model_scaled_fails(base, share):
    """The head scaled by 1.5 (the model's gradient scaled beyond 1%) or 2.5 (off by more than
    all of itself) after the choice: no parting explains it."""
    c = _compare(base, f"scaled-{share}", _spike(share=share, scaled=True))
    assert c.verdict == "fail"
    assert next(r.update for r in c.results if not r.ok) == PARTED


@pytest.fixture(scope="module")
def clean(base):
    """A clean merged run judged: what each gradient and weight may differ by, per update."""
    c = _compare(base, "clean", None)
    assert c.verdict == "pass"
    return {r.update: {(d.name, kind): d for kind in ("grads", "weights")
                       for d in getattr(r, kind)} for r in c.results}  # fmt: skip


def _token(name: str, size: float, seed: int, x: np.ndarray | None = None):
    """A rank-one error (one input's share: `x`, else a random one) of norm `size` in the weight
    `name`, and its δ."""
    rng = np.random.default_rng(seed)
    delta = rng.normal(size=16 if name.startswith("expert") else 4)
    x = rng.normal(size=COLS) if x is None else x
    term = np.outer(delta, x)
    return term / np.linalg.norm(term) * size, delta


@pytest.mark.parametrize("module", ["expert", "router"])
def test_a_bias_beside_a_passing_weight_s_token_is_its_jump(base, clean, module):
    """Only one bias fails at update 3, along its weight's error, which is one input's share and
    passes at about five times its noise (`choices.anchors`): the expert's bias beside the
    expert's weight; or the router's beside the router's weight (4 rows, too few for a rank
    alone), of the same input as the expert's weight passing beside it. One jump, noted (a
    mutation reading no passing weight fails it). The same bias error in another direction
    fails."""
    weights = ("expert.weight", "router.weight") if module == "router" else ("expert.weight",)
    sizes = {}
    for name in weights:
        weight = clean[CHOICE][(name, "grads")]
        sizes[name] = (FACTOR * weight.noise + weight.allowed) / 2  # over its noise, passing
        assert FACTOR * weight.noise * 1.1 < sizes[name] < weight.allowed * 0.9
    bias = clean[CHOICE][(f"{module}.bias", "grads")]

    def spike(along: bool):
        def alter(u: int, g: dict) -> dict:
            if u == CHOICE:
                x = np.random.default_rng(5).normal(size=COLS)
                for name in weights:
                    term, delta = _token(name, sizes[name], 9 if name == "router.weight" else 5, x)
                    g[name] += term.astype(np.float32)
                off = delta if along else np.random.default_rng(6).normal(size=delta.shape)
                g[f"{module}.bias"] += (off / np.linalg.norm(off) * 4 * bias.allowed).astype(
                    np.float32
                )
            return g

        return alter

    c = _compare(base, f"bias-beside-{module}", spike(True))
    grads = {d.name: d for d in _at(c, CHOICE).grads}
    assert all(grads[name].error > FACTOR * grads[name].noise for name in weights)
    assert c.verdict == "pass", [d.message for d in c.diagnosis]
    assert any(n.startswith(f"update {CHOICE}:") and f"{module}.bias" in n for n in c.notes)
    c = _compare(base, f"bias-across-{module}", spike(False))
    assert c.verdict == "fail"
    assert next(r.update for r in c.results if not r.ok) == CHOICE


def test_a_router_s_bias_beside_its_quiet_weight_is_the_token_s(base, clean):
    """The expert's weight passing at about five times its noise (one input's share), the
    router's weight 3.6 times its noise (under the factor: no anchor), rank one and of the same
    input, and only the router's bias failing, along the router weight's error: the router's
    bias is the token's share (`choices.same_inputs`), one jump, noted. Model zoo run 235043 (a
    tiny mixture of experts under float16 autocast, Adagrad, K=8). The bias in another
    direction fails there (a mutation reading no quiet weight fails the first)."""
    expert = clean[CHOICE][("expert.weight", "grads")]
    router = clean[CHOICE][("router.weight", "grads")]
    sizes = {
        "expert.weight": (FACTOR * expert.noise + expert.allowed) / 2,
        "router.weight": 3.6 * router.noise,
    }
    bias = clean[CHOICE][("router.bias", "grads")]

    def spike(along: bool):
        def alter(u: int, g: dict) -> dict:
            if u == CHOICE:
                x = np.random.default_rng(5).normal(size=COLS)
                for name, size in sizes.items():
                    term, delta = _token(name, size, 9 if name == "router.weight" else 5, x)
                    g[name] += term.astype(np.float32)
                off = delta if along else np.random.default_rng(6).normal(size=delta.shape)
                g["router.bias"] += (off / np.linalg.norm(off) * 4 * bias.allowed).astype(
                    np.float32
                )
            return g

        return alter

    c = _compare(base, "bias-beside-quiet-router", spike(True))
    grads = {d.name: d for d in _at(c, CHOICE).grads}
    assert grads["router.weight"].ok and grads["router.weight"].error < FACTOR * router.noise
    assert c.verdict == "pass", [d.message for d in c.diagnosis]
    assert any(n.startswith(f"update {CHOICE}:") and "router.bias" in n for n in c.notes)
    c = _compare(base, "bias-across-quiet-router", spike(False))
    assert c.verdict == "fail"
    assert next(r.update for r in c.results if not r.ok) == CHOICE


def test_a_token_stepped_with_before_a_quiet_one_is_read_again(base, clean):
    """One input's share of the expert's weight at update 3, stepped with (its weights four
    times their noise and more, within what they may), then another at update 4, quiet: update
    3's neighbour fails until update 4 is excused, and update 3 is read once more then. It
    passes with both noted (a mutation reading no update twice fails it at update 3)."""
    weights = clean[CHOICE][("expert.weight", "weights")]
    size = 0.8 * weights.allowed / LR  # stepped with: the weights' error LR times it

    def spike(u: int, g: dict) -> dict:
        if u == CHOICE:
            g["expert.weight"] += _token("expert.weight", size, 7)[0].astype(np.float32)
        if u == CHOICE + 1:
            norm = np.linalg.norm(g["expert.weight"])
            g["expert.weight"] += _token("expert.weight", 1e-3 * norm, 8)[0].astype(np.float32)
        return g

    c = _compare(base, "read-again", spike, feed={CHOICE})
    moved = next(d for d in _at(c, CHOICE).weights if d.name == "expert.weight")
    assert FACTOR * moved.noise < moved.error <= moved.allowed  # stepped, not failed
    assert c.verdict == "pass", [d.message for d in c.diagnosis]
    for u in (CHOICE, CHOICE + 1):
        assert any(n.startswith(f"update {u}:") for n in c.notes), c.notes
