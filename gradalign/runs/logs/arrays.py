"""A printed 1-D or 2-D numpy array, read token by token over the lines it spans. Numpy-only."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .grammar import MAX_DIMS, Printed, number, tokens


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
