"""What a golden file keeps of a tensor instead of the tensor: its norm, how far training moved it
(the norm of its change since the initial weights), and a sketch, its projections onto
`SKETCH_SIZE` fixed orthonormal directions.

The directions are the same on every machine: element i (row-major, flattened) belongs to
direction i mod d with the sign of bit 63 of splitmix64(i), and each direction is scaled to unit
length. Because they are orthonormal, ||sketch(a) - sketch(b)|| <= ||a - b||, as are
|norm(a) - norm(b)| and |moved(a) - moved(b)| (same start): each is a lower bound on the error
between two tensors, computed from their summaries alone. See docs/FORMAT.md, "Golden files".
"""

from __future__ import annotations

import math

import numpy as np

SKETCH_SIZE = 8
_CHUNK = 1 << 22
_M1, _M2 = np.uint64(0xBF58476D1CE4E5B9), np.uint64(0x94D049BB133111EB)


def _signs(first: int, count: int) -> np.ndarray:
    """+1 or -1 for elements first..first+count-1: bit 63 of splitmix64(i)."""
    z = np.arange(first, first + count, dtype=np.uint64) + np.uint64(0x9E3779B97F4A7C15)
    z = (z ^ (z >> np.uint64(30))) * _M1
    z = (z ^ (z >> np.uint64(27))) * _M2
    z = z ^ (z >> np.uint64(31))
    return 1.0 - 2.0 * (z >> np.uint64(63)).astype(np.float64)


def sketch(values: np.ndarray, size: int = SKETCH_SIZE) -> np.ndarray:
    """The projections of a tensor onto min(size, n) orthonormal directions, in float64."""
    x = np.asarray(values, dtype=np.float64).ravel()
    d = min(size, x.size)
    if d == 0:
        return np.zeros(0)
    sums = np.zeros(d)
    for first in range(0, x.size, _CHUNK):
        part = x[first : first + _CHUNK]
        blocks = np.arange(first, first + part.size) % d
        sums += np.bincount(blocks, weights=_signs(first, part.size) * part, minlength=d)
    counts = np.full(d, x.size // d) + (np.arange(d) < x.size % d)
    return sums / np.sqrt(counts)


def norm(values: np.ndarray) -> float:
    """||values|| in float64, summed on this thread in a fixed order: a golden file's bytes do
    not depend on how many threads the BLAS splits a dot over (np.linalg.norm's did)."""
    from .sketches import dot  # which reads this module's signs

    x = np.ascontiguousarray(values, dtype=np.float64).ravel()
    return math.sqrt(dot(x, x))


def summary(values: np.ndarray, start: np.ndarray | None = None) -> dict[str, float | list]:
    """A tensor's summary: norm, sketch and (with its initial value) the distance moved."""
    x = np.asarray(values, dtype=np.float64)
    found: dict[str, float | list] = {"norm": norm(x)}
    if start is not None:
        found["moved"] = norm(x.ravel() - np.asarray(start, dtype=np.float64).ravel())
    found["sketch"] = [float(v) for v in sketch(x)]
    return found


def lower_bound(a: dict, b: dict) -> float:
    """A lower bound on ||a - b|| from two summaries (of the same tensor, same start)."""
    values = [abs(a["norm"] - b["norm"])]
    if "moved" in a and "moved" in b:
        values.append(abs(a["moved"] - b["moved"]))
    gap = np.asarray(a["sketch"], dtype=np.float64) - np.asarray(b["sketch"], dtype=np.float64)
    values.append(norm(gap))
    bound = max(values)
    return bound if math.isfinite(bound) else math.inf
