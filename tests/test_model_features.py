"""Model features a user's loop may have, recorded through `Recorder`: parameters of mixed
dtypes (a bfloat16 layer beside float32 ones), a whole model in float16, complex parameters."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

import gradalign
from gradalign import api
from gradalign.errors import BadInput
from gradalign.record.recorder import RecorderError

BATCH, UPDATES = 32, 3


class Mixed(nn.Module):
    """A bfloat16 layer between float32 ones (the activations cast at its edges)."""

    def __init__(self):
        super().__init__()
        self.a = nn.Linear(12, 24)
        self.b = nn.Linear(24, 24).to(torch.bfloat16)
        self.c = nn.Linear(24, 3)

    def forward(self, x):
        h = torch.tanh(self.a(x))
        return self.c(torch.tanh(self.b(h.to(self.b.weight.dtype)).to(h.dtype)))


def mixed_loop(out, k, *, float64=False, bug=None, reference=None):
    torch.manual_seed(0)
    model = Mixed().double() if float64 else Mixed()
    opt = torch.optim.SGD(model.parameters(), lr=0.2)
    x = torch.randn(BATCH * UPDATES, 12, generator=torch.Generator().manual_seed(1))
    y = x[:, :3].argmax(1)
    x = x.double() if float64 else x
    batches = list(zip(x.split(BATCH), y.split(BATCH), strict=True))
    _record(out, model, opt, k, batches, nn.functional.cross_entropy, bug, reference)


def _record(out, model, opt, k, batches, loss_of, bug=None, reference=None) -> None:
    """`model` trained on `batches`, one (x, y) per update, each split into k micro-batches
    whose loss (`loss_of(output, y)`) is divided by k (not with `bug="no-loss-scale"`)."""
    with gradalign.Recorder(out, model, opt, accum_steps=k, reference=reference) as rec:
        for x, y in batches:
            for xs, ys in zip(x.chunk(k), y.chunk(k), strict=True):
                loss = loss_of(model(xs), ys)
                (loss if bug == "no-loss-scale" else loss / k).backward()
                rec.micro(loss, batch=(xs, ys))
            opt.step()
            rec.update()
            opt.zero_grad()


def _clean_passes_and_unscaled_loss_is_named(loop, tmp_path) -> None:
    """`loop` recorded as the float64 reference, the baseline (K=1), a clean merged run (K=4)
    and one whose loss is not divided by K: the clean one passes, the other is `loss-scale`."""
    loop(tmp_path / "r", 1, float64=True)
    loop(tmp_path / "b", 1, reference="../r")
    loop(tmp_path / "m", 4)
    loop(tmp_path / "bug", 4, bug="no-loss-scale")
    clean = api.compare(tmp_path / "b", tmp_path / "m")
    assert clean.verdict == "pass", [d.code for d in clean.diagnosis]
    buggy = api.compare(tmp_path / "b", tmp_path / "bug")
    assert [d.code for d in buggy.diagnosis][:1] == ["loss-scale"]


def test_a_bfloat16_layer_beside_float32_ones_is_judged_by_its_reference(tmp_path):
    """The float64 rerun of a model with a bfloat16 layer is its reference: the layer's weights
    are rounded to bfloat16 at every step, and its gradient rounding reaches every layer before
    it, so the baseline strays from the rerun by bfloat16's rounding (it was refused as 'not a
    rerun', judged by float32's)."""
    _clean_passes_and_unscaled_loss_is_named(mixed_loop, tmp_path)


def test_a_bfloat16_layer_beside_float32_ones_gets_bfloat16_tolerances(tmp_path):
    """Without a reference, a run with a bfloat16 layer computes in bfloat16 (its layer, and
    every gradient through it): it is judged by bfloat16's fixed tolerances, not float32's
    (it failed at 248x float32's weight tolerance, 'unexplained')."""
    mixed_loop(tmp_path / "b", 1)
    mixed_loop(tmp_path / "m", 4)
    mixed_loop(tmp_path / "bug", 4, bug="no-loss-scale")
    clean = api.compare(tmp_path / "b", tmp_path / "m")
    assert (clean.verdict, clean.dtype) == ("pass", "bfloat16"), [d.code for d in clean.diagnosis]
    buggy = api.compare(tmp_path / "b", tmp_path / "bug")
    assert [d.code for d in buggy.diagnosis][:1] == ["loss-scale"]


def low_loop(out, dtype, *, reference=None):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(12, 16), nn.Tanh(), nn.Linear(16, 3)).to(dtype)
    opt = torch.optim.SGD(model.parameters(), lr=0.2)
    x = torch.randn(BATCH, 12, generator=torch.Generator().manual_seed(1)).half().to(dtype)
    with gradalign.Recorder(out, model, opt, reference=reference) as rec:
        loss = nn.functional.cross_entropy(model(x).float(), x[:, :3].argmax(1))
        loss.backward()
        rec.micro(loss, batch=x)
        opt.step()
        rec.update()


