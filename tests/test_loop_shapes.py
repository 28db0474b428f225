"""Loops of shapes the built-in trainer never takes, recorded with `gradalign.Recorder`: a model
of one-element tensors, gradients gathered into buffers of the loop's own. A clean loop passes;
a bug is named by its own code, not by a signature that merely fits."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import gradalign
from gradalign.api import compare

UPDATES, BATCH = 6, 32


class OneNumber(nn.Module):
    """One scalar parameter: every per-tensor fit is exact."""

    def __init__(self) -> None:
        super().__init__()
        self.w = nn.Parameter(torch.tensor(0.3))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.stack([self.w * x[:, 0], -self.w * x[:, 1], 0.1 * x[:, 2]], 1)


class LinearOneByOne(nn.Module):
    """nn.Linear(1, 1) over the first feature: two one-element tensors."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(1, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        o = self.lin(x[:, :1])
        return torch.cat([o, -o, torch.zeros_like(o)], 1)


class HandWritten(torch.optim.Optimizer):
    """A hand-written SGD update, put in an Optimizer's step() (README, "Your own loop")."""

    def __init__(self, params, lr: float) -> None:
        super().__init__(params, {"lr": lr})

    @torch.no_grad()
    def step(self, closure=None) -> None:
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is not None:
                    p -= group["lr"] * p.grad


def _data(float64: bool) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    x = torch.randn(UPDATES * BATCH, 6, generator=g)
    y = torch.randint(0, 3, (UPDATES * BATCH,), generator=g)
    return (x.double() if float64 else x), y


def _model(shape: str, float64: bool) -> nn.Module:
    torch.manual_seed(0)
    if shape == "one number":
        model = OneNumber()
    elif shape == "two dropouts":  # the second layer's masks differ between B and B/K
        model = nn.Sequential(
            nn.Linear(6, 16), nn.Tanh(), nn.Dropout(0.2), nn.Linear(16, 16), nn.Tanh(),
            nn.Dropout(0.2), nn.Linear(16, 3),
        )  # fmt: skip
    elif shape == "spectral norm":  # power iteration's vectors: buffers written in forward
        linear = nn.utils.spectral_norm(nn.Linear(6, 16), n_power_iterations=5)
        model = nn.Sequential(linear, nn.Tanh(), nn.Linear(16, 3))
    elif shape == "linear 1x1":
        model = LinearOneByOne()
    else:
        model = nn.Sequential(nn.Linear(6, 16), nn.Tanh(), nn.Linear(16, 3))
    return model.double() if float64 else model


def record(out, k: int, shape: str, bug: str | None = None, float64: bool = False):
    """Adam over `shape`; `buffered`: each micro-step's gradient is added into the loop's own
    buffers and .grad cleared (as frameworks with float32 main-grad buffers do)."""
    model = _model(shape, float64)
    if shape == "hand-written":
        opt = HandWritten(model.parameters(), lr=0.1)
    else:
        opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    params = list(model.parameters())
    x, y = _data(float64)
    n = BATCH // k
    buffers = [torch.zeros_like(p) for p in params]
    with gradalign.Recorder(out, model, opt, accum_steps=k) as rec:
        for u in range(UPDATES):
            for j in range(k):
                part = slice(u * BATCH + j * n, u * BATCH + (j + 1) * n)
                loss = nn.functional.cross_entropy(model(x[part]), y[part])
                scale = {"no-loss-scale": k, "count-off": 1.0005}.get(bug, 1)
                if bug == "grad-none-per-micro":  # cleared by hand, not by zero_grad()
                    for p in params:
                        p.grad = None
                if bug == "head-cleared-per-micro":  # as a second optimizer's zero_grad() does
                    for p in params[-2:]:
                        p.grad = None
                (loss / k * scale).backward()
                rec.micro(loss.detach(), batch=(x[part], y[part]))
                if bug == "zero-grad-after-each-backward":  # the last one too, before step()
                    opt.zero_grad()
                if bug == "step-every-micro" and j < k - 1:
                    opt.step()
                if shape == "buffered":
                    with torch.no_grad():
                        for b, p in zip(buffers, params, strict=True):
                            b += p.grad
                    opt.zero_grad()
            if shape == "buffered":
                for b, p in zip(buffers, params, strict=True):
                    p.grad = b.clone()
                    b.zero_()
            opt.step()
            rec.update()
            opt.zero_grad()
    return out


