"""Grid sums: what a sketch-mode run keeps of a gradient so that the judge can read its error's
rank (docs/FORMAT.md, "Sketches"), where unit sums (runs/unit_sums.py) keep each row's and
column's energy and no rank.

A tensor of shape (R, ...) of n elements is read as a matrix X of R rows and C = n / R columns
(its trailing axes flattened, row-major), and kept as a P x Q grid, P = min(R, GRID) and
Q = min(C, GRID):

    grid[a, b] = Σ_{i mod P = a} Σ_{j mod Q = b} ρ(i)·γ(j)·X[i, j]

with ρ(i) = σ(ROWS + i) and γ(j) = σ(COLUMNS + j), σ the sketch's splitmix64 sign
(runs/sketches.py). That is grid = A X Bᵀ, A (P x R) and B (Q x C) each with one ±1 in every
column, so:

- a rank-one X = u vᵀ gives the rank-one grid (A u)(B v)ᵀ: one input's share of a weight's
  gradient (δ xᵀ, a token routed to another expert) stays one outer product, where an error
  spread over many ranks fills the grid (its first component about (√P + √Q)² / PQ of it, 12%
  at 32 x 32);
- two runs' grids subtract (the same signs): grid(a) − grid(b) = grid(a − b), and its squared
  norm estimates ||a − b||² without bias (each bucket a count sketch whose row and column signs
  are independent);
- two tensors of as many columns share B: the same input's share in two weights (δ₁ xᵀ, δ₂ xᵀ)
  gives grids along one right vector B x; and a bias's error δ, hashed by A (a tensor of shape
  (R, 1)), lies along its weight's left vector A δ.

Summed in float64; the products are exact.

A gradient of three axes or more (E, R, ...), as transformers' mixtures of experts fuse their
experts (experts first), also keeps one grid per slab of its first axis (`slab_grids`: E x P x
Q, each slab read as R rows and its trailing axes as columns, with the same signs as any grid):
a token routed from one expert to another is one outer product in each of two slabs, which the
tensor's one grid reads as rank two.
"""

from __future__ import annotations

import math

import numpy as np

from .summaries import _signs

GRID = 32  # rows and columns of a grid at most: 8 KiB of float64 a gradient
ROWS, COLUMNS = 1 << 40, 1 << 41  # where the row and column signs start in σ's sequence
BLOCK = 1 << 18  # elements per block (whole rows): a 2 MiB float64 buffer


def grid_shape(shape: tuple[int, ...]) -> tuple[int, int]:
    """The grid's (P, Q) for a tensor of this shape (two axes or more, none empty)."""
    rows = int(shape[0])
    columns = math.prod(shape) // rows
    return min(rows, GRID), min(columns, GRID)


def row_signs(count: int) -> np.ndarray:
    """ρ(0..count−1) as float64 ±1."""
    return _signs(ROWS, count)


def column_signs(count: int) -> np.ndarray:
    """γ(0..count−1) as float64 ±1."""
    return _signs(COLUMNS, count)


