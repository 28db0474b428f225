"""`step-skipped` (judge/signatures/skips.py): the merged run skipped an optimizer step where
its baseline stepped, never stepping inside a window (a loss-spike check read from one
micro-batch's loss). It was `step-in-window`, with an empty reason and the fix for the opposite
problem ("call optimizer.step() only after the K-th micro-batch")."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import gradalign
from gradalign.api import compare

UPDATES, B, K, SPIKE = 6, 16, 4, 1.25


def _record(out, k: int, per_micro: bool = False) -> None:
    """Skip the step of a window whose loss exceeds SPIKE; `per_micro`: of a window one of whose
    micro-batches' losses does (the bug: a micro-batch's loss is noisier than the batch's)."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(5, 8), nn.Tanh(), nn.Linear(8, 3))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    g = torch.Generator().manual_seed(2)
    x, y = (
        torch.randn(UPDATES * B, 5, generator=g),
        torch.randint(0, 3, (UPDATES * B,), generator=g),
    )
    n = B // k
    with gradalign.Recorder(out, model, opt, accum_steps=k) as rec:
        for update in range(UPDATES):
            losses = []
            for j in range(k):
                rows = slice(update * B + j * n, update * B + (j + 1) * n)
                loss = nn.functional.cross_entropy(model(x[rows]), y[rows])
                (loss / k).backward()
                losses.append(float(loss.detach()))
                rec.micro(loss.detach(), batch=(x[rows], y[rows]))
            spike = max(losses) if per_micro else sum(losses) / k
            if spike <= SPIKE:
                opt.step()
            opt.zero_grad()
            rec.update()


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("skipped")
    _record(root / "base", 1)
    _record(root / "merged", K)
    _record(root / "per-micro", K, per_micro=True)
    return root


@pytest.mark.parametrize("reference", [None, "none"])
def test_a_step_skipped_by_one_micro_batch_is_named(runs, reference):
    c = compare(runs / "base", runs / "per-micro", reference=reference)
    codes = [d.code for d in c.diagnosis]
    assert c.verdict == "fail" and codes[0] == "step-skipped", codes
    assert "step-in-window" not in codes


def test_the_same_skips_pass(runs):
    c = compare(runs / "base", runs / "merged", reference="none")
    assert c.verdict == "pass", [d.code for d in c.diagnosis]
