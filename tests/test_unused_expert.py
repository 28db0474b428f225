"""A tensor whose gradient is exactly 0 in both runs, which one run steps on its momentum and the
other skips: an expert used in the first window only, whose `.grad` the baseline sets to None
(skipped by the optimizer) and the merged loop keeps as zeros (`zero_grad(set_to_none=False)`),
moving it on momentum. Without a reference that passed as gradient noise (judge/drift.py)."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from gradalign.api import compare

from .recorded_loop import train

UPDATES, B = 6, 16


class TwoExperts(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.experts = nn.ModuleList([nn.Linear(6, 6), nn.Linear(6, 6)])
        self.head = nn.Linear(6, 3)

    def forward(self, x, expert: int):
        return self.head(torch.tanh(self.experts[expert](x)))


def _record(out, k: int, set_to_none: bool) -> None:
    torch.manual_seed(0)
    model = TwoExperts()
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    g = torch.Generator().manual_seed(1)
    x, y = (
        torch.randn(UPDATES * B, 6, generator=g),
        torch.randint(0, 3, (UPDATES * B,), generator=g),
    )
    forward = lambda rows, u: model(rows, int(u == 0))  # noqa: E731 - the first update's expert
    train(out, model, opt, x, y, k, batch=B, forward=forward, set_to_none=set_to_none)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("experts")
    _record(root / "base", 1, set_to_none=True)
    _record(root / "merged", 4, set_to_none=True)
    _record(root / "zeros", 4, set_to_none=False)
    return root


def test_a_merged_run_that_skips_the_unused_expert_too_passes(runs):
    c = compare(runs / "base", runs / "merged", reference="none")
    assert c.verdict == "pass", [d.message for d in c.diagnosis]


def test_an_expert_stepped_on_momentum_in_one_run_only_fails(runs):
    c = compare(runs / "base", runs / "zeros", reference="none")
    weights = next(check for check in c.checks if check.name == "weights")
    assert c.verdict == "fail" and weights.status == "fail", weights.detail
    assert "experts.1" in weights.detail
