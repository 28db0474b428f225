"""`weights-decayed` (judge/signatures/decay.py): the merged step shrank the weights by another
multiple of themselves while the gradients agreed. A decoupled decay applied per micro-step and
a weight-decay schedule stepped per micro-step were `unexplained`."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from gradalign.api import compare

from .recorded_loop import train

UPDATES, B, K, LR, WD = 8, 16, 4, 0.01, 0.1


def _record(out, k: int, bug: str | None = None) -> None:
    """A small MLP under AdamW whose weight decay follows a cosine over the updates. `bug`:
    "per-micro" steps that schedule at every micro-step; "decay-k" adds the loop's own
    decoupled decay after the step, once per micro-step of the window beyond the first."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(6, 16), nn.Tanh(), nn.Linear(16, 3))
    opt = torch.optim.AdamW(model.parameters(), lr=LR, weight_decay=WD)
    g = torch.Generator().manual_seed(1)
    x = torch.randn(UPDATES * B, 6, generator=g)
    y = torch.randint(0, 3, (UPDATES * B,), generator=g)

    def before_micro(update: int, j: int) -> None:
        # the schedule's count: updates, or (the bug) micro-steps at the window's first
        step = update * k if bug == "per-micro" else update
        opt.param_groups[0]["weight_decay"] = WD * math.cos(step / (2 * UPDATES))

    def after_step(update: int) -> None:
        if bug == "decay-k":
            with torch.no_grad():
                for p in model.parameters():
                    p.mul_((1 - LR * WD) ** (k - 1))

    train(out, model, opt, x, y, k, batch=B, before_micro=before_micro, after_step=after_step)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("decayed")
    for name, k, bug in (("base", 1, None), ("merged", K, None)):
        _record(root / name, k, bug)
    for bug in ("per-micro", "decay-k"):
        _record(root / bug, K, bug)
    return root


def test_a_clean_merged_run_with_scheduled_decay_passes(runs):
    c = compare(runs / "base", runs / "merged", reference="none")
    assert c.verdict == "pass", [d.code for d in c.diagnosis]


@pytest.mark.parametrize("bug", ["per-micro", "decay-k"])
def test_decay_applied_otherwise_is_named(runs, bug):
    c = compare(runs / "base", runs / bug, reference="none")
    assert c.verdict == "fail"
    first = c.diagnosis[0]
    assert first.code == "weights-decayed", [(d.code, d.message) for d in c.diagnosis]
    assert first.evidence["explained_share"] > 0.99
    if bug == "decay-k":  # K-1 extra decays of lr·wd at update 0
        assert first.evidence["update"] == 0
        assert first.evidence["extra_decay_per_micro_step"] == pytest.approx(LR * WD, rel=0.01)
    else:  # the schedule agrees at its first step and parts from the next update on
        assert first.evidence["update"] == 1
