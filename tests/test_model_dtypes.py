"""A model's dtypes and their rounding, recorded through `Recorder`: parameters of mixed dtypes
(a bfloat16 layer beside float32 ones), a whole model in 16 bits, complex parameters; each
update's rounding kept (a head's scalar fitted towards zero, a gain stepped by a few units in
its last place), and an optimizer's epsilon taken from the dtype."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import gradalign
from gradalign import api
from gradalign.errors import BadInput
from gradalign.record.recorder import RecorderError

from .feature_loops import _clean_passes_and_unscaled_loss_is_named, heads_loop

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


def norm_loop(out, k, *, float64=False, seed=0):
    """weight_norm's parametrization applied after the cast: a float64 model computes its
    g = ||v|| in float64, the float32 one in float32."""
    torch.manual_seed(seed)
    model = nn.Sequential(nn.Linear(12, 16), nn.Tanh(), nn.Linear(16, 3))
    model = model.double() if float64 else model
    nn.utils.parametrizations.weight_norm(model[0])
    opt = torch.optim.SGD(model.parameters(), lr=0.2)
    x = torch.randn(BATCH * UPDATES, 12, generator=torch.Generator().manual_seed(1))
    y = x[:, :3].argmax(1)
    x = x.double() if float64 else x
    batches = list(zip(x.split(BATCH), y.split(BATCH), strict=True))
    _record(out, model, opt, k, batches, nn.functional.cross_entropy)


def test_a_reference_that_computed_its_initial_weights_in_float64_is_named(tmp_path):
    """Initial weights a few units in float32's last place apart were refused as another model
    ("use the same seed"), though the seed was the same: the refusal names the precision."""
    norm_loop(tmp_path / "b", 1)
    norm_loop(tmp_path / "r", 1, float64=True)
    norm_loop(tmp_path / "m", 4)
    with pytest.raises(BadInput, match="they differ by float32 rounding alone") as refused:
        api.compare(tmp_path / "b", tmp_path / "m", reference=tmp_path / "r")
    assert "weight_norm" in str(refused.value) and "same seed" not in str(refused.value)
    norm_loop(tmp_path / "seed1", 1, float64=True, seed=1)  # another seed: as before
    with pytest.raises(BadInput, match="use the same seed"):
        api.compare(tmp_path / "b", tmp_path / "m", reference=tmp_path / "seed1")


def test_complex_parameters_are_refused_in_one_line(tmp_path):
    """The run format holds real tensors: a complex parameter is refused when the Recorder is
    created (it crashed in the background writer once training had started), nothing written."""
    model = nn.Sequential(nn.Linear(4, 3, dtype=torch.cfloat), nn.Linear(3, 2))
    opt = torch.optim.Adam(model.parameters())
    with pytest.raises(RecorderError, match=r"0\.weight is complex64: a run holds real tensors"):
        gradalign.Recorder(tmp_path / "run", model, opt)
    assert not any(tmp_path.iterdir())


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
