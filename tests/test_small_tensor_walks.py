"""A small tensor's weights carry their rounding errors from update to update, a walk that one
update's noise measures badly: a two-class output bias (two elements, one draw: they cancel)
under SGD with momentum stood 13x its baseline's noise at update 26 of a right run, the
baseline's own walk near zero there. Its noise is its widest so far, and what that admits
feeds the later gradients as a drift's excess does (judge/noise.py); a 1% larger lr still
fails."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from gradalign import api

from .recorded_loop import train

UPDATES, BATCH, K = 32, 16, 4


def _record(out, k: int, dtype: torch.dtype, lr: float = 0.2) -> None:
    torch.manual_seed(2)
    model = nn.Sequential(nn.Linear(6, 8), nn.Tanh(), nn.Linear(8, 2)).to(dtype)
    g = torch.Generator().manual_seed(5)
    x = torch.randn(BATCH * 400, 6, generator=g)  # the data of the 400-update run it was seen in
    y = torch.randint(0, 2, (BATCH * 400,), generator=g)
    rows = BATCH * UPDATES
    opt = torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9)
    train(out, model, opt, x[:rows].to(dtype), y[:rows], k, batch=BATCH)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    torch.set_num_threads(1)
    root = tmp_path_factory.mktemp("walks")
    _record(root / "base", 1, torch.float32)
    _record(root / "ref", 1, torch.float64)
    _record(root / "merged", K, torch.float32)
    _record(root / "lr", K, torch.float32, lr=0.2 * 1.01)
    return root


def test_a_two_element_bias_walking_further_than_its_baseline_passes(runs):
    c = api.compare(runs / "base", runs / "merged", reference=runs / "ref")
    assert c.verdict == "pass", [(d.code, d.message) for d in c.diagnosis]
    bias = [d for r in c.results for d in r.weights if d.name == "2.bias"]
    assert max(d.error / d.noise for d in bias) > 4  # beyond the factor on its noise there


def test_a_one_percent_larger_lr_still_fails(runs):
    c = api.compare(runs / "base", runs / "lr", reference=runs / "ref")
    assert c.verdict == "fail"
