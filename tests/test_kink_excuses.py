"""What a kink excuses beyond its own row, and what it never does (judge/kinks.py,
judge/kink_divergence.py), on two-module least-squares runs (tests/least_squares.py) and on
results built by hand: the runs parted after it, its echo upstream, isolated and quiet jumps, a
step with the jump that left the noise; never a wrong loss scale in a tensor of one row."""

from __future__ import annotations

import numpy as np
import pytest

from tests.least_squares import _failing, reference_and_baseline


def _scalar_scaled_loop(out, k: int, divisor: float, float64: bool = False):
    """A tanh MLP times a learnable 0-d temperature (CLIP's logit_scale), SGD; each
    micro-batch's loss divided by `divisor` (K is right)."""
    import torch

    import gradalign

    torch.manual_seed(0)
    body = torch.nn.Sequential(torch.nn.Linear(10, 16), torch.nn.Tanh(), torch.nn.Linear(16, 4))
    model = torch.nn.ModuleDict({"body": body})
    model.register_parameter("logit_scale", torch.nn.Parameter(torch.tensor(1.0)))
    model = model.double() if float64 else model
    g = torch.Generator().manual_seed(1)
    x, y = torch.randn(8 * 32, 10, generator=g), torch.randint(0, 4, (8 * 32,), generator=g)
    x = x.double() if float64 else x
    opt = torch.optim.SGD(model.parameters(), lr=0.5)
    n = 32 // k
    with gradalign.Recorder(out, model, opt, accum_steps=k) as rec:
        for u in range(8):
            for j in range(k):
                rows = slice(u * 32 + j * n, u * 32 + (j + 1) * n)
                logits = model["body"](x[rows]) * model.logit_scale
                loss = torch.nn.functional.cross_entropy(logits, y[rows])
                (loss / divisor).backward()
                rec.micro(loss.detach(), batch=(x[rows], y[rows]))
            opt.step()
            rec.update()
            opt.zero_grad()
    return out


def test_a_wrong_scale_is_no_kink_in_a_tensor_of_one_row(tmp_path):
    """A 0-d temperature holds its whole error in its one row: the loss divided by 7 for K=8
    (every gradient 8/7 times the baseline's) was followed as a kink crossed, and passed."""
    from gradalign.api import compare

    base = _scalar_scaled_loop(tmp_path / "base", 1, 1)
    ref = _scalar_scaled_loop(tmp_path / "ref", 1, 1, float64=True)
    clean = compare(base, _scalar_scaled_loop(tmp_path / "clean", 8, 8), reference=ref)
    assert clean.verdict == "pass", [d.message for d in clean.diagnosis]
    bug = _scalar_scaled_loop(tmp_path / "bug", 8, 7)
    for reference in (ref, "none"):
        result = compare(base, bug, reference=reference)
        assert result.verdict == "fail", [d.message for d in result.diagnosis]
        assert result.diagnosis[0].code == "loss-scale", [d.code for d in result.diagnosis]


@pytest.mark.parametrize(
    ("ratios", "before", "failed", "expected"),
    [
        ((14.9, 0.5), (1.1, 0.5), False, True),  # the kink's own row stepped 14.9x its noise
        ((3.0, 0.5), (1.1, 0.5), False, False),  # within the factor: the step kept its noise
        ((10.0, 0.5), (5.0, 0.5), False, False),  # drifted before the kink: not this step's
        ((0.5, 0.5), (0.5, 0.5), True, True),  # a weight failed
        ((None, None), (None, None), False, True),  # no noise (no reference): any jump counts
    ],
)
def test_a_step_with_the_jump_is_a_weight_leaving_its_noise(ratios, before, failed, expected):
    """Whether the step taken with a jumped gradient left the rounding, as a kink's must to be
    followed (`stepped`): a weight failed, or stood over the factor times its noise and the
    factor times further than the update before, passing by what a drift allows (model zoo
    run 7155: the kink's row 14.9x its noise at update 83, 0.001 of what was allowed)."""
    from gradalign.judge.kinks import stepped
    from gradalign.judge.metrics import TensorDiff
    from gradalign.judge.results import UpdateResult

    def result(u: int, over: tuple, fail: bool = False) -> UpdateResult:
        weights = [
            TensorDiff(
                name,
                0,
                0,
                0,
                1,
                1.0 if x is None else x * 1e-6,
                1e-9 if fail else 1.0,
                noise=None if x is None else 1e-6,
            )
            for name, x in zip(("w", "b"), over, strict=True)
        ]
        return UpdateResult(u, 1, 1, 0, 0, 1, weights=weights)

    assert stepped(result(1, ratios, failed), result(0, before), 4.0) is expected