@pytest.mark.parametrize("shape", ["one number", "linear 1x1", "buffered"])
def test_a_missing_loss_scale_is_named_whatever_the_loop_shape(tmp_path, shape):
    """One-element tensors: `penalty-not-scaled` fitted the gradient error to the weights
    tensor by tensor, exactly for any cause, and named a penalty. A loop that clears .grad after
    adding it into buffers of its own: the counted zero_grad() calls named `zero-grad-in-window`
    for a gradient 4 times the baseline's, which clearing cannot make."""
    base = record(tmp_path / "base", 1, shape)
    ref = record(tmp_path / "ref", 1, shape, float64=True)
    clean = compare(base, record(tmp_path / "clean", 4, shape), reference=ref)
    assert clean.verdict == "pass", [d.code for d in clean.diagnosis]
    bug = record(tmp_path / "bug", 4, shape, bug="no-loss-scale")
    for reference in (ref, "none"):
        c = compare(base, bug, reference=reference)
        assert c.verdict == "fail" and c.diagnosis[0].code == "loss-scale", [
            (d.code, d.message) for d in c.diagnosis
        ]


def test_a_loss_scaled_a_little_is_named_a_wrong_scale(tmp_path):
    """A count off by a few in thousands of items scales the gradient by 1.0005 in the same
    direction, far beyond its rounding: `cross-sample-loss` named it, as if no bug's shape fit,
    while a scale of 1.001 or more was `loss-scale`."""
    base = record(tmp_path / "base", 1, "linear 1x1")
    ref = record(tmp_path / "ref", 1, "linear 1x1", float64=True)
    bug = record(tmp_path / "bug", 4, "linear 1x1", bug="count-off")
    c = compare(base, bug, reference=ref)
    assert c.verdict == "fail" and c.diagnosis[0].code == "loss-scale", [
        (d.code, d.message) for d in c.diagnosis
    ]
    assert abs(c.diagnosis[0].evidence["grad_ratio"] - 1.0005) < 1e-5


def test_spectral_norms_power_iteration_is_named_as_buffers_written_in_forward(tmp_path):
    """torch.nn.utils.spectral_norm updates its vectors at every forward, so the merged run
    iterates K times per update and its loss differs at update 0: that was named
    `cross-sample-loss` (a loss over the micro-batch, with a mixture of experts' fix), though
    the Recorder had seen the buffers written in forward."""
    base = record(tmp_path / "base", 1, "spectral norm")
    ref = record(tmp_path / "ref", 1, "spectral norm", float64=True)
    merged = record(tmp_path / "merged", 4, "spectral norm")
    bug = record(tmp_path / "bug", 4, "spectral norm", bug="no-loss-scale")
    for reference in (ref, "none"):
        c = compare(base, merged, reference=reference)
        assert [d.code for d in c.diagnosis][:1] == ["buffers-in-forward"], [
            (d.code, d.message) for d in c.diagnosis
        ]
        # the iteration turns every gradient a little: a wrong scale beside it is still named
        codes = [d.code for d in compare(base, bug, reference=reference).diagnosis]
        assert codes == ["loss-scale", "buffers-in-forward"], codes