@pytest.mark.parametrize("low", [torch.float16, torch.bfloat16])
def test_a_reference_cast_from_the_unrounded_weights_is_named(tmp_path, low):
    """A 16-bit model's float64 rerun cast from the float32 weights before they were rounded
    starts elsewhere; the refusal says so rather than blaming the seed."""
    low_loop(tmp_path / "r", torch.float64)
    low_loop(tmp_path / "b", low, reference="../r")
    low_loop(tmp_path / "m", low)
    name = str(low).removeprefix("torch.")
    with pytest.raises(BadInput, match=f"the baseline's are the reference's rounded to {name}"):
        api.compare(tmp_path / "b", tmp_path / "m")


def test_complex_parameters_are_refused_in_one_line(tmp_path):
    """The run format holds real tensors: a complex parameter is refused when the Recorder is
    created (it crashed in the background writer once training had started), nothing written."""
    model = nn.Sequential(nn.Linear(4, 3, dtype=torch.cfloat), nn.Linear(3, 2))
    opt = torch.optim.Adam(model.parameters())
    with pytest.raises(RecorderError, match=r"0\.weight is complex64: a run holds real tensors"):
        gradalign.Recorder(tmp_path / "run", model, opt)
    assert not any(tmp_path.iterdir())


class TwoHeads(nn.Module):
    """Classification logits and a scalar regression value, returned in a dict."""

    def __init__(self):
        super().__init__()
        self.trunk = nn.Sequential(nn.Linear(20, 32), nn.Tanh())
        self.cls = nn.Linear(32, 5)
        self.reg = nn.Linear(32, 1)

    def forward(self, x):
        h = self.trunk(x)
        return {"logits": self.cls(h), "value": self.reg(h).squeeze(-1)}


def heads_loop(out, k, seed, *, float64=False, reference=None, bug=None):
    """`bug`: "mean-head-not-over-k" (the classification head's mean over the micro-batch, not
    divided by K) or "sum-head-over-k" (the regression head's sum divided by K too)."""
    torch.manual_seed(seed)
    model = TwoHeads().double() if float64 else TwoHeads()
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    g = torch.Generator().manual_seed(1000 + seed)
    x = torch.randn(32 * 6, 20, generator=g)
    y = (x[:, :5] + 0.5 * torch.randn(32 * 6, 5, generator=g)).argmax(1)
    x = x.double() if float64 else x
    with gradalign.Recorder(out, model, opt, accum_steps=k, reference=reference) as rec:
        for update in range(6):
            for rows in torch.arange(update * 32, (update + 1) * 32).chunk(k):
                out_ = model(x[rows])
                mean = nn.functional.cross_entropy(out_["logits"], y[rows])  # over the micro-batch
                total = 0.5 * nn.functional.mse_loss(out_["value"], x[rows, 0], reduction="sum")
                loss = mean * len(rows) + total
                share = {
                    "mean-head-not-over-k": mean * len(rows) / 32 * k + total / 32,
                    "sum-head-over-k": mean * len(rows) / 32 + total / 32 / k,
                }.get(bug or "", loss / 32)
                share.backward()
                rec.micro(loss_sum=loss.detach().float(), items=len(rows), batch=(x[rows], y[rows]))
            opt.step()
            rec.update()
            opt.zero_grad()


def test_a_scalar_head_fitted_towards_zero_keeps_its_earlier_rounding(tmp_path):
    """A regression head's 1-element bias shrinks from 0.029 to 4e-5 under Adam; the merged
    run's one-ulp rounding made at 0.02 stays, and failed the floor's eps·||ref|| of the shrunk
    bias at 1.7x (seed 12 on this CPU): the floor's rounding is the largest it has been."""
    heads_loop(tmp_path / "r", 1, 12, float64=True)
    heads_loop(tmp_path / "b", 1, 12, reference="../r")
    heads_loop(tmp_path / "m", 4, 12)
    clean = api.compare(tmp_path / "b", tmp_path / "m")
    assert clean.verdict == "pass", [d.code for d in clean.diagnosis]


