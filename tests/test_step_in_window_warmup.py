"""Steps inside the windows from update 0, where the learning rate is 0 (a warmup's first step,
as transformers' schedules start): the weights first change inside a window at update 1, and
`step-in-window` pointed there alone, while the optimizer-steps check said update 0; it says
the extra steps began at update 0 and left the weights as they were."""

from __future__ import annotations

import torch

from gradalign.judge.compare import compare
from gradalign.runs.reader import read_run_dir

from .recorded_loop import classifier, train

BATCH, K = 32, 4


def loop(out, k: int, step_inside: bool = False):
    model, x, y = classifier(4 * BATCH)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    warmup = torch.optim.lr_scheduler.LambdaLR(opt, lambda u: 0.0 if u == 0 else 1.0)

    def inside(update: int, micro: int) -> None:
        if step_inside and micro > 0:
            opt.step()  # an optimizer the loop steps at every micro-batch (the unwrapped one)

    train(out, model, opt, x, y, k, batch=BATCH, before_micro=inside,
          after_step=lambda u: warmup.step())  # fmt: skip
    return read_run_dir(out)


def test_steps_inside_the_windows_under_a_zero_first_lr_are_dated_from_update_0(tmp_path):
    base = loop(tmp_path / "base", 1)
    assert compare(base, loop(tmp_path / "clean", K)).verdict == "pass"
    c = compare(base, loop(tmp_path / "bug", K, step_inside=True))
    first = c.diagnosis[0]
    assert first.code == "step-in-window", [(d.code, d.message) for d in c.diagnosis]
    assert first.evidence["first_window"] == 1
    assert first.evidence["first_update_with_extra_steps"] == 0
    assert "from update 0, whose extra steps left the weights as they were" in first.message
