"""A log's first step line: where its count starts (0 or 1; a counter of samples seen after each
step), the lines that say the log cannot be read step by step (a counter at its total, a first
step past 1), and what the line's form says of its numbers (PaddleClas's running means,
detectron2's medians). Numpy-free."""

from __future__ import annotations

import re

from ...errors import BadInput
from .names import EVERY_STEP_ADVICE
from .parsed import ParsedLog

_DETECTRON2 = re.compile(r"\biter: \d+\s+total_loss: ")  # CommonMetricPrinter's medians
# PaddleClas's step line: its numbers are meters' `AverageMeter.avg`, reset at each epoch
_PADDLECLAS = re.compile(r"\[Train\]\[Epoch \d+/\d+\]\[Iter: \d+/\d+\]")
PADDLECLAS_MEANS = (
    "PaddleClas's `[Train][Epoch e/E][Iter: i/n]` lines print each loss's `AverageMeter.avg`, "
    "its mean over the epoch so far"
)


def first_step(log: ParsedLog, line: str, value: int | None, counter: bool, where: str) -> int:
    """The step the log's first step line counts from (0 or 1), noting what its form says;
    BadInput where the first line shows the log is not printed step by step."""
    value = 0 if value is None else value  # records without a step field count from 0
    if value > 1 and counter and _samples_after(line, value):
        log.stride, value = value, 1
        log.notes.append(
            f"the step counter starts at {log.stride} with the share of the epoch "
            "beside it (samples seen after each step, as open_clip prints): read as "
            f"steps of {log.stride} from step 1"
        )
    if value not in (0, 1) and re.search(rf"(?<!\d){value}/{value}(?!\d)", line):
        raise BadInput(
            f"{where}: the first step is {value} of {value}: a line per "
            "epoch, at its end, whose loss is a mean over the epoch or its last steps "
            "(Keras's verbose=2; a logger whose interval is longer than the epoch, as "
            "MMEngine's): print each step's own loss (MMEngine: interval=1 and "
            "window_size=1; Keras's logs hold the epoch's running mean: print the batch's "
            "loss from your own train_step)"
        )
    if value not in (0, 1):
        raise BadInput(
            f"{where}: the first step is {value}; expected 0 or 1 (a log "
            f"printed every {value} steps? Its lines are often means over the steps "
            f"since the last: {EVERY_STEP_ADVICE})"
        )
    if _PADDLECLAS.search(line):
        log.running_mean = PADDLECLAS_MEANS
    if _DETECTRON2.search(line):
        log.notes.append(
            "its lines are detectron2's CommonMetricPrinter's, which prints each loss "
            "as its median over the last window_size iterations (20 by default): read "
            "as printed, a median tells a bug some updates late; build the printer with "
            "window_size=1 to print each iteration's own loss"
        )
    return value


def _samples_after(text: str, value: int) -> bool:
    """Whether a line's counter is `[ value/total (p%)]`: a progress count of samples, which
    open_clip prints after each step (from one batch, not 0)."""
    return re.search(rf"\[\s*{value}/\s*\d+\s*\(\s*\d+(?:\.\d+)?%\)\s*\]", text) is not None
