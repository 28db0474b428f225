"""A batch size that ramps up (16, 16, 32, 32, 64, 64): the baseline's batch grows, the merged
run keeps micro-batches of 8 and grows K with it. Each window holds exactly its baseline batch,
so the windows of other sizes than the Recorder's K line up and the run passes; the same run
dividing every loss by the final K is `loss-scale`, whose message names the ramp."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import gradalign
from gradalign.judge.compare import compare
from gradalign.runs.reader import read_run_dir

from .recorded_loop import classifier

SIZES, MICRO = (16, 16, 32, 32, 64, 64), 8


def loop(out, merged: bool, divide_by_final_k: bool = False):
    model, x, y = classifier(sum(SIZES))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    final = SIZES[-1] // MICRO
    start = 0
    with gradalign.Recorder(out, model, opt, accum_steps=final if merged else 1) as rec:
        for size in SIZES:
            k = size // MICRO if merged else 1
            n = size // k
            for j in range(k):
                rows = slice(start + j * n, start + (j + 1) * n)
                loss = nn.functional.cross_entropy(model(x[rows]), y[rows])
                (loss / (final if divide_by_final_k else k)).backward()
                rec.micro(loss.detach(), batch=(x[rows], y[rows]))
            start += size
            opt.step()
            rec.update()
            opt.zero_grad()
    return read_run_dir(out)


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    return loop(tmp_path_factory.mktemp("rampup") / "base", False)


def test_a_ramped_up_k_over_the_same_batches_passes(base, tmp_path):
    c = compare(base, loop(tmp_path / "m", True))
    assert c.verdict == "pass", [(d.code, d.message) for d in c.diagnosis]


def test_losses_divided_by_the_final_k_during_the_ramp_are_named(base, tmp_path):
    c = compare(base, loop(tmp_path / "m", True, divide_by_final_k=True))
    first = c.diagnosis[0]
    assert first.code == "loss-scale", [(d.code, d.message) for d in c.diagnosis]
    assert "in a window of 2 micro-step(s)" in first.message and "ramps up" in first.message
    assert "its own window's micro-batches" in first.fix