def test_a_bug_beside_dropouts_masks_is_named_first(tmp_path):
    """Two dropout layers draw other masks at B and at B/K (`dropout-rng`, right for the clean
    loop); a missing 1/K beside them was hidden: only `dropout-rng` was named."""
    base = record(tmp_path / "base", 1, "two dropouts")
    ref = record(tmp_path / "ref", 1, "two dropouts", float64=True)
    clean = record(tmp_path / "clean", 4, "two dropouts")
    bug = record(tmp_path / "bug", 4, "two dropouts", bug="no-loss-scale")
    for reference in (ref, "none"):
        assert [d.code for d in compare(base, clean, reference=reference).diagnosis] == [
            "dropout-rng"
        ]
        codes = [d.code for d in compare(base, bug, reference=reference).diagnosis]
        assert codes == ["loss-scale", "dropout-rng"], codes


def test_a_hand_written_update_in_an_optimizer_subclass_is_judged_like_any(tmp_path):
    """The README's way to record `p -= lr * p.grad`: its steps are counted like a torch
    optimizer's, so a step inside the window and a missing 1/K are named."""
    base = record(tmp_path / "base", 1, "hand-written")
    ref = record(tmp_path / "ref", 1, "hand-written", float64=True)
    assert compare(base, record(tmp_path / "clean", 4, "hand-written"), reference=ref).verdict == (
        "pass"
    )
    for bug, code in (("step-every-micro", "step-in-window"), ("no-loss-scale", "loss-scale")):
        c = compare(base, record(tmp_path / bug, 4, "hand-written", bug=bug), reference=ref)
        assert [d.code for d in c.diagnosis][:1] == [code], [
            (d.code, d.message) for d in c.diagnosis
        ]


def _accumulate(out, model, opt, k: int, float64: bool, reference, micro_loss) -> None:
    """UPDATES windows of K micro-batches over `_data`; `micro_loss(x, y)` gives the loss to
    backpropagate and the one to record."""
    x, y = _data(float64)
    n = BATCH // k
    with gradalign.Recorder(out, model, opt, accum_steps=k, reference=reference) as rec:
        for update in range(UPDATES):
            for micro in range(k):
                rows = slice(update * BATCH + micro * n, update * BATCH + (micro + 1) * n)
                backpropagated, recorded = micro_loss(x[rows], y[rows])
                backpropagated.backward()
                rec.micro(recorded.detach(), batch=(x[rows], y[rows]))
            opt.step()
            rec.update()
            opt.zero_grad()


def _weighted_loss_loop(out, k: int, float64: bool = False, reference=None) -> None:
    """Learnable loss weights (log-variances) kept apart from the model, stepped by its
    optimizer: a common multi-task loss."""
    torch.manual_seed(0)
    model = nn.Linear(6, 3).double() if float64 else nn.Linear(6, 3)
    log_vars = nn.Parameter(torch.zeros(2, dtype=torch.float64 if float64 else torch.float32))
    opt = torch.optim.Adam([*model.parameters(), log_vars], lr=1e-2)

    def micro_loss(x, y):
        out_ = model(x)
        losses = torch.stack([nn.functional.cross_entropy(out_, y), out_.pow(2).mean()])
        loss = (losses * torch.exp(-log_vars) + log_vars).sum()
        return loss / k, loss

    _accumulate(out, model, opt, k, float64, reference, micro_loss)


def test_tensors_the_optimizer_steps_outside_the_model_are_said_unrecorded(tmp_path):
    """They were silently not recorded: a bug only they show would pass unseen."""
    _weighted_loss_loop(tmp_path / "fp64", 1, float64=True)
    _weighted_loss_loop(tmp_path / "base", 1, reference="../fp64")
    _weighted_loss_loop(tmp_path / "merged", 4)
    result = compare(tmp_path / "base", tmp_path / "merged")
    assert result.verdict == "pass"
    assert result.merged.model_facts["optimizer_outside_model"] == {"tensors": 1, "elements": 2}
    noted = [n for n in result.notes if "outside the model given to the Recorder" in n]
    assert len(noted) == 1 and noted[0].startswith("both runs' optimizer also stepped 1 tensor")


