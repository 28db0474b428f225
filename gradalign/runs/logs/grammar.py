"""The grammar of a training log, line by line: what is a step, a printed array, a window mean.

    0   [0.29568613]                  a step line: its index and its loss, with or without
    0   2.3205233                     brackets (Paddle 3 prints a 0-d loss bare); `step 0 loss
                                      0.29` and `iter 0: 0.29` read alike
    ------------>[[ 0.00325679 ...    an arrow line: a printed array (1-D or 2-D, numpy style,
     [ 0.01504303 ... -0.02287037        possibly truncated with `...`, fixed or scientific
      ...                                notation, commas allowed); `name -->[...]` names it
    avgloss -------->[0.29568613]     a labelled mean: the window mean the script printed
    [[ 0.1  0.2] [ 0.3  0.4]]         an unlabelled array on its own line, if it parses as one

Everything else (framework messages, warnings, progress bars) is noise. Each number keeps how
it was printed (digits, exponent), so the reader can judge it at its own printed precision.
This module is numpy-only.
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass

import numpy as np

from ...errors import BadInput

_NUMBER = re.compile(
    r"^[-+]?(?:(?P<int>\d+)\.(?P<frac>\d*)|\.(?P<frac2>\d+)|(?P<bare>\d+))"
    r"(?:[eE](?P<exp>[-+]?\d+))?$|^(?P<special>[-+]?(?:nan|inf))$",
    re.IGNORECASE,
)
_STEP = re.compile(
    r"^(?:(?:step|iter|iteration|batch)\s*[:=#]?\s*)?(?P<index>\d+)\s*[,:]?\s+"
    r"(?:loss\s*[:=]?\s*)?(?P<loss>\S.*?)$",
    re.IGNORECASE,
)
_BRACKETED_STEP = re.compile(r"^\d+\s+\[[^\[\]]*\]$")  # `0   [..]`: a step line, whatever is inside
_ARROW = re.compile(r"^(?P<label>.*?)\s*(?:-+|=+)>\s*(?P<rest>.*)$")
_MEAN_LABEL = re.compile(r"^(?:avg|mean|average)[\s_-]*loss$", re.IGNORECASE)
_MEAN_LINE = re.compile(
    r"^(?P<label>(?:avg|mean|average)[\s_-]*loss)\s*(?:-+>|=+>|[:=])?\s*(?P<rest>[-+.\[\d].*)$",
    re.IGNORECASE,
)
_REPR = re.compile(r"\barray\(|,?\s*dtype=[\w.]+\)")  # numpy's repr: array([...], dtype=float32)
_TOKEN = re.compile(r"\[|\]|\.\.\.|[^\s,\[\]]+")
_ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")
MAX_DIMS = 2


@dataclass(frozen=True)
class Printed:
    """One printed number: its value, the digits after its (mantissa's) decimal point, its
    decimal exponent (0 in fixed notation), and whether it was in scientific notation."""

    value: float
    digits: int
    exponent: int
    scientific: bool


@functools.lru_cache(maxsize=1 << 16)  # a log prints the same weights over and over
def number(token: str) -> Printed | None:
    """A printed float (`0.25`, `-7.03e-05`, `1.`, `nan`), or None if `token` is none.

    Integers without a point or exponent are not floats: numpy prints every float with one."""
    match = _NUMBER.match(token)
    if match is None or (match["bare"] is not None and match["exp"] is None):
        return None
    if match["special"]:
        return Printed(float(token), 0, 0, False)
    frac = match["frac"] if match["frac"] is not None else match["frac2"] or ""
    if match["bare"] is not None:
        frac = ""
    exponent = int(match["exp"]) if match["exp"] is not None else 0
    return Printed(float(token), len(frac), exponent, match["exp"] is not None)


def clean(line: str) -> str:
    """A line without terminal colour codes, numpy's `array(..., dtype=...)` wrapper and
    surrounding white space."""
    return _REPR.sub("", _ANSI.sub("", line)).strip()


def tokens(text: str) -> list[str]:
    return _TOKEN.findall(text)


def one_number(text: str) -> Printed | None:
    """A single printed number, bare or in up to two pairs of brackets (`[0.29]`, `[[0.29]]`)."""
    parts = tokens(text)
    opening = 0
    while opening < len(parts) and parts[opening] == "[":
        opening += 1
    closing = len(parts) - opening
    if opening > MAX_DIMS or closing != opening + 1 or parts[opening + 1 :] != ["]"] * opening:
        return None
    return number(parts[opening])


@dataclass(frozen=True)
class StepLine:
    index: int
    loss: Printed
    bracketed: bool


def step_line(text: str) -> StepLine | None:
    """`<index> <loss>`: None if the line is not one. A step-like line that holds several
    numbers (`0   [0.5 0.6]`) is an error: it is a step line the reader cannot read."""
    match = _STEP.match(text)
    if match is None:
        return None
    rest = match["loss"]
    loss = one_number(rest)
    if loss is not None:
        return StepLine(int(match["index"]), loss, rest.startswith("["))
    if _BRACKETED_STEP.match(text):
        raise BadInput(f"expected one loss on a step line, found {rest!r}")
    return None


@dataclass(frozen=True)
class ArrowLine:
    label: str
    rest: str

    @property
    def is_mean(self) -> bool:
        return bool(_MEAN_LABEL.match(self.label))

    @property
    def is_other_loss(self) -> bool:
        return "loss" in self.label.lower() and not self.is_mean


def arrow_line(text: str) -> ArrowLine | None:
    """`[label] --->[...]`, or a window mean (`avgloss -->0.29`, `avg loss: [0.29]`): None if
    the line is neither."""
    mean = _MEAN_LINE.match(text)
    if mean and one_number(mean["rest"]) is not None:
        return ArrowLine(mean["label"], mean["rest"])
    match = _ARROW.match(text)
    if match is None:
        return None
    label, rest = match["label"].strip(), match["rest"]
    if rest.startswith("[") or (_MEAN_LABEL.match(label) and one_number(rest) is not None):
        return ArrowLine(label, rest)
    return None


def is_array_content(text: str) -> bool:
    """Whether a line can continue a printed array: brackets, `...` and floats only."""
    parts = tokens(text)
    return bool(parts) and all(t in ("[", "]", "...") or number(t) for t in parts)


@dataclass
class PrintedArray:
    """A printed 1-D or 2-D array: the values shown (`...` dropped) and how each was printed."""

    values: np.ndarray  # float64
    digits: np.ndarray  # int, digits after the (mantissa's) decimal point
    exponents: np.ndarray  # int, 0 in fixed notation
    scientific: bool


class ArrayReader:
    """Feed the lines of one printed array until `done`; raises ValueError on a malformed one."""

    def __init__(self) -> None:
        self.depth = 0
        self.dims = 0
        self.rows: list[list[Printed]] = []
        self.flat: list[Printed] = []
        self.done = False

    def feed(self, text: str) -> None:
        for token in tokens(text):
            if self.done:
                raise ValueError(f"text after the end of the printed array: {token!r}")
            self._take(token)

    def _take(self, token: str) -> None:
        if token == "[":
            self.depth += 1
            self.dims = max(self.dims, self.depth)
            if self.depth > MAX_DIMS:
                raise ValueError(f"printed array has more than {MAX_DIMS} dimensions")
            if self.depth == 2:
                if self.flat:
                    raise ValueError("printed array mixes numbers and rows")
                self.rows.append([])
        elif token == "]":
            if self.depth == 0:
                raise ValueError("unbalanced ']' in printed array")
            self.depth -= 1
            self.done = self.depth == 0
        elif token != "...":
            value = number(token)
            if value is None:
                raise ValueError(f"cannot read {token!r} as a number")
            if self.depth == 2:
                self.rows[-1].append(value)
            elif self.depth == 1 and not self.rows:
                self.flat.append(value)
            else:
                raise ValueError(f"number {token!r} outside the array's rows")

    def result(self) -> PrintedArray:
        grid = self.rows if self.dims == 2 else [self.flat]
        if not grid or len({len(row) for row in grid}) != 1 or not grid[0]:
            raise ValueError("printed array is empty or has ragged rows")
        cells = [cell for row in grid for cell in row]
        shape = (len(grid), len(grid[0])) if self.dims == 2 else (len(cells),)

        def field(name: str, dtype: type) -> np.ndarray:
            return np.array([getattr(c, name) for c in cells], dtype=dtype).reshape(shape)

        return PrintedArray(
            field("value", np.float64),
            field("digits", np.int64),
            field("exponent", np.int64),
            any(c.scientific for c in cells),
        )
