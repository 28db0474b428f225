"""An optimizer whose state starts over mid-run (its state cleared, or the optimizer made anew
each update) steps from zero moments with t = 1: the Recorder reads Adam's step count after
each update, and `step-count` says where it fell and to keep one optimizer and its state. A
count advanced at every micro-step still reads as K times the baseline's."""

from __future__ import annotations

import pytest
import torch

import gradalign
from gradalign.judge.compare import compare
from gradalign.runs.reader import read_run_dir

from .recorded_loop import classifier, train

BATCH, K, UPDATES = 32, 4, 6


def loop(out, k: int, bug: str | None = None):
    model, x, y = classifier(UPDATES * BATCH)

    def end(rec: gradalign.Recorder, opt: torch.optim.Optimizer, update: int) -> None:
        opt.step()
        if bug == "count-every-micro":
            for state in opt.state.values():
                state["step"] += k - 1
        rec.update()  # reads the step count, before a reset
        opt.zero_grad()
        if bug == "reset" and update >= 2:
            opt.state.clear()

    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    train(out, model, opt, x, y, k, batch=BATCH, window_end=end)
    return read_run_dir(out)


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    return loop(tmp_path_factory.mktemp("reset") / "base", 1)


def test_a_state_that_starts_over_is_named_with_where_it_fell(base, tmp_path):
    c = compare(base, loop(tmp_path / "m", K, "reset"))
    first = c.diagnosis[0]
    assert first.code == "step-count", [(d.code, d.message) for d in c.diagnosis]
    assert "fell from 3 to 1 at update 3" in first.message and "started over" in first.message
    assert "create it once" in first.fix


def test_a_count_advanced_per_micro_step_is_still_k_times(base, tmp_path):
    c = compare(base, loop(tmp_path / "m", K, "count-every-micro"))
    first = c.diagnosis[0]
    assert first.code == "step-count", [(d.code, d.message) for d in c.diagnosis]
    assert f"{K} times the baseline's" in first.message and "fell" not in first.message