def _class_weighted_loop(out, k: int, bug: bool = False, float64: bool = False, reference=None):
    """A class-weighted cross-entropy: each micro-batch's weighted mean (normalized by its own
    weights), divided by K (right only where every micro-batch weighs alike), or not (the bug,
    as a Trainer's compute_loss that ignores num_items_in_batch)."""
    torch.manual_seed(0)
    model = nn.Linear(6, 3).double() if float64 else nn.Linear(6, 3)
    weight = torch.tensor([1.0, 3.0, 0.5], dtype=torch.float64 if float64 else torch.float32)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)

    def micro_loss(x, y):
        loss = nn.functional.cross_entropy(model(x), y, weight=weight)
        backpropagated = loss if bug else loss / k
        # as the framework integrations record it: the loss backpropagated, times K
        return backpropagated, backpropagated * k

    _accumulate(out, model, opt, k, float64, reference, micro_loss)


def test_a_scale_turned_by_each_micro_batchs_own_weighted_mean_is_loss_scale(tmp_path):
    """A weighted mean per micro-batch not divided by K: the window losses K times, the gradient
    about K times but turned by the reweighting no signature names (no items recorded). It was
    `cross-sample-loss`, calling the loss 'a matter of the log'."""
    _class_weighted_loop(tmp_path / "fp64", 1, float64=True)
    _class_weighted_loop(tmp_path / "base", 1, reference="../fp64")
    _class_weighted_loop(tmp_path / "bug", 4, bug=True)
    first = compare(tmp_path / "base", tmp_path / "bug").diagnosis[0]
    assert first.code == "loss-scale", first.message
    assert "each micro-batch's own weighted mean" in first.message
    assert first.evidence["expected_ratio"] == 4


def test_gradients_cleared_by_hand_inside_the_window_are_named(tmp_path):
    """`p.grad = None` before each backward keeps only the last micro-batch's gradient: the
    Recorder counted no zero_grad() there, and the run was named `cross-sample-loss`."""
    base = record(tmp_path / "base", 1, "mlp")
    bug = record(tmp_path / "bug", 4, "mlp", bug="grad-none-per-micro")
    c = compare(base, bug, reference="none")
    assert c.verdict == "fail" and c.diagnosis[0].code == "zero-grad-in-window", [
        (d.code, d.message) for d in c.diagnosis
    ]
    assert "by hand" in c.diagnosis[0].message


def test_gradients_of_one_part_cleared_inside_the_window_are_named(tmp_path):
    """The head's gradients cleared before each backward (by hand here; a second optimizer's
    zero_grad() over the head does the same, unwatched), the rest accumulated: the gradient as
    a whole stays near the baseline's, the head's tensors at about 1/K. It was named
    `cross-sample-loss`; the clean loop passes (it is `test_a_missing_loss_scale...`'s base)."""
    base = record(tmp_path / "base", 1, "mlp")
    bug = record(tmp_path / "bug", 4, "mlp", bug="head-cleared-per-micro")
    c = compare(base, bug, reference="none")
    found = c.diagnosis[0]
    assert c.verdict == "fail" and found.code == "zero-grad-in-window", [
        (d.code, d.message) for d in c.diagnosis
    ]
    assert found.evidence["cleared_tensors"] == ["2.weight", "2.bias"]
    assert "a second optimizer's" in found.message
    assert compare(base, record(tmp_path / "clean", 4, "mlp"), reference="none").verdict == "pass"


def test_gradients_cleared_after_every_backward_are_named(tmp_path):
    """zero_grad() after each backward, the window's last before step() too: the optimizer steps
    with a gradient of norm 0, whose cosine with the baseline's, 0, was taken for one not known,
    so no gradient shape was read and the run was named `cross-sample-loss`."""
    base = record(tmp_path / "base", 1, "mlp")
    bug = record(tmp_path / "bug", 4, "mlp", bug="zero-grad-after-each-backward")
    c = compare(base, bug, reference="none")
    found = c.diagnosis[0]
    assert c.verdict == "fail" and found.code == "zero-grad-in-window", [
        (d.code, d.message) for d in c.diagnosis
    ]
    assert found.evidence["zero_grad_calls_inside_window"] == 3
