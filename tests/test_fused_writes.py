"""Optimizer steps whose writes leave the parameters' version counters unmoved (CPU fused
kernels: `AdamW(fused=True)` keeps `p._version` at 0) are still seen inside a window: every
step of any torch optimizer makes its parameters be fingerprinted at the next micro-step
(record/states.py, `watch_steps`)."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.optim.optimizer import _global_optimizer_post_hooks

import gradalign
from gradalign import api
from gradalign.judge.windows import inside_window_changes
from gradalign.runs.reader import read_run_dir

B, UPDATES, K = 16, 3, 4
WINDOW_CHECK = "no weight change inside a window"


def test_fused_kernels_leave_the_version_counter_unmoved():
    """The premise: without it these tests would prove nothing about the hook."""
    param = nn.Parameter(torch.ones(3))
    param.grad = torch.ones(3)
    torch.optim.AdamW([param], lr=0.1, fused=True).step()
    assert param._version == 0 and not torch.equal(param.detach(), torch.ones(3))


def data(k: int) -> list[list[tuple[torch.Tensor, torch.Tensor]]]:
    """UPDATES windows of k micro-batches; window i's rows are baseline batch i at any k."""
    g = torch.Generator().manual_seed(1)
    x, y = (
        torch.randn(UPDATES * B, 6, generator=g),
        torch.randint(0, 3, (UPDATES * B,), generator=g),
    )
    rows = torch.arange(UPDATES * B).view(UPDATES, B)
    return [[(x[r], y[r]) for r in window.chunk(k)] for window in rows]


def fused_loop(out, k, *, head=None, every_micro=None, head_lr=1e-2, created="before"):
    """A fused AdamW on the whole model (watched) or, with `head="fused"`, SGD on the trunk
    (watched) and a fused AdamW on the head (not watched, created before or after the Recorder).
    `every_micro`: "watched" or "head" steps after each micro-step but the last, as well."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(6, 8), nn.Tanh(), nn.Linear(8, 3))
    if head is None:
        watched = torch.optim.AdamW(model.parameters(), lr=1e-2, fused=True)
    else:
        watched = torch.optim.SGD(model[0].parameters(), lr=0.1)

    def head_opt():
        return torch.optim.AdamW(model[2].parameters(), lr=head_lr, fused=True)

    opts = [watched, head_opt()] if head is not None and created == "before" else [watched]
    with gradalign.Recorder(out, model, watched, accum_steps=k) as rec:
        if head is not None and created == "after":
            opts.append(head_opt())
        extra = {"watched": watched, "head": opts[-1], None: None}[every_micro]
        for window in data(k):
            for j, (x, y) in enumerate(window):
                loss = nn.functional.cross_entropy(model(x), y)
                (loss / k).backward()
                rec.micro(loss.detach(), batch=(x, y))
                if extra is not None and j < k - 1:
                    extra.step()
            for opt in opts:
                opt.step()
            rec.update()
            for opt in opts:
                opt.zero_grad()
    return out


def judged(tmp_path, **bug):
    """The comparison of a fused loop at K against its K=1 baseline, and its window check."""
    base = fused_loop(tmp_path / "base", 1, **{k: v for k, v in bug.items() if k != "every_micro"})
    result = api.compare(base, fused_loop(tmp_path / "merged", K, **bug))
    return result, next(c for c in result.checks if c.name == WINDOW_CHECK)


def test_a_clean_fused_loop_passes(tmp_path):
    result, window = judged(tmp_path, head="fused")
    assert result.verdict == "pass", [d.code for d in result.diagnosis]
    assert window.status == "pass"


def test_the_watched_fused_optimizer_stepping_inside_a_window_is_seen(tmp_path):
    """The step counts name the bug; the window check must agree with them."""
    result, window = judged(tmp_path, every_micro="watched")
    assert result.diagnosis[0].code == "step-in-window"
    assert window.status == "fail", window.detail


@pytest.mark.parametrize("created", ["before", "after"])
def test_an_unwatched_fused_optimizer_stepping_inside_a_window_is_seen(tmp_path, created):
    """Only the changed weights show it (was `cross-sample-loss`, the window check passing)."""
    result, window = judged(tmp_path, head="fused", every_micro="head", created=created)
    assert result.diagnosis[0].code == "weights-changed-in-window"
    assert window.status == "fail", window.detail
    assert "first in 2." in window.detail  # the head's weights, which the fused AdamW steps


def test_a_step_that_writes_nothing_new_is_no_change(tmp_path):
    """A re-fingerprinted weight whose bits did not move equals its snapshot's fingerprint."""
    run = read_run_dir(fused_loop(tmp_path / "m", K, head="fused", every_micro="head", head_lr=0.0))
    assert inside_window_changes(run) == {}


def test_the_step_hook_is_removed_at_close_and_on_abort(tmp_path):
    """No global hook outlives its Recorder, two Recorders open at once included."""
    before = len(_global_optimizer_post_hooks)
    model = nn.Linear(2, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    outer = gradalign.Recorder(tmp_path / "a", model, opt)
    with pytest.raises(ValueError), gradalign.Recorder(tmp_path / "b", model, opt):
        assert len(_global_optimizer_post_hooks) == before + 2
        raise ValueError
    assert len(_global_optimizer_post_hooks) == before + 1
    model(torch.ones(1, 2)).sum().backward()
    outer.micro(torch.tensor(1.0))
    opt.step()
    outer.update()
    outer.close()
    assert len(_global_optimizer_post_hooks) == before


def test_another_recorders_optimizer_does_not_mark_this_ones_weights(tmp_path):
    """Two Recorders at once: one model's fused steps inside the windows are that run's bug
    alone; the other run's weights (another optimizer's parameters) stay unchanged."""
    torch.manual_seed(0)
    a, b = nn.Linear(6, 3), nn.Linear(6, 3)
    opt_a = torch.optim.AdamW(a.parameters(), lr=1e-2, fused=True)
    opt_b = torch.optim.AdamW(b.parameters(), lr=1e-2, fused=True)
    with (
        gradalign.Recorder(tmp_path / "a", a, opt_a, accum_steps=K) as rec_a,
        gradalign.Recorder(tmp_path / "b", b, opt_b, accum_steps=K) as rec_b,
    ):
        for window in data(K):
            for j, (x, y) in enumerate(window):
                for model, rec in ((a, rec_a), (b, rec_b)):
                    loss = nn.functional.cross_entropy(model(x), y)
                    (loss / K).backward()
                    rec.micro(loss.detach())
                if j < K - 1:
                    opt_a.step()  # the bug, in run a only
            for opt, rec in ((opt_a, rec_a), (opt_b, rec_b)):
                opt.step()
                rec.update()
                opt.zero_grad()
    assert inside_window_changes(read_run_dir(tmp_path / "a"))
    assert inside_window_changes(read_run_dir(tmp_path / "b")) == {}
