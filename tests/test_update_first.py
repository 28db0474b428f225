"""`Recorder.update()` called before `optimizer.step()` in every window: each window's step lands
after its update(), before the next window's first micro-step, and the last after the last
update(). The message said a last partial window had stepped; it now names the order, with the
fix. A run that steps once more after its last update() with the order right keeps the old
reading."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import gradalign
from gradalign.judge.compare import compare
from gradalign.runs.reader import read_run_dir

from .recorded_loop import classifier, train

BATCH, UPDATES = 16, 4


def loop(out, k: int, order: str) -> None:
    """`order`: "right" (step, then update()), "update-first", or "extra-step" (right, then one
    more step after the last update())."""
    model, x, y = classifier(BATCH * UPDATES)

    def end(rec: gradalign.Recorder, opt: torch.optim.Optimizer, update: int) -> None:
        if order == "update-first":
            rec.update()
        opt.step()
        if order != "update-first":
            rec.update()
        opt.zero_grad()
        if order == "extra-step" and update == UPDATES - 1:
            nn.functional.cross_entropy(model(x), y).backward()
            opt.step()

    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    train(out, model, opt, x, y, k, batch=BATCH, window_end=end)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("order")
    for order in ("right", "update-first", "extra-step"):
        loop(root / f"base-{order}", 1, order)
        loop(root / f"merged-{order}", 4, order)
    return root


def judged(runs, base: str, merged: str):
    return compare(read_run_dir(runs / f"base-{base}"), read_run_dir(runs / f"merged-{merged}"))


def test_update_before_step_is_named_with_its_fix(runs):
    for base in ("update-first", "right"):
        first = judged(runs, base, "update-first").diagnosis[0]
        assert first.code == "window-bookkeeping", first
        assert "merged called update() before optimizer.step() in every window" in first.message
        assert "call Recorder.update() after optimizer.step()" in first.fix


def test_the_right_order_passes_and_an_extra_step_keeps_its_reading(runs):
    assert judged(runs, "right", "right").verdict == "pass"
    first = judged(runs, "right", "extra-step").diagnosis[0]
    assert first.code == "window-bookkeeping"
    assert "stepped its optimizer 1 time(s) after its last update()" in first.message
    assert "before optimizer.step()" not in first.message + first.fix