def _joined(a: dict, b: dict) -> dict:
    """Two single-tensor runs as one model of two modules, `a.w` and `b.w` (the loss their sum)."""
    both = {"init_weights": {"a.w": a["init_weights"]["w"], "b.w": b["init_weights"]["w"]}}
    for key in ("update_weights", "grads"):
        both[key] = [{"a.w": x["w"], "b.w": y["w"]} for x, y in zip(a[key], b[key], strict=True)]
    losses = zip(a["micro_losses"], b["micro_losses"], strict=True)
    both["micro_losses"] = [x + y for x, y in losses]
    return both


def _two_modules(dtype, k: int = 1, parted: bool = False, bug_from: int | None = None) -> dict:
    """Two least-squares modules, `a` and `b`, trained side by side as one model (the loss is
    their sum). With `parted`: a kink in one row of `a` at update 6 (1e-3 of the gradient's
    largest element), the step taken with it, then from update 8 `a`'s recorded gradient off
    in five rows, each 4 times that (runs parted by the kink: more units flip at more inputs);
    from `bug_from` on, every gradient of both 1.03 times itself, stepped with."""
    from tests.least_squares import train

    def spike(module: str):
        def altered(u, g):
            if module == "a" and parted and u == 6:
                g[3] += 1e-3 * np.abs(g).max()
            return g * 1.03 if bug_from is not None and u >= bug_from else g

        return altered

    both = _joined(*(train(dtype, k=k, spike=spike(m), feed=True) for m in "ab"))
    for u, grads in enumerate(both["grads"]):
        if parted and u >= 8:
            g = grads["a.w"] = grads["a.w"].copy()
            g[[5, 9, 13, 17, 21]] += 4e-3 * np.abs(g).max()
    return both


@pytest.fixture(scope="module")
def two_module_runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("two-modules")
    return root, reference_and_baseline(root, _two_modules)[1]


def _parted_run(two_module_runs, name: str, **options):
    from gradalign import api
    from gradalign.runs.portable import write_run

    root, base = two_module_runs
    path = write_run(root / name, accum_steps=4, **_two_modules(np.float32, k=4, **options))
    return api.compare(base, path)


def test_runs_parted_by_a_kink_may_differ_in_part_of_the_model(two_module_runs, monkeypatch):
    """After a followed kink, gradient failures in a part of the model, the rest (at least as
    many elements) and every weight within what is allowed, are the parted runs' own (model zoo
    runs 7305 and 7424: feed-forward layers 10% to 23% off over tens of updates): noted, not
    failed, and the size followed rises to the share they stood off (the runs part further as
    they go: model zoo runs 52030 and 60020, ResNets under GroupNorm at width 4), so updates 9
    to 11, as far off, pass. Without that they fail; a bug that moves the other module too
    still fails."""
    result = _parted_run(two_module_runs, "parted", parted=True)
    assert result.verdict == "pass", _failing(result)
    (note,) = [n for n in result.notes if "the runs have parted at the kinks" in n]
    assert note.startswith("update 8: the gradients of a stood up to "), note
    assert "From the update after each, each gradient may differ by 4 x the share" in note
    assert all(d.excused == "parted" for d in result.results[8].grads if d.name == "a.w")
    assert all(d.excused is None for u in (9, 10, 11) for d in result.results[u].grads)
    bug = _parted_run(two_module_runs, "parted-then-bug", parted=True, bug_from=10)
    assert bug.verdict == "fail" and not bug.results[10].ok
    monkeypatch.setattr("gradalign.judge.kink_divergence._excuse_parted", lambda *a: [])
    unexcused = _parted_run(two_module_runs, "parted-unexcused", parted=True)
    assert unexcused.verdict == "fail" and not unexcused.results[8].ok


