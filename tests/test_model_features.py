"""Model and loop features a user's loop may have, recorded through `Recorder`: a loss of two
heads reduced apart, an optimizer that steps in a closure (LBFGS) or in backward, a sparse
embedding sketched narrowly, micro-batches holding no labelled item, items given as weights."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

import gradalign
from gradalign import api

from .feature_loops import _clean_passes_and_unscaled_loss_is_named, heads_loop


@pytest.mark.parametrize(
    ("bug", "ratio", "tensors"),
    [
        ("mean-head-not-over-k", 4, ["cls.weight", "cls.bias"]),
        ("sum-head-over-k", 0.25, ["reg.weight", "reg.bias"]),
    ],
)
def test_one_loss_term_scaled_alone_is_named_loss_scale(tmp_path, bug, ratio, tensors):
    """A loss that sums a mean-reduced head and a sum-reduced head, one of them scaled wrong:
    the tensors only that head reaches are K (or 1/K) times the baseline's, the shared trunk a
    mixture, the whole gradient no multiple (it was 'unexplained')."""
    heads_loop(tmp_path / "r", 1, 0, float64=True)
    heads_loop(tmp_path / "b", 1, 0, reference="../r")
    heads_loop(tmp_path / "m", 4, 0, bug=bug)
    buggy = api.compare(tmp_path / "b", tmp_path / "m")
    first = buggy.diagnosis[0]
    assert (first.code, first.evidence["expected_ratio"]) == ("loss-scale", ratio)
    assert first.evidence["scaled_tensors"] == tensors


def lbfgs_loop(out, k, *, float64=False, reference=None):
    """LBFGS with max_iter=3 evaluates its closure (all K micro-batches) up to 3 times per
    step, at other weights each time: micro() runs more often than K in every window."""
    torch.manual_seed(0)
    model = nn.Linear(6, 2).double() if float64 else nn.Linear(6, 2)
    opt = torch.optim.LBFGS(model.parameters(), lr=0.5, max_iter=3)
    x = torch.randn(16, 6, generator=torch.Generator().manual_seed(1))
    x = x.double() if float64 else x
    with gradalign.Recorder(out, model, opt, accum_steps=k, reference=reference) as rec:

        def closure():
            opt.zero_grad()
            for rows in torch.arange(16).chunk(k):
                loss = model(x[rows]).pow(2).mean()
                (loss / k).backward()
                rec.micro(loss, batch=x[rows])
            return loss

        opt.step(closure)
        rec.update()


def test_a_closure_run_several_times_per_step_is_bookkeeping_without_numpy_warnings(tmp_path):
    """No window lines up (the first holds 3 micro-steps at K=1), so no update is judged: the
    loss noise pooled over none of them warned 'Mean of empty slice' on the user's terminal."""
    import warnings

    lbfgs_loop(tmp_path / "r", 1, float64=True)
    lbfgs_loop(tmp_path / "b", 1, reference="../r")
    lbfgs_loop(tmp_path / "m", 2)
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        result = api.compare(tmp_path / "b", tmp_path / "m")
    assert [d.code for d in result.diagnosis][:1] == ["window-bookkeeping"]