def test_the_rounding_allowance_is_the_largest_so_far():
    from gradalign.judge.metrics import TensorDiff
    from gradalign.judge.noise import carry_rounding
    from gradalign.judge.results import UpdateResult

    def at(update, rounding):
        d = TensorDiff("bias", 0, 0, 0, 1, error=2.0, allowed=1.0 + rounding, rounding=rounding)
        return UpdateResult(update, 0, 0, 0, 0, 1, weights=[d], grads=[d])

    results = [at(0, 0.5), at(1, 2.0), at(2, 0.25), at(3, 3.0)]
    carry_rounding(results)
    assert [r.weights[0].allowed for r in results] == [1.5, 3.0, 3.0, 4.0]
    assert [r.grads[0].allowed for r in results] == [1.5, 3.0, 3.0, 4.0]


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
    from gradalign.judge.signatures.gradient import _count

    assert [_count(n) for n in (10.0, 7.511, 8.125)] == ["10", "7.511", "8.125"]


class Gained(nn.Module):
    """A per-feature gain initialised at 1 (as an RMSNorm's weight) before a linear layer."""

    def __init__(self):
        super().__init__()
        self.gain = nn.Parameter(torch.ones(64))
        self.lin = nn.Linear(64, 3)

    def forward(self, x):
        return self.lin(x * self.gain)


def gain_loop(out, k, *, float64=False, bug=None, reference=None):
    """One batch seen at every update, the gain stepped at lr 3e-5 by about 5 units in its last
    place per element, alike from update to update; the linear layer at lr 1e-3."""
    torch.manual_seed(0)
    model = Gained().double() if float64 else Gained()
    groups = [{"params": [model.gain], "lr": 3e-5}, {"params": model.lin.parameters()}]
    opt = torch.optim.SGD(groups, lr=1e-3)
    x = torch.randn(BATCH, 64, generator=torch.Generator().manual_seed(1)) + 1.0
    y = x[:, :3].argmax(1)
    x = x.double() if float64 else x
    _record(out, model, opt, k, [(x, y)] * 16, nn.functional.cross_entropy, bug, reference)


def test_a_weight_stepped_by_a_few_units_in_its_last_place_keeps_each_rounding(tmp_path):
    """A float32 weight near 1 stepped by a few units in its last place per update is rounded
    to its storage at every step, and alike steps round alike: the baseline strayed from its
    float64 rerun by 2.5% of the distance moved (one rounding per update), and the reference
    was refused as another training (model zoo `hf-llama` under ASGD, run 901: an RMSNorm
    weight). Each update's rounding now counts; an unscaled loss is still named."""
    _clean_passes_and_unscaled_loss_is_named(gain_loop, tmp_path)


def adafactor_loop(out, k, *, float64=False, reference=None, eps=None):
    """A linear regression under torch's Adafactor whose loss is scaled to gradients of ~1e-8,
    its `eps` left to torch (None) or set (`eps`, 1e-3)."""
    torch.manual_seed(0)
    model = nn.Linear(8, 1).double() if float64 else nn.Linear(8, 1)
    settings = {} if eps is None else {"eps": (eps, 1e-3)}
    opt = torch.optim.Adafactor(model.parameters(), lr=1e-2, **settings)
    x = torch.randn(BATCH * 4, 8, generator=torch.Generator().manual_seed(1))
    y = x[:, :1] * 0.5
    x, y = (x.double(), y.double()) if float64 else (x, y)
    batches = list(zip(x.split(BATCH), y.split(BATCH), strict=True))
    _record(
        out,
        model,
        opt,
        k,
        batches,
        lambda o, t: 1e-7 * nn.functional.mse_loss(o, t),
        None,
        reference,
    )


def test_an_optimizer_epsilon_taken_from_the_dtype_is_named_when_the_reference_is_refused(
    tmp_path,
):
    """torch's Adafactor fills `eps[0]` left None with the parameters' dtype's epsilon, so its
    float64 rerun steps gradients near float32's epsilon otherwise, and is refused (model zoo
    `hf-llama` under Adafactor, run 905: an RMSNorm weight 10% of its first step away). The
    refusal says so; with the epsilon set in both runs the same loop passes."""
    for eps, where in ((None, "unset"), (torch.finfo(torch.float32).eps, "set")):
        root = tmp_path / where
        adafactor_loop(root / "r", 1, float64=True, eps=eps)
        adafactor_loop(root / "b", 1, reference="../r", eps=eps)
        adafactor_loop(root / "m", 4, eps=eps)
        if eps is None:
            with pytest.raises(BadInput, match=r"Adafactor's eps\[0\] is None, which torch fills"):
                api.compare(root / "b", root / "m")
        else:
            assert api.compare(root / "b", root / "m").verdict == "pass"
