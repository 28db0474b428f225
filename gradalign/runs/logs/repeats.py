"""Steps printed on more than one line: once per micro-step (every step alike), by several
printers (lines of other shapes with one loss: joined into one step), or once more as an
epoch's summary (dropped as noise). Numpy-free."""

from __future__ import annotations

import re

from ...errors import BadInput
from .grammar import Printed
from .parsed import ParsedLog

_NUMBER = re.compile(r"[-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?")


class RepeatedSteps:
    """What a pass over a log (`parse._Pass`) does with the lines of one step: `current` holds
    the segments the last step was printed on; `lines` the readable segments."""

    log: ParsedLog
    lines: list[str]
    raw: list[str]
    current: list[int]
    summaries: list[int]
    printers: tuple[str, ...] | None

    def number(self, index: int) -> int:
        raise NotImplementedError

    def where(self, index: int) -> str:
        raise NotImplementedError

    def _printed_times(self, index: int) -> None:
        """Every step is printed on as many lines: once, or once per micro-step (a loop that
        prints its optimizer-step count at each micro-batch, as Lightning's metrics.csv does)."""
        log = self.log
        self._join_printers()
        if log.printed_times is not None and log.repeats > log.printed_times:
            self._drop_summaries(log.repeats - log.printed_times)
        first = self.raw[self.current[0]]  # each printed again a copy of its line, or not
        copies = all(self.raw[at] == first for at in self.current[1:])
        log.verbatim &= copies
        if log.printed_times is None:
            log.printed_times = log.repeats
        elif log.repeats != log.printed_times:
            raise BadInput(
                f"{self.where(index)}: the step before this line is printed on {log.repeats} "
                f"lines, each step before it on {log.printed_times}: the steps repeat unevenly "
                + self._uneven_why(copies)
            )

    def _uneven_why(self, copies: bool) -> str:
        """Why the step just read is printed on another count of lines than the ones before."""
        log = self.log
        if copies and log.printed_times == 1:
            return (
                f"(from line {self.number(self.current[0])} on each step line is printed "
                f"{log.repeats} times, the copies identical to the byte: a logging handler "
                "added during the run, whose records also reach another handler? Log each line "
                "once, or drop the copies (uniq LOG); else processes printing into one log)"
            )
        if log.steps == 2 and log.repeats == log.printed_times + 1:
            return (
                f"(the first step on {log.printed_times} lines and the next on {log.repeats}: "
                "a step count incremented at each window's last micro-step before that "
                "micro-step's line is printed, so each window's last line names the next step? "
                "Print the count before incrementing it; else two processes printing into one "
                "log, or an evaluation loop)"
            )
        return "(two processes printing into one log, or an evaluation loop)"

    def _join_printers(self) -> None:
        """A step printed on several lines each of its own shape, with the same loss to the
        printed digits, in the same shapes as every step before it joined this way: several
        printers of each step (DeepSpeed's `steps: 1 loss: 2.3026` and Megatron's `iteration
        1/ 6 | ... lm loss: 2.302585E+00 |`), read as one step, its loss from the line with the
        most digits. Lines of one shape are one printer's: per micro-step, or two processes."""
        log, lines = self.log, self.current
        shapes = tuple(_shape(self.lines[at]) for at in lines)
        if log.repeats < 2 or len(set(shapes)) < len(shapes):
            return
        first = self.printers is None and log.printed_times is None  # the first step read
        if not first and shapes != self.printers:
            return
        printed = log.losses[-len(lines) :]
        known = [(i, p) for i, p in enumerate(printed) if not log.unprinted[i - len(lines)]]
        if not known:
            return
        ends = [(p.value - _resolution(p) / 2, p.value + _resolution(p) / 2) for _, p in known]
        if max(low for low, _ in ends) > min(high for _, high in ends):
            if self.printers is None:
                return  # other numbers: not one loss printed twice
            values = " and ".join(f"{p.value:.8g}" for _, p in known)
            raise BadInput(
                f"{self.where(lines[-1])}: the {len(lines)} printers of each step print other "
                f"losses here ({values}), where each step before agreed: keep one printer's "
                "lines (one of them may print a running mean)"
            )
        keep = min(known, key=lambda item: _resolution(item[1]))[0]
        if self.printers is None:
            self.printers = shapes
            log.notes.append(
                f"each step is printed by {len(lines)} printers, on lines of {len(lines)} "
                f"shapes with the same loss (lines {', '.join(map(str, map(self.number, lines)))}"
                "): read as one step each, its loss from the line that prints the most digits"
            )
        log.join_last(len(lines), keep)
        log.repeats, self.current = 1, [lines[keep]]

    def _drop_summaries(self, extra: int) -> None:
        """A step printed on `extra` lines more than each step before it, the extra ones last and
        each of another shape than the step's own lines (fairseq's epoch summary, `| train |
        epoch 001 | loss 2.26 | num_updates 6`, repeats the epoch's last step): those lines are
        summaries, noise."""
        kept, tail = self.current[:-extra], self.current[-extra:]
        own = {_shape(self.lines[at]) for at in kept}
        if any(_shape(self.lines[at]) in own for at in tail):
            return
        self.log.drop_last(extra)
        self.log.repeats -= extra
        self.current = kept
        for at in tail:
            self.log.add_noise(self.number(at), self.lines[at])
            self.summaries.append(self.number(at))


def _shape(text: str) -> str:
    """A line with its numbers left out and its spaces collapsed: lines one printer prints for
    one step share it (`epoch 001: 6 / 6 loss=2.26, num_updates=6` and not `| epoch 001 | loss
    2.26 | num_updates 6`)."""
    return " ".join(_NUMBER.sub("#", text).split())


def _resolution(printed: Printed) -> float:
    """The step between neighbouring printed values of `printed`'s shape."""
    return 10.0 ** (printed.exponent - printed.digits)