def _kink_with_echo(dtype, k: int = 1, kink: bool = True, echo: float = 0.0) -> dict:
    """The two modules, recorded apart from the step: with `kink`, one row of `a` jumps at
    update 6 (1e-3 of the gradient's largest element, a share of about 4e-4 of `a`'s gradient);
    `b`'s gradient there is (1 + `echo`) times itself, spread over every element (what a unit
    flipped for one sample sends upstream)."""
    from tests.least_squares import train

    def spike(module: str):
        def altered(u, g):
            if u == 6 and module == "a" and kink:
                g[3] += 1e-3 * np.abs(g).max()
            return g * (1 + echo) if u == 6 and module == "b" else g

        return altered

    return _joined(*(train(dtype, k=k, spike=spike(m)) for m in "ab"))


@pytest.mark.parametrize(
    "name, kink, echo, passes",
    [
        ("echo", True, 1e-4, True),  # a smaller share than the kink's: upstream of it
        ("echo-larger", True, 2e-3, False),  # a larger share: no kink's echo
        ("echo-alone", False, 1e-4, False),  # no kink: a spread jump
    ],
)
def test_a_kinks_echo_upstream_is_excused_with_it(two_module_runs, name, kink, echo, passes):
    """An isolated kink's jump with, beside it, a tensor off by a smaller share of itself,
    spread (the backward of the tensors before the flipped unit): noted with the kink. A larger
    share, or no kink beside it, still fails."""
    from gradalign import api
    from gradalign.runs.portable import write_run

    root, base = two_module_runs
    path = write_run(root / name, accum_steps=4, **_kink_with_echo(np.float32, 4, kink, echo))
    result = api.compare(base, path)
    assert result.results[6].grads[1].name == "b.w" and not result.results[6].grads[1].ratio < 1
    assert (result.verdict == "pass") is passes, _failing(result)
    if passes:
        assert any("b.w upstream of it" in n for n in result.notes), result.notes


class _Grads:
    """A run that answers `grads(update)` alone, of a model with no batch-counting layer."""

    def __init__(self, grads: dict) -> None:
        self._grads = grads
        self.model_facts: dict = {}
        self.tensors: list = []

    def grads(self, update: int):
        return self._grads.get(update)


@pytest.mark.parametrize(
    "jumps, weights_over, excused, size",
    [
        # stepped with (the weights 14.9x their noise, 1.1x the update before), apart
        ({3: 3, 8: 10}, {3: 14.9, 8: 14.9}, [3, 8], 0.5),  # past the first, a unit of its own
        ({3: 3, 8: 3}, {3: 14.9, 8: 14.9}, [3], 0.5),  # the same unit again: an error that stays
        ({6: 3, 7: 3}, {6: 14.9, 7: 70.0}, [], 0.5),  # in a row, each further: not isolated
        # quiet (every weight within its noise, as the update before): in a row, one unit
        ({6: 3, 7: 3, 8: 3}, {}, [6, 7, 8], 0.5),
        ({6: 3, 7: 3, 8: 3}, {}, [], 50.0),  # the tensor off by all of itself: no sample's share
    ],
)
def test_which_localized_jumps_are_excused(jumps, weights_over, excused, size):
    """`excuse_isolated_jumps` on 12 updates of one 40x6 tensor whose gradient jumps by `size`
    in one row at `jumps` (update: row), its weights `weights_over` times their noise there (1.1
    times elsewhere): isolated jumps (1 + updates // 100 of them, and past those each further
    one in units of its own), and those whose step stayed in the noise, in a row or not, each
    off by less than 1/factor of the tensor."""
    ref = np.random.default_rng(0).normal(size=(40, 6))
    grads = {}
    for u in range(12):
        grads[u] = ref.copy()
        if u in jumps:
            grads[u][jumps[u]] += size
    found, notes = _excused_jumps(ref, grads, set(jumps), weights_over)
    assert found == excused
    assert len(notes) == len(excused)


def _excused_jumps(
    ref: np.ndarray, grads: dict[int, np.ndarray], jumps: set[int], weights_over: dict
) -> tuple[list[int], list[str]]:
    """`excuse_isolated_jumps` on one tensor `w` whose reference gradient is `ref` at every
    update and whose merged one is `grads[update]`: its gradient failing at `jumps` (2.0 against
    an allowed 1.0, 0.5 elsewhere, noise 0.1), its weights `weights_over` times their noise
    (1.1 times where not given); the excused updates, and the notes."""
    from gradalign.judge.kinks import excuse_isolated_jumps
    from gradalign.judge.metrics import TensorDiff
    from gradalign.judge.results import UpdateResult

    results = []
    for u in sorted(grads):
        over = weights_over.get(u, 1.1)
        weight = TensorDiff("w", 0, 0, 0, 1, over * 1e-6, 1.0, noise=1e-6)
        grad = TensorDiff("w", 0, 0, 0, 1, 2.0 if u in jumps else 0.5, 1.0, noise=0.1)
        results.append(UpdateResult(u, 1, 1, 0, 0, 1, weights=[weight], grads=[grad]))
    merged = _Grads({u: {"w": g} for u, g in grads.items()})
    notes = excuse_isolated_jumps(results, merged, _Grads({u: {"w": ref} for u in grads}), 4.0)
    return [r.update for r in results if r.grads[0].excused], notes


