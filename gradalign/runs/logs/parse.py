"""One pass over a training log: step lines (or step records), printed arrays after each step,
printed window means, and the noise around them (counted, never fatal). Steps count from 0 or 1
without gaps; a record without a step is the next; a counter striding by samples counts strides;
of several step keys the one that counts is read. Numpy-only."""

from __future__ import annotations

import re
from pathlib import Path

from ...errors import BadInput
from .arrays import ArrayReader
from .cleaned import half_dtype, rank_tag, readable
from .first_step import first_step
from .grammar import (
    StepLine,
    array_line,
    arrow_line,
    epoch_header,
    eval_begins,
    eval_ends,
    one_number,
    step_line,
)
from .lines import Lines, read_lines
from .names import EVERY_STEP_ADVICE
from .parsed import UNPRINTED, Block, ParsedLog
from .records import UNNUMBERED, NotAStep, Records
from .repeats import RepeatedSteps
from .restarts import first_only, named_step, why_again

# a warning as Python's warnings module prints it (`/path/x.py:617: UserWarning: ...`), glued to
# the end of another line's text
_GLUED_WARNING = re.compile(r"(?<=\S)(?:[A-Za-z]:)?[/\\][^\s:]*\.py:\d+: \w*Warning: ")


class _Pass(RepeatedSteps):
    """The state of one pass: lines, position, what was found."""

    def __init__(self, path: Path, lines: Lines, key: int | None = None) -> None:
        self.path, self.raw, self.at = path, lines.texts, 0
        self.numbers = lines.numbers  # the line each segment is on (a `\r` splits a line)
        self.lines = readable(lines.texts)
        self.in_eval = False  # after a line announcing an evaluation, until it ends
        self.eval_steps = 0  # step lines read as the evaluation's in the current block
        self.log = ParsedLog(path)
        self.records = Records()
        self.key = key  # the step key read on every line (its place among the line's step keys)
        self.most_keys = 1  # the most step keys a step line held
        self.current: list[int] = []  # the segments the current step was printed on, in order
        self.summaries: list[int] = []  # line numbers of steps printed again as summaries
        self.printers: tuple[str, ...] | None = None  # each step's line shapes, one a printer
        self.named = False  # whether a line of the current step named it
        self.recorded = False  # whether a record without a step is among its lines
        self.unnamed = False  # whether a step before the current one had no line that named it
        if lines.cut is not None:
            self.log.notes.append(
                f"its last line ({lines.cut}) has no line end and is shorter than the "
                "line before it that begins alike: cut while it was written (a killed run's "
                "buffered output); left out"
            )

    def number(self, index: int) -> int:
        """The line number segment `index` is on."""
        return self.numbers[index]

    def where(self, index: int) -> str:
        return f"{self.path}:{self.number(index)}"

    def run(self) -> ParsedLog:
        while self.at < len(self.lines):
            index = self.at
            text = self.lines[index]
            self.at += 1
            if text:
                self._line(index, text)
        if self.unnamed or (self.log.steps and not self.named):
            self.log.notes.append(UNNUMBERED)  # records read as consecutive steps
        self.log.notes += self.records.notes
        self.log.written_by = self.records.written_by
        if self.log.steps:  # the last step's lines (the only step's: they set the count)
            self._printed_times(len(self.lines) - 1)
        if self.summaries:
            lines = ", ".join(str(n) for n in self.summaries[:3])
            more = "" if len(self.summaries) <= 3 else f" and {len(self.summaries) - 3} more"
            what = "line" if len(self.summaries) == 1 else "lines"
            self.log.notes.append(
                f"{what} {lines}{more} print a step again in another shape than its own lines "
                "(an epoch's summary): read as summaries, not as that step"
            )
        return self.log

    def _line(self, index: int, text: str) -> None:
        if self.in_eval and self._evaluation(index, text):
            return
        if eval_begins(text):
            self.in_eval, self.eval_steps = True, 0
            self.log.add_noise(self.number(index), text)
            return
        try:
            step = self.records.read(text)
            if isinstance(step, NotAStep):
                self.log.add_noise(self.number(index), text)
                return
            if step is None:
                step = step_line(text)
        except BadInput as err:
            raise BadInput(f"{self.where(index)}: {err}") from None
        if step is not None:
            self._step(index, step)
            return
        arrow = arrow_line(text)
        if arrow is not None and arrow.is_mean:
            value = one_number(arrow.rest)
            if value is None:
                raise BadInput(f"{self.where(index)}: expected one number, found {arrow.rest!r}")
            self.log.means.append(value)
            self.log.mean_bracketed.append(arrow.rest.startswith("["))
            self.log.mean_dtypes.append(half_dtype(self.raw[index]))
        elif arrow is not None and not arrow.is_other_loss:
            self._array(index, arrow.label, arrow.rest, committed=not arrow.named)
        elif text.startswith("[") and epoch_header(text) is None:
            self._array(index, "", text, committed=False)
        else:
            self.log.add_noise(self.number(index), text)
            header = epoch_header(text)  # `Epoch 0/10` counts too
            if header is not None:
                self.log.header_epoch = header

    def _evaluation(self, index: int, text: str) -> bool:
        """Read a line inside an evaluation block; False where it ends the block and is read
        as any line. An epoch header ends it, read; an end line (`Eval samples: 320`) ends it,
        noise; the block's first step line ends it where it continues the training's count (or
        starts the next epoch): the line announced an evaluation printed elsewhere. Other lines,
        step lines too (the evaluation's own count), are noise."""
        if epoch_header(text) is not None:
            self.in_eval = False
            return False
        if eval_ends(text):
            self.in_eval = False
        else:
            try:
                step = self.records.read(text) or step_line(text)
            except BadInput:
                step = None
            if isinstance(step, StepLine):
                if not self.eval_steps and self._continues(step):
                    self.in_eval = False
                    return False
                self.eval_steps += 1
        self.log.add_noise(self.number(index), text)
        return True

    def _continues(self, step: StepLine) -> bool:
        """Whether a step line is the training's next: the step expected, or the first of the
        next epoch."""
        log = self.log
        if not log.steps or step.index is None:
            return False
        values = [v // log.stride if step.counter else v for v in (step.index, *step.others)]
        expected = log.first_index + log.steps - log.epoch_start
        epoch = step.epoch if step.epoch is not None else log.header_epoch
        return expected in values or (log.first_index in values and _next_epoch(log.epoch, epoch))

    def _step(self, index: int, step: StepLine) -> None:
        log = self.log
        rank = self._rank(index)
        self.most_keys = max(self.most_keys, 1 + len(step.others))
        if not log.losses:
            value = next((v for v in (step.index, *step.others) if v in (0, 1)), step.index)
            value = value if self.key is None else self._keyed(step)
            value = first_step(log, self.lines[index], value, step.counter, self.where(index))
            log.first_index, log.rank = value, rank
        if rank != log.rank:
            raise BadInput(
                f"{self.where(index)}: step lines of processes {log.rank or 'untagged'} and "
                f"{rank or 'untagged'} are interleaved; give one log per card (each process's "
                "lines alone, by their tag); where the baseline ran on "
                "as many cards, compare card by card (the baseline's card 0 log against the "
                "merged run's card 0 log): each card prints the loss of its own share"
            )
        expected = log.first_index + log.steps - log.epoch_start
        value = self._index(index, step, expected)
        epoch = step.epoch if step.epoch is not None else log.header_epoch
        if log.steps and value == expected - 1 and epoch == log.epoch:
            log.repeats += 1  # printed again: another micro-step of the same update
            self.current.append(index)
            self.named = self.named or step.index is not None
            self.recorded = self.recorded or step.index is None
            self._append(index, step)
            return
        if value == log.first_index != expected and _next_epoch(log.epoch, epoch):
            if log.stride == 1:
                first_only(self.where(index), log.epoch, log.first_index, expected, step.total)
            log.epoch_start, expected = log.steps, value  # the count restarts each epoch
        if value != expected:
            gap = value > expected and (self._glued_warning(index) or self._unread(index, expected))
            raise BadInput(
                f"{self.where(index)}: expected step {expected}, found step {value}"
                + (gap or why_again(value, expected, log.first_index))
            )
        if log.steps:
            self._printed_times(index)
            if epoch is not None and log.epoch is not None and epoch != log.epoch:
                log.epoch_starts.append(len(log.losses))
        log.epoch, log.steps, log.repeats = epoch, log.steps + 1, 1
        self.unnamed = self.unnamed or (log.steps > 1 and not self.named)
        self.current, self.named, self.recorded = (
            [index],
            step.index is not None,
            step.index is None,
        )
        self._append(index, step)

    def _since_step(self) -> int:
        """The first line after the last step line (0 before any)."""
        return self.current[-1] + 1 if self.current else 0

    def _glued_warning(self, index: int) -> str | None:
        """Where a line since the last step line has a Python warning glued after its text
        (`step 17 loss 1.97 lr 0.2/usr/lib/.../x.py:617: UserWarning: ...`): the reason for
        a step that is not read."""
        for at in range(self._since_step(), index):
            if "Warning: " in self.raw[at] and _GLUED_WARNING.search(self.raw[at]):
                return (
                    f": line {self.number(at)} has a Python warning glued after its text, which "
                    "may hold the step (stdout and stderr written into one file while stdout "
                    "is buffered): run the training with `python -u` or PYTHONUNBUFFERED=1, or "
                    "send stderr to its own file"
                )
        return None

    def _unread(self, index: int, expected: int) -> str | None:
        """Where a line since the last step line names the missing step, yet gave no step: its
        loss printed as no number the reader knows (`null`, `None`, `1.#QNAN`, `abc`)."""
        start = self._since_step()
        at = named_step(self.lines[start:index], expected)
        if at is None:
            return None
        return (
            f": line {self.number(start + at)} names step {expected} but no loss was read from it "
            f"({self.lines[start + at].strip()[:80]!r}): a loss printed as no number? Print it as "
            "a number (a NaN as `nan`)"
        )

    def _rank(self, index: int) -> str | None:
        """The process the line is tagged with: a tag before a `\r` tags its segments too."""
        while (tag := rank_tag(self.raw[index])) is None and index:
            if self.numbers[index - 1] != self.numbers[index]:
                break
            index -= 1
        return tag

    def _append(self, index: int, step: StepLine) -> None:
        log = self.log
        log.losses.append(UNPRINTED if step.loss is None else step.loss)
        log.unprinted.append(step.loss is None)
        log.skips.append(step.skipped)
        log.scales.append(step.scale)
        log.bracketed.append(step.bracketed)
        log.loss_dtypes.append(half_dtype(self.raw[index]))
        log.lrs.append(step.lr)
        log.norms.append(step.grad_norm)
        log.sizes.append(step.size)
        log.step_lines.append(self.number(index))
        log.blocks.append([])

    def _array(self, index: int, label: str, first: str, committed: bool) -> None:
        """Read the array starting at line `index`. A committed one (after an arrow) must
        parse; an unlabelled `[...]` line that does not is noise."""
        reader, at, skipped = ArrayReader(), index, 0
        try:
            reader.feed(first)
            while not reader.done:
                at += 1
                if at >= len(self.lines):
                    raise ValueError(
                        "the printed array is not closed before the end of the file (was the "
                        "log cut off?)"
                    )
                text = self.lines[at]
                if not text:
                    continue
                if (parts := array_line(text)) is not None:
                    reader.feed(parts)
                elif not committed or step_line(text) or _arrow(text):
                    raise ValueError(
                        f"the printed array is not closed before line {self.number(at)}"
                    )
                else:  # a framework line printed in the middle of the array
                    skipped += 1
                    self.log.add_noise(self.number(at), text)
            array = reader.result()
            if label and not committed and array.values.size < 2:
                raise ValueError("a named number, not an array of weights")  # `acc: [0.5]`
        except (ValueError, BadInput) as err:
            if committed:
                raise BadInput(f"{self.where(index)}: {err}") from None
            self.log.add_noise(self.number(index), self.lines[index])
            return
        self.at = at + 1
        if self.log.blocks:
            dtype = next(filter(None, map(half_dtype, self.raw[index : at + 1])), None)
            self.log.blocks[-1].append(Block(label, array, self.number(index), dtype))
        else:  # printed before the first step: not attributable to any step
            self.log.unattached += 1
            self.log.add_noise(self.number(index), self.lines[index])

    def _index(self, index: int, step: StepLine, expected: int) -> int:
        """The step a line names: a record without a step field is the next one (after a line
        that named the current step, another printer of that step); a counter
        advancing by a stride (samples) counts strides; of several step keys, the one that
        counts line by line (`global_step` repeated beside a `micro_step` that counts)."""
        log = self.log
        if step.index is None:  # beside a line that named the current step: another printer's
            return expected - 1 if log.steps and self.named and not self.recorded else expected
        value = step.index if self.key is None else self._keyed(step)
        if step.counter:
            if len(log.losses) == 1 and log.first_index == 0 and value > 1 == log.stride:
                log.stride, log.counter_total = value, step.total
                log.notes.append(_stride_note(value, step.total))
            if value % log.stride:
                raise BadInput(
                    f"{self.where(index)}: the counter {value} is not a multiple of "
                    f"{log.stride}, the stride its first lines advanced by: a log printed every "
                    f"{log.stride}th iteration ends on its last, and its losses may be means "
                    f"over the iterations since the last line; {EVERY_STEP_ADVICE}"
                )
            value //= log.stride
        if self.key is not None:
            return value
        return next((v for v in (value, *step.others) if v == expected), value)

    def _keyed(self, step: StepLine) -> int | None:
        """The value of the step key this pass reads (the line's first where it holds fewer)."""
        values = (step.index, *step.others)
        return values[self.key] if self.key is not None and self.key < len(values) else values[0]


def _stride_note(value: int, total: int | None) -> str:
    """How a counter whose second line reads `value` was read: a stride of samples, or, where
    `value` is its total's last index, the first and last iteration of each epoch."""
    if total is not None and value == total - 1:  # `[0/8]`, `[7/8]`, then the next epoch's 0
        return (
            f"the step counter went from 0 to {value}, the last of its {total}: the log prints "
            "only some iterations (the first and last of each epoch, as timm does where "
            "--log-interval exceeds an epoch), each line read as one step and judged against "
            "the other log's line; the iterations between are not judged, and its losses may "
            "be means over them: print every iteration (timm's --log-interval 1)"
        )
    return (
        f"the step counter advances by {value} a line, read as samples (as the PyTorch "
        f"examples print), each line one step; if it counts iterations, the log prints every "
        f"{value}th and its losses may be means or medians over them (PaddleDetection's "
        "log_iter): print every iteration"
    )


def _arrow(text: str) -> bool:
    """Whether a line starts another array (`-->[`; a `name [` line may be a framework's)."""
    arrow = arrow_line(text)
    return arrow is not None and not arrow.named


def _next_epoch(last: int | None, now: int | None) -> bool:
    """Whether a step line names the epoch after the one the last step line named."""
    return last is not None and now == last + 1


def parse_log(path: Path) -> ParsedLog:
    """Parse a log; BadInput (naming the file and line) for a malformed step or array.

    Where step lines hold several step keys (`global_step: 1, micro_step: 0`) and matching each
    line's keys against the next step fails, each key is read alone in turn: an update count
    printed at each micro-step repeats, a micro count counts, a count within the window
    (`micro_step: 0..K-1`) reads no log; the first key that reads the whole log is the step."""
    lines = read_lines(path)
    first = _Pass(path, lines)
    try:
        log = first.run()
    except BadInput:
        log = None
        for key in range(first.most_keys if first.most_keys > 1 else 0):
            try:
                log = _Pass(path, lines, key).run()
                break
            except BadInput:
                continue
        if log is None:
            raise
    if not log.losses:
        raise BadInput(
            f"{path}: no step lines like '0   [0.2957]' or '0   0.2957' found; not a training log"
        )
    return log
