"""What a step number out of order says: lines lost or printed every few steps (a step ahead of
the one expected), a run resumed from a checkpoint, a count that restarts (a step behind), or
an epoch that printed only its first step.
Numpy-free."""

from __future__ import annotations

import re

from ...errors import BadInput
from .names import EVERY_STEP_ADVICE, LINE_STEP_KEY


def named_step(texts: list[str], step: int) -> int | None:
    """The first of `texts` (the lines since the last step line) that names step `step` after a
    step key (`step 7`, `"step": 7`, `global_step=7`): a step line whose loss was not read, as
    one printed `None`, `null` or `1.#QNAN`."""
    named = re.compile(rf"(?i)(?<![\w./])(?:{LINE_STEP_KEY})\b\W{{1,4}}{step}(?![\d.])")
    return next((i for i, text in enumerate(texts) if named.search(text)), None)


def why_again(value: int, expected: int, first: int) -> str:
    """Why a step may come again: from its first value, a loop that counts again; from a later
    one, a run resumed from a checkpoint, whose repeated steps supersede the ones before."""
    if value == expected:
        return ""
    if value > expected:
        missing = (
            f"step {expected} is"
            if value == expected + 1
            else f"steps {expected} to {value - 1} are"
        )
        if expected > first + 1:  # within the log: lines lost, or printed without a loss
            return f": {missing} not in the log (a line lost, or one printed without its loss?)"
        every = f"every {value - expected + 1} steps"
        if first:  # steps 1, 10, 20, ...: torchtitan's log_freq of 10, not 9
            every += f", or at step {first} and then every {value} as torchtitan prints"
        return (
            f": {missing} not in the log (printed {every}, or a "
            "step column that counts samples, as DeepSpeed's monitor files do? Printed every n "
            f"steps, its lines may be means over the steps since the last: {EVERY_STEP_ADVICE})"
        )
    if value > first:
        return (
            f" again: a run resumed from a checkpoint? Steps {value} to {expected - 1} are "
            "printed twice and the later lines supersede the earlier: give the log of one "
            f"uninterrupted run, or delete the earlier lines of steps {value} to {expected - 1}; "
            "else an evaluation loop or another process printing step lines into this log"
        )
    return (
        " again: the steps restart (two processes printing into one log, an evaluation loop, "
        "a run restarted from step 0, or a new epoch the step line does not name)"
    )


def first_only(where: str, epoch: int | None, first: int, expected: int, total: int | None) -> None:
    """BadInput where an epoch printed only its first step and its counter holds more
    (`Epoch: [0] [0/8]`, then `Epoch: [1] [0/8]`): the log prints every n-th iteration, n
    longer than the epoch (PaddleDetection's log_iter, 20 by default); read as consecutive
    steps, its lines would stand an epoch apart."""
    if expected - first != 1 or total is None or total <= 1:
        return
    raise BadInput(
        f"{where}: epoch {epoch} printed only its first step ([{first}/{total}]) before the "
        f"next began: the log prints every n-th iteration, n longer than an epoch of {total}, "
        "and its losses may be means or medians over the iterations since its last line; "
        f"{EVERY_STEP_ADVICE}"
    )