@pytest.mark.parametrize("inputs, excused", [((1, 2), [3, 8]), ((1, None), [3])])
def test_a_choice_made_per_input_again_in_the_same_tensor_is_one_of_its_own(inputs, excused):
    """`excuse_isolated_jumps` on 12 updates of one 48x24 tensor (an expert's weight) whose
    gradient jumps at updates 3 and 8 by one input's share, a rank-one outer product over every
    row, stepped with both times (the weights 14.9x their noise): past the first stepped jump a
    further one must be held in units of its own, and one input's share is one (a window holds
    other inputs than the one before; model zoo run 212069 failed at update 18 as `unexplained`).
    A kink in rows is held to its rows (above); a second jump that is no input's share (noise
    over every element, of full rank) still fails."""
    rng = np.random.default_rng(1)
    ref = rng.normal(size=(48, 24))
    shares = {3: inputs[0], 8: inputs[1]}
    grads = {}
    for u in range(12):
        grads[u] = ref.copy()
        if shares.get(u, 0) is None:
            grads[u] += 0.1 * rng.normal(size=ref.shape)  # spread: no one input's share
        elif u in shares:
            grads[u] += 0.1 * np.outer(rng.normal(size=48), rng.normal(size=24))
    found, notes = _excused_jumps(ref, grads, set(shares), {u: 14.9 for u in shares})
    assert found == excused
    assert len(notes) == len(excused)
    assert "one input's share" in notes[0]


@pytest.mark.parametrize(
    "jumps, spread, excused",
    [
        ({3: 3}, {6: 0.05}, {3: "isolated jump", 6: "parted"}),  # after a jump: parted
        ({}, {6: 0.05}, {}),  # no jump before it: a spread failure fails
        ({3: 3}, {6: 0.5}, {3: "isolated jump"}),  # off by over 1/factor of itself: fails
    ],
)
def test_a_quiet_spread_failure_after_a_jump_is_the_runs_parting(jumps, spread, excused):
    """`excuse_isolated_jumps` on 12 updates of two 40x6 tensors, `w` and `v`, every weight
    within its noise (1.1 times it): `w`'s gradient jumps in one row at `jumps` (update: row)
    and is off by the share `spread` of itself, over every row, at `spread`'s updates; `v`
    passes throughout. After a quiet jump, a quiet update whose failures leave most of the
    model's gradients passing, each off by less than 1/factor of itself, is the runs' parting;
    with no jump before it, or a tensor off by more, it fails."""
    from gradalign.judge.kinks import excuse_isolated_jumps
    from gradalign.judge.metrics import TensorDiff
    from gradalign.judge.results import UpdateResult

    rng = np.random.default_rng(0)
    ref = {"w": rng.normal(size=(40, 6)), "v": rng.normal(size=(40, 6))}
    grads, results = {}, []
    for u in range(12):
        g = {name: x.copy() for name, x in ref.items()}
        if u in jumps:
            g["w"][jumps[u]] += 0.5
        if u in spread:
            g["w"] *= 1 + spread[u]
        grads[u] = g
        weights = [TensorDiff(n, 0, 0, 0, 1, 1.1e-6, 1.0, noise=1e-6, size=240) for n in g]
        failing = u in jumps or u in spread
        diffs = [
            TensorDiff("w", 0, 0, 0, 1, 2.0 if failing else 0.5, 1.0, noise=0.1, size=240),
            TensorDiff("v", 0, 0, 0, 1, 0.5, 1.0, noise=0.1, size=240),
        ]
        results.append(UpdateResult(u, 1, 1, 0, 0, 1, weights=weights, grads=diffs))
    reference = _Grads({u: ref for u in grads})
    excuse_isolated_jumps(results, _Grads(grads), reference, 4.0)
    assert {r.update: r.grads[0].excused for r in results if r.grads[0].excused} == excused
