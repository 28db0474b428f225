"""What one pass over a training log found (`parse`): each step's loss and how it was printed,
the arrays printed after each step, the window means, the noise; and the precision each stream
of printed numbers was printed at. Numpy-only."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ...errors import cut
from .arrays import PrintedArray
from .grammar import Printed

SHOWN_NOISE = 3
# a stream of this many distinct rounded numbers shows its printer's precision: numpy prints
# each number in the fewest digits that identify it, at most `precision`, so a float32 stream
# whose every number is shorter than the log's longest is either another printer's or a few
# values that happen to be short (a frozen tensor's `1.0001`): not 4 distinct ones
STREAM_NUMBERS = 4
UNPRINTED = Printed(math.nan, 0, 0, False)  # the loss of a line that printed none


def _rounded(values: np.ndarray, found: set[float]) -> None:
    """Add to `found` the values a print may have rounded, up to `STREAM_NUMBERS` of them: not
    short binary fractions (multiples of 2**-12: `0.`, `1.`, `0.5`), which any printer shows
    exactly in few digits and which so say nothing of the printer's precision."""
    scaled = values[np.isfinite(values)] * 4096.0
    for value in np.unique(scaled[scaled != np.round(scaled)])[:STREAM_NUMBERS]:
        found.add(float(value))


def _stream(digits: int, arrays: list[np.ndarray]) -> tuple[int, int]:
    """The most digits of a stream, and how many distinct rounded values it holds (at most
    `STREAM_NUMBERS`)."""
    found: set[float] = set()
    for values in arrays:
        if len(found) >= STREAM_NUMBERS:
            break
        _rounded(values, found)
    return digits, len(found)


def _log_digits(streams: list[tuple[int, int]]) -> int:
    """The most digits of any stream: the log's precision."""
    return max((digits for digits, _ in streams), default=0)


def _most(printed: list[Printed]) -> tuple[int, int]:
    values = np.array([p.value for p in printed], dtype=np.float64)
    return _stream(max((p.digits for p in printed), default=0), [values])


@dataclass
class Block:
    """One array printed after a step: its label ('' if none) and its values."""

    label: str
    array: PrintedArray
    line: int
    dtype: str | None = None  # a 16-bit type the print names (`half_dtype`), else None


@dataclass
class ParsedLog:
    """What one pass over a log found; `blocks[m]` are the arrays printed after step `m`."""

    path: Path
    losses: list[Printed] = field(default_factory=list)
    bracketed: list[bool] = field(default_factory=list)
    lrs: list[Printed | None] = field(default_factory=list)  # printed beside each loss, if any
    norms: list[Printed | None] = field(default_factory=list)  # a gradient norm beside it
    sizes: list[int | None] = field(default_factory=list)  # the count its loss is a mean over
    step_lines: list[int] = field(default_factory=list)
    first_index: int = 0
    blocks: list[list[Block]] = field(default_factory=list)
    means: list[Printed] = field(default_factory=list)
    mean_bracketed: list[bool] = field(default_factory=list)
    loss_dtypes: list[str | None] = field(default_factory=list)  # `half_dtype` of each loss
    unprinted: list[bool] = field(default_factory=list)  # no loss printed (a skipped iteration)
    skips: list[int | None] = field(default_factory=list)  # each line's skip count (`skips`)
    scales: list[float | None] = field(default_factory=list)  # each line's loss scale
    mean_dtypes: list[str | None] = field(default_factory=list)
    noise: int = 0
    noise_shown: list[tuple[int, str]] = field(default_factory=list)
    unattached: int = 0  # arrays printed before the first step line
    epoch: int | None = None  # the epoch the last step line named, if it named one
    header_epoch: int | None = None  # the epoch the last line of its own announced (`Epoch 2/10`)
    epoch_start: int = 0  # steps before the current epoch, when its step count restarted
    epoch_starts: list[int] = field(default_factory=list)  # first loss of each later epoch
    steps: int = 0  # distinct steps read (a step printed at each of its micro-steps counts once)
    repeats: int = 0  # lines the last step was printed on
    printed_times: int | None = None  # lines each step before it was printed on
    rank: str | None = None  # the process a launcher tagged the step lines with
    stride: int = 1  # what a counter advances by a step (`[64/60000]`: samples)
    counter_total: int | None = None  # the total a striding counter counts to (`[20/600]`: 600)
    notes: list[str] = field(default_factory=list)  # how the log was read, where it says
    verbatim: bool = True  # every step printed again is a copy of its first line, to the byte
    written_by: str | None = None  # a writer its form names (records.LIGHTNING_CSV), if any
    running_mean: str | None = None  # what says its form prints an epoch's running mean

    @property
    def precision(self) -> int:
        """Digits numpy was told to print (its `precision` option), as far as the log shows it:
        the most digits any printed array holds. A value is known to within 10**-precision
        (times its exponent's power of ten in scientific notation)."""
        return _log_digits(self._streams())

    def _streams(self) -> list[tuple[int, int]]:
        """The most digits and the count of distinct rounded numbers (`_stream`) of each bracketed
        stream: the losses, the window means, and the arrays printed at each place after a step
        (a stream without numbers has 0 digits)."""
        streams = [
            _most([p for p, b in zip(self.losses, self.bracketed, strict=True) if b]),
            _most([p for p, b in zip(self.means, self.mean_bracketed, strict=True) if b]),
        ]
        places = max((len(blocks) for blocks in self.blocks), default=0)
        for place in range(places):
            arrays = [blocks[place].array for blocks in self.blocks if len(blocks) > place]
            most = max(int(a.digits.max()) for a in arrays)
            streams.append(_stream(most, [a.values.ravel() for a in arrays]))
        return streams

    def precisions(self) -> tuple[int, int, list[int]]:
        """The precision of the losses, of the window means and of the arrays at each place
        after a step: each stream's own most digits (two printers in one log, numpy's at 4 digits
        for the loss and Paddle's at 8 for the weights, each print at their own), or the log's
        where a stream holds too few numbers to show its printer's (`STREAM_NUMBERS`)."""
        streams = self._streams()  # once: each counts distinct values over its arrays
        whole = _log_digits(streams)
        own = [digits if count >= STREAM_NUMBERS else whole for digits, count in streams]
        return own[0], own[1], own[2:]

    def drop_last(self, count: int) -> None:
        """Forget the last `count` step lines read (summaries taken for steps, `parse`)."""
        for lines in (
            *(self.losses, self.bracketed, self.lrs, self.norms, self.sizes, self.step_lines),
            *(self.blocks, self.loss_dtypes, self.unprinted, self.skips, self.scales),
        ):
            del lines[-count:]

    def join_last(self, count: int, keep: int) -> None:
        """Fold the last `count` step lines (one step, each printed by another printer) into
        one: line `keep` of them (0-based), its fields that are missing taken from the others,
        the arrays printed after each kept in order."""
        group = slice(len(self.losses) - count, None)
        for fields in (self.lrs, self.norms, self.sizes, self.skips, self.scales):
            values = fields[group]
            found = next((v for v in values if v is not None), None)
            fields[group] = [values[keep] if values[keep] is not None else found]
        kept = (self.losses, self.bracketed, self.step_lines, self.loss_dtypes, self.unprinted)
        for fields in kept:
            fields[group] = [fields[group][keep]]
        self.blocks[group] = [[block for blocks in self.blocks[group] for block in blocks]]

    def add_noise(self, line: int, text: str) -> None:
        self.noise += 1
        if len(self.noise_shown) < SHOWN_NOISE:
            self.noise_shown.append((line, cut(text, 60)))
