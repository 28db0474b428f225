"""A loss computed in a 16-bit dtype plus a term each window holds constant.

A loop that computes its cross-entropy from 16-bit logits outside autocast gets a 16-bit loss
(near 2.8 in bfloat16, a multiple of 2^-7), and a weight penalty or an auxiliary loss added in
float32 moves every recorded loss off that grid: `tolerances.loss_rounding` no longer sees the
16-bit dtype in the values, and without a reference two runs' losses that differ by one 16-bit
step failed the loss check at 0.3% (`bench/model_zoo.py --penalty 1e-3 --autocast bfloat16
--reference-none`: 30 of 40 clean runs). The term is the same at every micro-step of a window
(the weights do not change inside it), so the differences between a window's micro losses are
still whole multiples of the 16-bit step; those differences give the step away.
"""

from __future__ import annotations

import math

import numpy as np

from ..runs.model import Run
from .tolerances import eps

COARSE = 2.0**-12  # a step this coarse relative to the losses is no float32 rounding
LEAST = 4  # differences that must all fall on the step: by chance 2^-8 each at the finest step


def window_step(run: Run, compute: str) -> float:
    """The 16-bit compute dtype's epsilon, where every difference between two micro losses of
    one window of `run` is a whole multiple of one power-of-two step coarser than COARSE
    (within the float32 rounding of the losses): the losses were computed in that dtype, and
    are known to its rounding as losses held in it exactly are (`loss_rounding`); else 0."""
    if compute not in ("float16", "bfloat16"):
        return 0.0
    losses = np.asarray(run.micro_loss, dtype=np.float64)
    found = []
    for i in range(run.updates):
        w = run.window(i)
        held = losses[w.start : w.stop]
        if held.size >= 2 and np.isfinite(held).all():
            found.append(held[1:] - held[0])
    diffs = np.concatenate(found) if found else np.zeros(0)
    diffs = np.abs(diffs[diffs != 0])
    finite = np.abs(losses[np.isfinite(losses)])
    if diffs.size < LEAST or not finite.size:
        return 0.0
    top = float(finite.max())
    slack = 4 * eps("float32") * top  # each loss rounded to float32 once the term was added
    step = 2.0 ** math.floor(math.log2(float(diffs.min())))
    while step >= COARSE * top:
        off = np.abs(diffs - step * np.round(diffs / step))
        if bool((off <= slack).all()):
            return eps(compute)
        step /= 2
    return 0.0
