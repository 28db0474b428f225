"""A printed 1-D or 2-D numpy array, read token by token over the lines it spans. Numpy-only."""

from __future__ import annotations

from dataclasses import dataclass
from operator import attrgetter

import numpy as np

from .grammar import MAX_DIMS, ArrayLine, Printed, number, tokens

_FIELDS = attrgetter("value", "digits", "exponent")
_TABLE = np.dtype([("value", np.float64), ("digits", np.int64), ("exponent", np.int64)])


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

    def feed(self, line: str | ArrayLine) -> None:
        """Take a line's text, or its tokens and numbers (`grammar.array_line`)."""
        if isinstance(line, str):
            parts = tokens(line)
            values = list(map(number, parts))
            marks = [at for at, value in enumerate(values) if value is None]
        else:
            parts, values, marks = line
        end = len(parts)
        start = 0
        for at in [*marks, end]:
            if at > start:
                self._numbers(parts, values, start, at)
            if at < end:
                self._mark(parts[at])
            start = at + 1

    def _numbers(self, parts: list[str], values: list, start: int, stop: int) -> None:
        """Take the numbers `values[start:stop]`, printed between two brackets."""
        if self.done:
            raise ValueError(f"text after the end of the printed array: {parts[start]!r}")
        if self.depth == 2:
            self.rows[-1].extend(values[start:stop])
        elif self.depth == 1 and not self.rows:
            self.flat.extend(values[start:stop])
        else:
            raise ValueError(f"number {parts[start]!r} outside the array's rows")

    def _mark(self, token: str) -> None:
        if self.done:
            raise ValueError(f"text after the end of the printed array: {token!r}")
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
            raise ValueError(f"cannot read {token!r} as a number")

    def result(self) -> PrintedArray:
        grid = self.rows if self.dims == 2 else [self.flat]
        if not grid or len({len(row) for row in grid}) != 1 or not grid[0]:
            raise ValueError("printed array is empty or has ragged rows")
        cells = [cell for row in grid for cell in row]
        shape = (len(grid), len(grid[0])) if self.dims == 2 else (len(cells),)

        table = np.fromiter(map(_FIELDS, cells), dtype=_TABLE, count=len(cells))
        return PrintedArray(
            table["value"].reshape(shape),
            table["digits"].reshape(shape),
            table["exponent"].reshape(shape),
            any(c.scientific for c in cells),
        )
