"""Every param group's learning rate is judged (`update/lr_groups`, judge/bookkeeping.py): a
head group whose lr a loop set from its micro-step counter, the backbone's right, was
`unexplained`, and the checks said "learning rate: pass" (only the first group was compared)."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

import gradalign
from gradalign.api import compare

UPDATES, B, K = 12, 16, 4


def _train(out, k: int, groups, before_micro=None, before_step=None) -> None:
    """A small MLP over the same data: `groups(model)` builds the optimizer;
    `before_micro(opt, model, update, j, micro_steps)` and `before_step(opt, update,
    micro_steps)` are where the loop changes its groups."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(5, 8), nn.ReLU(), nn.Linear(8, 3))
    opt = groups(model)
    g = torch.Generator().manual_seed(1)
    x, y = (
        torch.randn(UPDATES * B, 5, generator=g),
        torch.randint(0, 3, (UPDATES * B,), generator=g),
    )
    n, micro_steps = B // k, 0
    with gradalign.Recorder(out, model, opt, accum_steps=k) as rec:
        for update in range(UPDATES):
            for j in range(k):
                if before_micro is not None:
                    before_micro(opt, model, update, j, micro_steps)
                rows = slice(update * B + j * n, update * B + (j + 1) * n)
                loss = nn.functional.cross_entropy(model(x[rows]), y[rows])
                (loss / k).backward()
                micro_steps += 1
                rec.micro(loss.detach(), batch=(x[rows], y[rows]))
            if before_step is not None:
                before_step(opt, update, micro_steps)
            opt.step()
            opt.zero_grad()
            rec.update()


def _record(out, k: int, head_per_micro: bool = False) -> None:
    """Body and head in two groups; the head's lr follows a cosine over the updates (the bug:
    over its micro-steps)."""

    def groups(model):
        body, head = model[0].parameters(), model[2].parameters()
        return torch.optim.SGD([{"params": body, "lr": 0.05}, {"params": head}], lr=0.2)

    def before_step(opt, update, micro_steps):
        step = micro_steps - 1 if head_per_micro else update
        opt.param_groups[1]["lr"] = 0.2 * 0.5 * (1 + math.cos(math.pi * step / (UPDATES * K)))

    _train(out, k, groups, before_step=before_step)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("lr_groups")
    _record(root / "base", 1)
    _record(root / "merged", K)
    _record(root / "head", K, head_per_micro=True)
    return root


def test_a_second_groups_schedule_per_micro_step_is_named(runs):
    c = compare(runs / "base", runs / "head", reference="none")
    lr = next(check for check in c.checks if check.name == "learning rate")
    assert lr.status == "fail" and "(param group 1)" in lr.detail, lr.detail
    first = c.diagnosis[0]
    assert first.code == "lr-schedule", [d.code for d in c.diagnosis]
    assert first.evidence["param_group"] == 1 and first.evidence["schedule_steps_per_update"] == K


def test_every_groups_lr_alike_passes(runs):
    c = compare(runs / "base", runs / "merged", reference="none")
    assert c.verdict == "pass", [d.code for d in c.diagnosis]


def _record_added(out, k: int, by_micro: bool = False) -> None:
    """The head trains alone; the body's group is added at update 2 (`by_micro`: when the loop's
    micro-step counter reaches 2, inside window 0 at K=4)."""

    def before_micro(opt, model, update, j, micro_steps):
        if (micro_steps == 2) if by_micro else (update == 2 and j == 0):
            opt.add_param_group({"params": model[0].parameters(), "lr": 0.05})

    _train(out, k, lambda model: torch.optim.SGD(model[2].parameters(), lr=0.2), before_micro)


def test_a_group_added_at_a_micro_step_count_is_named(tmp_path):
    """It was `cross-sample-loss`, then a schedule that "advanced 2 steps per update": the
    group's lr is NaN before it exists, so the runs disagree on when it starts stepping."""
    _record_added(tmp_path / "base", 1)
    _record_added(tmp_path / "merged", K, by_micro=True)
    c = compare(tmp_path / "base", tmp_path / "merged", reference="none")
    first = c.diagnosis[0]
    assert first.code == "lr-schedule", [d.code for d in c.diagnosis]
    assert "steps from update 0 in the merged run and from update 2 in" in first.message