def grid_sums(values: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
    """The tensor's grid [P, Q] (module docstring), in blocks of whole rows of about `BLOCK`
    elements, each signed into a reused float64 buffer (`np.einsum` sums the column groups)."""
    rows_n = int(shape[0])
    x = np.asarray(values).reshape(rows_n, -1)
    if x.dtype not in (np.float32, np.float64):
        x = x.astype(np.float64)
    columns_n = x.shape[1]
    p, q = grid_shape((rows_n, columns_n))
    flip_columns, flip_rows = column_signs(columns_n), row_signs(rows_n)
    grid = np.zeros((p, q))
    grouped = columns_n - columns_n % q
    step = max(1, BLOCK // columns_n)  # whole rows
    buffer = np.empty((min(step, rows_n), columns_n))
    for first in range(0, rows_n, step):
        part = x[first : first + step]
        count = part.shape[0]
        signed = buffer[:count]
        np.multiply(part, flip_columns, out=signed)
        folded = np.einsum("ijk->ik", signed[:, :grouped].reshape(count, -1, q))
        folded[:, : columns_n - grouped] += signed[:, grouped:]
        folded *= flip_rows[first : first + count, None]
        # row first + r goes to bucket (first + r) mod P: the block laid from its bucket on
        shift = first % p
        laid = np.zeros((-(-(shift + count) // p) * p, q))
        laid[shift : shift + count] = folded
        grid += laid.reshape(-1, p, q).sum(axis=0)
    return grid


def hashed_rows(vector: np.ndarray) -> np.ndarray:
    """A vector of R elements (a bias's error) hashed as the grid hashes a weight's R rows:
    A v, P values (up to one sign)."""
    v = np.asarray(vector, dtype=np.float64).reshape(-1)
    return grid_sums(v.reshape(-1, 1), (v.size, 1))[:, 0]


def hashed_ones(shape: tuple[int, ...]) -> tuple[np.ndarray, np.ndarray]:
    """The all-ones row and column of a tensor of this shape as its grid holds them: A 1 and
    B 1 (up to one sign each)."""
    rows = int(shape[0])
    columns = math.prod(shape) // rows
    return hashed_rows(np.ones(rows)), grid_sums(np.ones((1, columns)), (1, columns))[0]


SLAB_CELLS = 1 << 16  # slab grids' cells a tensor keeps at most: 64 experts' 32 x 32 (512 KiB)


def has_slabs(shape: tuple[int, ...]) -> bool:
    """Whether a tensor of this shape keeps slab grids: three axes or more, none empty, and
    their cells at most SLAB_CELLS (a mixture of up to 64 experts at full grids; a convolution
    of many output channels keeps the one grid alone, its slabs no experts)."""
    if len(shape) < 3 or math.prod(shape) == 0:
        return False
    return math.prod(slab_grid_shape(shape)) <= SLAB_CELLS


def slab_grid_shape(shape: tuple[int, ...]) -> tuple[int, int, int]:
    """The slab grids' (E, P, Q) for a tensor of this shape (`has_slabs`)."""
    return (int(shape[0]), *grid_shape(tuple(shape[1:])))


def slab_grids(values: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
    """Each slab's grid (`grid_sums` of values[e] read as shape[1] rows), [E, P, Q]: slabs
    batched in blocks of about `BLOCK` elements, a slab larger than a block by `grid_sums`."""
    slabs, rows_n = int(shape[0]), int(shape[1])
    x = np.asarray(values).reshape(slabs, rows_n, -1)
    columns_n = x.shape[2]
    found = np.empty(slab_grid_shape(shape))
    if rows_n * columns_n > BLOCK:
        for e in range(slabs):
            found[e] = grid_sums(x[e], tuple(shape[1:]))
        return found
    p, q = grid_shape((rows_n, columns_n))
    flip_columns, flip_rows = column_signs(columns_n), row_signs(rows_n)
    grouped, padded = columns_n - columns_n % q, -(-rows_n // p) * p
    step = max(1, BLOCK // (rows_n * columns_n))  # whole slabs
    for first in range(0, slabs, step):
        signed = x[first : first + step] * flip_columns  # float64
        count = signed.shape[0]
        folded = signed[..., :grouped].reshape(count, rows_n, -1, q).sum(axis=2)
        folded[..., : columns_n - grouped] += signed[..., grouped:]
        folded *= flip_rows[:, None]
        laid = np.zeros((count, padded, q))  # row r goes to bucket r mod P
        laid[:, :rows_n] = folded
        found[first : first + count] = laid.reshape(count, -1, p, q).sum(axis=1)
    return found


def slab_ones(shape: tuple[int, ...]) -> tuple[np.ndarray, np.ndarray]:
    """The all-ones row and column of a tensor of this shape as its slab grids hold them, the
    grids flattened per slab ([E, P·Q]): the slabs' ones as they are, and each slab's A 1 B 1ᵀ."""
    rows, columns = hashed_ones(tuple(shape[1:]))
    return np.ones(int(shape[0])), np.outer(rows, columns).reshape(-1)
