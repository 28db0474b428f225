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
# The run it was seen in drew its data with seed 5. Where the walk goes depends on the
# machine's rounding (its CPU's kernels), so the clean runs are recorded on several draws of the
# data: each must pass, and some must walk beyond the factor on their noise, or nothing here
# would test the rule.
DATA_SEEDS = range(5, 18)


def _record(out, k: int, dtype: torch.dtype, data_seed: int, lr: float = 0.2) -> None:
    torch.manual_seed(2)
    model = nn.Sequential(nn.Linear(6, 8), nn.Tanh(), nn.Linear(8, 2)).to(dtype)
    g = torch.Generator().manual_seed(data_seed)
    x = torch.randn(BATCH * 400, 6, generator=g)  # the data of the 400-update run it was seen in
    y = torch.randint(0, 2, (BATCH * 400,), generator=g)
    rows = BATCH * UPDATES
    opt = torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9)
    train(out, model, opt, x[:rows].to(dtype), y[:rows], k, batch=BATCH)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    torch.set_num_threads(1)
    root = tmp_path_factory.mktemp("walks")
    for seed in DATA_SEEDS:
        _record(root / f"base{seed}", 1, torch.float32, seed)
        _record(root / f"ref{seed}", 1, torch.float64, seed)
        _record(root / f"merged{seed}", K, torch.float32, seed)
    _record(root / "lr", K, torch.float32, DATA_SEEDS[0], lr=0.2 * 1.01)
    return root


def test_a_two_element_bias_walking_further_than_its_baseline_passes(runs):
    walks = []
    for seed in DATA_SEEDS:
        c = api.compare(runs / f"base{seed}", runs / f"merged{seed}", reference=runs / f"ref{seed}")
        assert c.verdict == "pass", (seed, [(d.code, d.message) for d in c.diagnosis])
        bias = [d for r in c.results for d in r.weights if d.name == "2.bias"]
        walks.append(max(d.error / d.noise for d in bias))
    assert sum(w > 4 for w in walks) >= 2, walks  # beyond the factor on its noise there


def test_a_one_percent_larger_lr_still_fails(runs):
    seed = DATA_SEEDS[0]
    c = api.compare(runs / f"base{seed}", runs / "lr", reference=runs / f"ref{seed}")
    assert c.verdict == "fail"
