"""`zero_grad()` after every micro-step's backward, the last one's too, so that every step is
taken with a gradient of zeros: `zero-grad-in-window` alone. A second diagnosis said every
tensor of the model was frozen in one run only, "every other tensor agreeing", where there was
no other tensor (`lr-schedule`, whose fix freezes the same tensors in both runs)."""

from __future__ import annotations

import torch

from gradalign.judge.compare import compare
from gradalign.runs.reader import read_run_dir

from .recorded_loop import classifier, train

BATCH, K, UPDATES = 24, 4, 4


def _run(out, k: int, clear_each_micro: bool):
    model, x, y = classifier(BATCH * UPDATES)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)

    def cleared(u: int, j: int) -> None:  # before micro-step j: the previous one's gradient
        if clear_each_micro and j > 0:
            opt.zero_grad()

    def window_end(rec, opt, u: int) -> None:
        if clear_each_micro:
            opt.zero_grad()  # the last micro-step's too: the step sees zeros
        opt.step()
        opt.zero_grad()
        rec.update()

    train(out, model, opt, x, y, k, batch=BATCH, before_micro=cleared, window_end=window_end)
    return read_run_dir(out)


def test_a_gradient_cleared_before_every_step_is_zero_grad_in_window_alone(tmp_path):
    base = _run(tmp_path / "base", 1, False)
    assert compare(base, _run(tmp_path / "clean", K, False)).verdict == "pass"
    c = compare(base, _run(tmp_path / "bug", K, True))
    codes = [d.code for d in c.diagnosis if d.severity == "error"]
    assert codes == ["zero-grad-in-window"], [(d.code, d.message) for d in c.diagnosis]
