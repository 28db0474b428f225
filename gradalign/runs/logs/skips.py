"""Iterations a loss scaler skipped, as the step line says so, and the scale it printed.

Megatron-LM in fp16 prints, on the iteration line, `loss scale: 65536.0` and `number of skipped
iterations:   1` (iterations whose optimizer step its loss scaler skipped, of those since the
last line: with `--log-interval 1`, that iteration). A skipped iteration adds no loss to the
means the line prints (Megatron prints a loss only where its average is > 0), so its line holds
no `lm loss`: such a line is a step whose loss was not printed. A log whose every step line
prints the counter gives each update's optimizer steps (0 where a line of its window counted a
skip, else 1); one whose every step line prints a scale too gives each update's loss scale: the
scale printed after the update before it (the scale the update ran at; for update 0, the scale
its own line printed: the first overflow leaves it unchanged under Megatron's default hysteresis
of 2). The judge then names skips that differ between two runs (`scaler-skips`) and leaves the
loss of an update that both runs skipped unjudged. Other frameworks' skip messages are lines of
their own (DeepSpeed's `OVERFLOW! ... Skipping step`, fairseq's `gradient overflow detected`):
noise, as before. The fields are read by `names`. Numpy-only.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from ..model import Run

if TYPE_CHECKING:
    from .parsed import ParsedLog


def attach_scaler(run: Run, log: ParsedLog) -> None:
    """The losses the log did not print (unknown), and, where every step line prints the skip
    counter (and a loss scale), each update's optimizer steps (and loss scale)."""
    k, n = run.accum_steps, run.updates
    unprinted = np.array(log.unprinted, dtype=bool)
    if unprinted.any():
        run.loss_known = ~unprinted
        run.micro_loss = np.where(unprinted, np.nan, run.micro_loss)
        if run.loss_quantum is not None:
            run.loss_quantum = np.where(unprinted, 0.0, run.loss_quantum)
    if not log.skips or any(count is None for count in log.skips):
        return
    skipped = np.array(log.skips, dtype=np.int64)[: n * k].reshape(n, k).max(axis=1) >= 1
    run.optimizer_steps = np.where(skipped, 0, 1).astype(np.int64)
    if any(scale is None for scale in log.scales):
        return
    after = np.array(log.scales, dtype=np.float64)[: n * k][k - 1 :: k]  # each window's last
    run.loss_scale = np.concatenate([after[:1], after[:-1]])
