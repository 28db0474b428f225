"""Unit sums: what a sketch-mode run keeps of a gradient's rows and columns, so that the judge
can tell a kink (one unit's row or column holding an update's error) from a bug (docs/FORMAT.md,
"Sketches").

For a tensor of shape (R, C, ...) of n elements, flattened row-major with the sketch's own
signs σ (runs/sketches.py), M = n / R elements a row and m = M / C a column's share of one:

    rows[i, t]    = Σ_{k < M, k mod G = t} σ(i·M + k)·x[i·M + k]
    columns[j, t] = Σ_{i mod G = t} Σ_{k < m} σ(i·M + j·m + k)·x[i, j, k]

with G = `GROUPS` groups per unit. Like the sketch they subtract across runs (the same signs),
and Σ_t (rows_a − rows_b)[i, t]² estimates row i's error energy ||a_i − b_i||² without bias (a
count sketch of width G per row): an error spread over the rows cannot gather in a few of them,
and one a single row holds shows there (its estimate is its energy times a chi-square of G
degrees of freedom over G, not of one: with G = 8 a row holding 90% of the energy is seen
holding the 75% the judge asks of an estimate in 95% of draws, judge/kink_shape.py; with one
group per row and a 90% rule, a row holding 99% went unseen in 79 of 300 simulated draws).
Summed in float64; the products σ·x are exact.
"""

from __future__ import annotations

import numpy as np

from .sketches import flips

GROUPS = 8  # groups per row and per column: the estimate's degrees of freedom
BLOCK = 1 << 18  # elements per block (whole rows): a 2 MiB float64 buffer


def has_units(shape: tuple[int, ...]) -> bool:
    """Whether a tensor of this shape has rows and columns (two axes or more, none empty)."""
    return len(shape) >= 2 and all(s > 0 for s in shape)


def unit_sums(values: np.ndarray, shape: tuple[int, ...]) -> tuple[np.ndarray, np.ndarray]:
    """The tensor's row sums [R, G] and column sums [C, G] (module docstring), in blocks of
    whole rows of about `BLOCK` elements, each signed into a reused float64 buffer that stays in
    cache (`np.einsum` sums the groups: 4x as fast as `sum` over the middle axis here)."""
    rows_n, columns_n = int(shape[0]), int(shape[1])
    x = np.asarray(values).reshape(rows_n, -1)
    if x.dtype not in (np.float32, np.float64):
        x = x.astype(np.float64)
    per_row = x.shape[1]
    inner = per_row // columns_n
    flip = flips(x.size)
    rows = np.zeros((rows_n, GROUPS))
    columns = np.zeros((GROUPS, columns_n))
    grouped = per_row - per_row % GROUPS
    step = max(1, BLOCK // per_row)
    buffer = np.empty((min(step, rows_n), per_row))
    for first in range(0, rows_n, step):
        part = x[first : first + step]
        signed = buffer[: part.shape[0]]
        np.multiply(part, flip(first * per_row, part.size).reshape(part.shape), out=signed)
        held = rows[first : first + part.shape[0]]
        held += np.einsum("ijk->ik", signed[:, :grouped].reshape(part.shape[0], -1, GROUPS))
        held[:, : per_row - grouped] += signed[:, grouped:]
        by_column = np.einsum("ijk->ij", signed.reshape(part.shape[0], columns_n, inner))
        for t in range(GROUPS):
            columns[t] += by_column[(t - first) % GROUPS :: GROUPS].sum(0)
    return rows, np.ascontiguousarray(columns.T)


def unit_energies(rows: np.ndarray, columns: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Estimated error energy per row and per column from differences of unit sums."""
    return np.square(rows).sum(axis=1), np.square(columns).sum(axis=1)
