"""`optimizer.zero_grad()` placed after the window's last micro-step but before
`optimizer.step()`: the step sees no gradient. The Recorder counts such calls per window
(`update/zero_grads_before_step`), and `micro-batch-missing` says that is what emptied the
gradient (it listed gradient sync off or gradients dropped after the last backward). A zero
gradient with no such call keeps that list; a call after a step the GradScaler skipped is none."""

from __future__ import annotations

import dataclasses

import pytest
import torch

import gradalign
from gradalign.judge.compare import compare
from gradalign.judge.signatures.window_steps import _cleared_before_step
from gradalign.runs.reader import read_run_dir

from .recorded_loop import classifier, train

BATCH, K, UPDATES = 16, 4, 3


def loop(out, k: int, variant: str) -> None:
    """`variant`: "right"; "clear-first" (zero_grad(), then step()); "zero-loss" (each loss
    times 0: backward ran, every gradient is 0)."""
    model, x, y = classifier(BATCH * UPDATES)

    def end(rec: gradalign.Recorder, opt: torch.optim.Optimizer, update: int) -> None:
        if variant == "clear-first":
            opt.zero_grad()
        opt.step()
        opt.zero_grad()
        rec.update()

    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    scale = 0.0 if variant == "zero-loss" else 1.0
    train(out, model, opt, x, y, k, batch=BATCH, scale=scale, window_end=end)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("cleared")
    loop(root / "base", 1, "right")
    for variant in ("right", "clear-first", "zero-loss"):
        loop(root / variant, K, variant)
    return root


def first(runs, variant: str):
    c = compare(read_run_dir(runs / "base"), read_run_dir(runs / variant))
    return c.diagnosis[0]


def test_a_clear_before_the_step_is_named_as_such(runs):
    d = first(runs, "clear-first")
    assert d.code == "micro-batch-missing", d
    assert "zero_grad() was called after the window's last micro-step" in d.message
    assert d.evidence["zero_grad_before_step"] is True
    assert "after optimizer.step()" in d.fix


def test_a_zero_gradient_without_such_a_clear_keeps_its_reading(runs):
    d = first(runs, "zero-loss")
    assert d.code == "micro-batch-missing", d
    assert "gradient sync off" in d.message and "zero_grad_before_step" not in d.evidence
    assert first(runs, "right").code == "within-noise"


def test_a_clear_after_a_skipped_step_is_none(runs):
    run = read_run_dir(runs / "clear-first")
    assert run.zero_grads_before_step is not None and _cleared_before_step(run, 0)
    steps = run.optimizer_steps.copy()
    steps[0] = 0  # as where a GradScaler skipped the step: the zero_grad() came after it
    assert not _cleared_before_step(dataclasses.replace(run, optimizer_steps=steps), 0)
    assert read_run_dir(runs / "right").zero_grads_before_step is None
