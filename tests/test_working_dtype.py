"""A run's working precision is the floating dtype holding most of its parameters: the first
parameter's was taken, so a frozen int8 parameter listed first (QLoRA's quantized base weight)
made the run "int8" (the float64 reference then crashed the judge, exit 3), and a float64 scalar
listed first made a float32 model "float64" (its float64 reference refused)."""

from __future__ import annotations

import json

import pytest
import torch
from torch import nn

from gradalign.api import compare

from .recorded_loop import train

UPDATES, B = 4, 16


class Quantized(nn.Module):
    """A frozen int8 weight (dequantized in forward) beside a trained adapter and head; or a
    float64 temperature listed first."""

    def __init__(self, first: str) -> None:
        super().__init__()
        if first == "int8":
            self.qweight = nn.Parameter(
                torch.randint(-100, 100, (12, 6), dtype=torch.int8), requires_grad=False
            )
        else:
            self.temp = nn.Parameter(torch.tensor(1.0, dtype=torch.float64))
        self.adapter = nn.Linear(6, 12)
        self.head = nn.Linear(12, 3)

    def forward(self, x):
        hidden = self.adapter(x)
        if hasattr(self, "qweight"):
            hidden = hidden + x @ (self.qweight.to(x.dtype) * 0.01).t()
        else:
            hidden = hidden * self.temp.to(x.dtype)
        return self.head(torch.tanh(hidden))


def _record(out, first: str, k: int, float64: bool = False, reference=None) -> None:
    torch.manual_seed(0)
    model = Quantized(first)
    if float64:
        model = model.double()  # the int8 weight stays int8
    trained = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.SGD(trained, lr=0.1)
    g = torch.Generator().manual_seed(1)
    x = torch.randn(UPDATES * B, 6, generator=g)
    x = x.double() if float64 else x  # the same samples, widened
    y = torch.randint(0, 3, (UPDATES * B,), generator=g)
    train(out, model, opt, x, y, k, batch=B, reference=reference)


@pytest.mark.parametrize("first", ["int8", "float64"])
def test_the_working_dtype_is_the_parameters_and_the_reference_is_used(tmp_path, first):
    _record(tmp_path / "ref", first, 1, float64=True)
    _record(tmp_path / "base", first, 1, reference="../ref")
    _record(tmp_path / "merged", first, 4)
    manifest = json.loads((tmp_path / "base" / "manifest.json").read_text())
    assert manifest["environment"]["dtype"] == "float32"
    c = compare(tmp_path / "base", tmp_path / "merged")
    assert c.reference is not None and c.verdict == "pass", [d.message for d in c.diagnosis]


@pytest.mark.parametrize("merged_dtype", [torch.bfloat16, torch.float64])
def test_runs_whose_parameters_differ_in_dtype_are_refused(tmp_path, merged_dtype):
    """A whole model cast to bfloat16 (its initial weights held exactly) against a float32
    baseline passed the bfloat16 tolerances: only an autocast dtype was compared."""
    from gradalign.errors import BadInput

    def record(out, dtype, k):
        torch.manual_seed(0)
        model = nn.Sequential(nn.Linear(6, 8), nn.Tanh(), nn.Linear(8, 3))
        with torch.no_grad():  # weights bfloat16 holds: both runs start alike
            for p in model.parameters():
                p.copy_(p.to(torch.bfloat16).float())
        model = model.to(dtype)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        x = torch.randn(UPDATES * B, 6, generator=torch.Generator().manual_seed(1))
        y = torch.randint(0, 3, (UPDATES * B,), generator=torch.Generator().manual_seed(2))
        forward = lambda rows, u: model(rows.to(dtype)).float()  # noqa: E731
        train(out, model, opt, x, y, k, batch=B, forward=forward)

    record(tmp_path / "base", torch.float32, 1)
    record(tmp_path / "merged", merged_dtype, 4)
    with pytest.raises(BadInput, match="the baseline computes in float32, the merged run in"):
        compare(tmp_path / "base", tmp_path / "merged", reference="none")


def test_a_float64_models_loss_computed_in_float32_is_judged_at_float32s_rounding(tmp_path):
    """`cross_entropy(model(x).float(), y)` in a float64 model: its losses, all float32 numbers,
    were judged to float64's tolerance and a clean pair failed at 3e-8 (`loss-averaging`)."""
    from gradalign.judge.tolerances import eps, loss_rounding

    def record(out, k, scale=1.0):
        torch.manual_seed(0)
        model = nn.Sequential(nn.Linear(6, 8), nn.Tanh(), nn.Linear(8, 3)).double()
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        x = torch.randn(UPDATES * B, 6, generator=torch.Generator().manual_seed(1)).double()
        y = torch.randint(0, 3, (UPDATES * B,), generator=torch.Generator().manual_seed(2))
        forward = lambda rows, u: model(rows).float()  # noqa: E731 - the loss in float32
        train(out, model, opt, x, y, k, batch=B, forward=forward, scale=scale)

    record(tmp_path / "base", 1)
    record(tmp_path / "merged", 4)
    record(tmp_path / "scaled", 4, scale=4.0)
    c = compare(tmp_path / "base", tmp_path / "merged", reference="none")
    assert c.verdict == "pass", [d.message for d in c.diagnosis]
    assert loss_rounding([c.baseline.micro_loss], "float64") == eps("float32")
    c = compare(tmp_path / "base", tmp_path / "scaled", reference="none")
    assert c.verdict == "fail" and c.diagnosis[0].code == "loss-scale"