def in_backward_loop(out, k, *, give, float64=False, reference=None):
    """The optimizer-in-backward recipe: one Adam per parameter, stepped (and zeroed) by a
    post-accumulate-grad hook in every backward, K micro-steps or not. `give`: the Recorder
    gets the first parameter's optimizer ("one") or one that nothing steps ("idle")."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(6, 8), nn.Tanh(), nn.Linear(8, 2))
    model = model.double() if float64 else model
    opts = {p: torch.optim.Adam([p], lr=1e-2) for p in model.parameters()}

    def step(p):
        opts[p].step()
        opts[p].zero_grad()

    hooks = [p.register_post_accumulate_grad_hook(step) for p in model.parameters()]
    idle = torch.optim.SGD(model.parameters(), lr=0.0)
    watched = opts[next(iter(model.parameters()))] if give == "one" else idle
    x = torch.randn(16 * 3, 6, generator=torch.Generator().manual_seed(1))
    x = x.double() if float64 else x
    with gradalign.Recorder(out, model, watched, accum_steps=k, reference=reference) as rec:
        for update in range(3):
            for rows in torch.arange(update * 16, (update + 1) * 16).chunk(k):
                loss = model(x[rows]).pow(2).mean()
                (loss / k).backward()
                rec.micro(loss, batch=x[rows])
            rec.update()
    for hook in hooks:
        hook.remove()


@pytest.mark.parametrize("give", ["one", "idle"])
def test_an_optimizer_in_backward_stepping_every_micro_step(tmp_path, give):
    """Given one of the per-parameter optimizers, the Recorder sees 4 steps per update:
    step-in-window. Given one that never steps, the judge cannot see the steps, and says why."""
    in_backward_loop(tmp_path / "r", 1, give=give, float64=True)
    in_backward_loop(tmp_path / "b", 1, give=give, reference="../r")
    in_backward_loop(tmp_path / "m", 4, give=give)
    result = api.compare(tmp_path / "b", tmp_path / "m")
    assert result.verdict == "fail"
    if give == "one":
        assert result.diagnosis[0].code == "step-in-window"
    else:
        assert any("the optimizer given to the Recorder never stepped" in n for n in result.notes)


def bag_loop(out, k, *, bug=None, float64=False, reference=None):
    """One Embedding (24 x 6 = 144 elements), every tensor sketched at width 31."""
    torch.manual_seed(0)
    model = nn.Embedding(24, 6, sparse=True)
    model = model.double() if float64 else model
    opt = torch.optim.SparseAdam(model.parameters(), lr=0.05)
    tokens = torch.randint(0, 24, (16 * 3, 5), generator=torch.Generator().manual_seed(1))
    sketch = {"record": "sketch", "sketch_width": 31, "updates": 3}
    with gradalign.Recorder(out, model, opt, accum_steps=k, reference=reference, **sketch) as rec:
        for update in range(3):
            for rows in torch.arange(update * 16, (update + 1) * 16).chunk(k):
                logits = model(tokens[rows]).mean(1)
                loss = nn.functional.cross_entropy(logits, tokens[rows, 0] % 6)
                (loss if bug == "no-loss-scale" else loss / k).backward()
                rec.micro(loss, batch=tokens[rows])
            opt.step()
            rec.update()
            opt.zero_grad()


def test_a_narrow_sketch_still_bounds_an_error_from_below(tmp_path):
    """A sketch of width 31 over 144 elements: its statistical lower bound on an error is 0,
    so a gradient 4 times too large passed as '1x the noise floor' (named loss-averaging from
    the losses); ||S(v)|| / sqrt(ceil(n/d)) bounds it always, and names it."""
    from gradalign.runs.sketches import estimate, sketch

    v = np.zeros(144)
    v[[3, 40, 77]] = [1.0, -2.0, 0.5]
    found = estimate(sketch(v, 31), False, 144)
    assert 0 < found.low <= np.linalg.norm(v) <= found.high
    _clean_passes_and_unscaled_loss_is_named(bag_loop, tmp_path)


def _sparse_labels(out, k: int, per_micro_mean: bool = False):
    """A classifier where about one row in eight is labelled (the rest -100), its summed loss
    divided by the batch's labelled count; some micro-batches hold no labelled row (items 0).
    `per_micro_mean`: each micro-batch's mean (of at least one item) divided by K instead."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(10, 48), nn.ReLU(), nn.Linear(48, 4))
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    g = torch.Generator().manual_seed(3)
    updates, batch = 6, 32
    x = torch.randn(updates * batch, 10, generator=g)
    y = x[:, :4].argmax(1)
    labelled = torch.rand(updates * batch, generator=g) < 0.12
    labelled[::batch] = True
    y[~labelled] = -100
    size = batch // k
    with gradalign.Recorder(out, model, opt, accum_steps=k) as rec:
        for u in range(updates):
            total = int((y[u * batch : (u + 1) * batch] != -100).sum())
            for j in range(k):
                rows = slice(u * batch + j * size, u * batch + (j + 1) * size)
                summed = nn.functional.cross_entropy(
                    model(x[rows]), y[rows], ignore_index=-100, reduction="sum"
                )
                count = int((y[rows] != -100).sum())
                share = summed / max(count, 1) / k if per_micro_mean else summed / total
                share.backward()
                rec.micro(loss_sum=summed.detach(), items=count, batch=(x[rows], y[rows]))
            opt.step()
            rec.update()
            opt.zero_grad()
    return out


def test_token_normalization_is_named_where_some_micro_batches_hold_no_item(tmp_path):
    """Micro-batches holding 2, 0, 0 and 1 labelled rows: each mean divided by K weights the
    held rows by N/(K n_j) and the empty ones add nothing either way; it was `unexplained`
    (a window with an empty micro-batch was never tried). The correct loop passes."""
    base = _sparse_labels(tmp_path / "base", 1)
    merged = _sparse_labels(tmp_path / "merged", 4)
    assert api.compare(base, merged, reference="none").verdict == "pass"
    bug = api.compare(base, _sparse_labels(tmp_path / "bug", 4, True), reference="none")
    assert bug.verdict == "fail" and bug.diagnosis[0].code == "token-normalization"
    assert 0 in bug.diagnosis[0].evidence["items_per_micro_batch"]


def test_item_weights_are_shown_as_given_not_truncated():
    """Float items (sample weights) were printed by int(): 7.511 read as 7."""
    from gradalign.judge.signatures.reweighting import _count

    assert [_count(n) for n in (10.0, 7.511, 8.125)] == ["10", "7.511", "8.125"]
