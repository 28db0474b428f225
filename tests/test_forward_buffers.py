"""Buffers a model writes in its forward (other than BatchNorm's): a running mean of the inputs,
spectral norm's power-iteration vectors. The merged run updates them at every micro-step, the
baseline once per update: named `buffers-in-forward`, where no other cause fits. A model that
updates such state once per window from the whole window passes; a gradient bug in a model
with such a buffer is still named by its own code."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import gradalign
from gradalign import api

BATCH, K, UPDATES = 24, 4, 4


class RunningMean(nn.Module):
    """An MLP keeping a running mean of its inputs (an input normalizer's statistics): updated
    at every forward, or (`per_window`) once per window from all the window's rows; with
    `per_window="start"`, of its hidden units, from the last window's rows at the next one's
    start (a statistic of what the weights compute: it follows them)."""

    def __init__(self, per_window: bool | str = False) -> None:
        super().__init__()
        self.body = nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 3))
        self.register_buffer("running_mean", torch.zeros(16 if per_window == "start" else 8))
        self.per_window, self.pending = per_window, []

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.per_window == "start":
            self.pending.append(self.body[0](x).detach())
        elif self.per_window:
            self.pending.append(x.detach())
        else:
            self._update(x.detach())
        return self.body(x)

    def _update(self, rows: torch.Tensor) -> None:
        with torch.no_grad():
            self.running_mean.mul_(0.9).add_(0.1 * rows.mean(0))

    def end_window(self) -> None:
        if self.pending and self.per_window != "start":
            self._update(torch.cat(self.pending))
            self.pending = []

    def start_window(self) -> None:  # per_window="start": the last window's rows, applied now
        if self.pending and self.per_window == "start":
            self._update(torch.cat(self.pending))
            self.pending = []


def spectral() -> nn.Module:
    from torch.nn.utils.parametrizations import spectral_norm

    return nn.Sequential(spectral_norm(nn.Linear(8, 16)), nn.Tanh(), nn.Linear(16, 3))


def record(out, k, build, *, float64=False, reference=None, bug=False):
    torch.manual_seed(0)
    model = build()
    model = model.double() if float64 else model
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    g = torch.Generator().manual_seed(1)
    x = torch.randn(BATCH * UPDATES, 8, generator=g)
    y = x[:, :3].argmax(1)
    x = x.double() if float64 else x
    size = BATCH // k
    with gradalign.Recorder(out, model, opt, accum_steps=k, reference=reference) as rec:
        for u in range(UPDATES):
            if hasattr(model, "start_window"):
                model.start_window()
            for j in range(k):
                rows = slice(u * BATCH + j * size, u * BATCH + (j + 1) * size)
                loss = nn.functional.cross_entropy(model(x[rows]), y[rows], reduction="sum")
                (loss / (size if bug else BATCH)).backward()
                rec.micro(loss_sum=loss.detach(), items=size, batch=(x[rows], y[rows]))
            if hasattr(model, "end_window"):
                model.end_window()
            opt.step()
            rec.update()
            opt.zero_grad()
    return out


def judged(tmp_path, build, **merged):
    record(tmp_path / "ref", 1, build, float64=True)
    base = record(tmp_path / "base", 1, build, reference="../ref")
    return api.compare(base, record(tmp_path / "merged", K, build, **merged))


def codes(c) -> list[str]:
    return [d.code for d in c.diagnosis if d.severity == "error"]


@pytest.mark.parametrize("build", [RunningMean, spectral], ids=["running-mean", "spectral-norm"])
def test_a_buffer_written_at_every_micro_step_is_named(tmp_path, build):
    c = judged(tmp_path, build)
    assert c.verdict == "fail" and codes(c)[:1] == ["buffers-in-forward"], codes(c)
    assert c.diagnosis[0].evidence["first_update"] == 0


def test_state_updated_once_per_window_from_the_whole_window_passes(tmp_path):
    c = judged(tmp_path, lambda: RunningMean(per_window=True))
    assert c.verdict == "pass", codes(c)


def test_a_gradient_bug_beside_such_a_buffer_is_named_by_its_own_code(tmp_path):
    c = judged(tmp_path, RunningMean, bug=True)
    assert codes(c)[:1] == ["loss-scale"], codes(c)


def test_a_buffer_written_once_at_each_windows_start_is_not_written_in_forward(tmp_path):
    """A statistic the loop applies at a window's start, once per update as the baseline does:
    a gradient bug beside it was named `buffers-in-forward` as well ('written at every
    micro-step'), or alone where no gradient shape fit."""
    assert judged(tmp_path / "clean", lambda: RunningMean(per_window="start")).verdict == "pass"
    c = judged(tmp_path / "bug", lambda: RunningMean(per_window="start"), bug=True)
    assert codes(c) == ["loss-scale"], codes(c)
