"""Sketches: what a run recorded with `--record sketch` keeps of a tensor at every update instead
of the tensor (docs/FORMAT.md, "Sketches").

A tensor x of n elements (flattened, row-major) is kept as its exact squared norm, its
fingerprint and a count sketch of width d: element i goes to bucket i mod d with sign
σ(i) = 1 − 2·(splitmix64(i) >> 63), s_j = Σ_{i mod d = j} σ(i)·x_i, summed in float64. A tensor
of at most d elements is kept whole (s = x), and so is a 1-D tensor of at most `WHOLE_1D`
elements (a bias, a norm's scale) in runs whose manifest says so. The same signs serve every
run, so sketches subtract: S(a) − S(b) = S(a − b), and ||S(v)||² estimates ||v||² without bias
(each bucket's cross terms cancel in expectation). Its spread is measured from the sketch
itself: each bucket's square has variance at most 2·E[s_j²]², so ||S(v)||² is within `Z`
standard deviations of sqrt(2·Σ s_j⁴) of ||v||², and an error that fills few buckets widens its
own bound.

An infinity in a sketched tensor (an attention mask's -inf in a buffer wider than the sketch)
would make every bucket it falls in inf or NaN, and no two runs comparable. Such elements are
left out of the sketch and the norm and kept apart, as `held`: the count sketch of their codes
(1 for +inf, 2 for -inf) with the same signs, equal in two runs exactly where the same elements
hold the same infinities (to the sketch's collisions). A NaN stays in the sketch: it never
passes.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from .digests import bitsum, wrap
from .summaries import _signs

WIDTH = 1021  # buckets per tensor: prime, so rows and columns of a matrix spread over them
# a 1-D tensor of at most this many elements is kept whole too: biases and norms' scales, whose
# elements the judge reads one by one (a fused attention bias's key part is rounding noise)
WHOLE_1D = 1 << 16
Z = 4.0  # standard deviations the estimate's bound allows
BLOCK = 1 << 20  # elements per block (a multiple of the width is taken): stays in cache
_BLOCK_ELEMENTS = 1 << 16  # elements per float64 block of `summarize` (512 KiB)
_BITS_BYTES = 1 << 28  # sign tables, one bit per element, cached per tensor size up to this
_bits: dict[int, np.ndarray] = {}


@dataclass(frozen=True)
class Summary:
    """One tensor at one update, as a sketch-mode run keeps it."""

    sketch: np.ndarray  # float64 [min(n, width)]
    sumsq: float  # ||x||², float64 (of the finite elements where `held` is kept)
    fingerprint: int
    held: np.ndarray | None = None  # a sketched tensor's infinities, float64 [width]; None: none
    # a sketched gradient's row and column sums (runs/unit_sums.py); None: not kept
    units: tuple[np.ndarray, np.ndarray] | None = None
    grid: np.ndarray | None = None  # and its grid sums (runs/grid_sums.py); None: not kept
    slabs: np.ndarray | None = None  # and, of three axes or more, each slab's [E, P, Q]


def kept_whole(shape: tuple[int, ...], width: int, whole_1d: int = 0) -> bool:
    """Whether a tensor of this shape is kept whole: at most `width` elements, or 1-D with at
    most `whole_1d` (the manifest's `sketch.whole_1d`; 0 in runs recorded before it)."""
    n = math.prod(shape)
    return n <= width or (len(shape) <= 1 and n <= whole_1d)


def flips(n: int) -> Callable[[int, int], np.ndarray]:
    """For a tensor of n elements, σ(first..first+count−1) as float32 ±1 (exact in any float
    dtype), unpacked from a table of one bit per element cached per size (1/32 the memory of a
    float32 table, and as fast to within 6% here: docs/PERFORMANCE.md); past `_BITS_BYTES` of
    tables, made for each block (bounded memory, about 3x slower)."""
    bits = _bits.get(n)
    if bits is None and sum(b.nbytes for b in _bits.values()) + (n + 7) // 8 <= _BITS_BYTES:
        bits = np.empty((n + 7) // 8, np.uint8)
        for first in range(0, n, BLOCK):  # BLOCK is a multiple of 8: the bytes line up
            negative = _signs(first, min(BLOCK, n - first)) < 0
            bits[first // 8 : (first + negative.size + 7) // 8] = np.packbits(
                negative, bitorder="little"
            )
        _bits[n] = bits
    if bits is None:
        return lambda first, count: _signs(first, count).astype(np.float32)
    table = bits

    def unpacked(first: int, count: int) -> np.ndarray:
        low = first // 8
        found = np.unpackbits(table[low : (first + count + 7) // 8], bitorder="little")
        return 1.0 - 2.0 * found[first - 8 * low : first - 8 * low + count].astype(np.float32)

    return unpacked


def summarize(
    values: np.ndarray, declared: str | None = None, width: int = WIDTH, whole: bool | None = None
) -> Summary:
    """A tensor's sketch, squared norm and fingerprint (`declared`: its manifest dtype; `whole`:
    kept whole, by default where it has at most `width` elements: `kept_whole`)."""
    x = np.asarray(values).reshape(-1)
    n = x.size
    whole = n <= width if whole is None else whole
    # float32 and float64 are fingerprinted block by block below, from the cache
    blockwise = not whole and x.dtype.kind == "f" and x.dtype.itemsize >= 4
    fingerprint = 0 if blockwise else bitsum(x, declared)
    if not blockwise:
        x = x.astype(np.float64)
        if whole:
            return Summary(x, dot(x, x), fingerprint)
    flip = flips(n)
    rows = n // width
    grid = x[: rows * width].reshape(rows, width)
    sums = np.zeros(width)
    sumsq, held, infinite = 0.0, np.zeros(width), 0
    step = max(1, _BLOCK_ELEMENTS // width)  # rows per block: the float64 block stays in cache
    block = np.empty((min(step, rows), width))
    for first in range(0, rows, step):
        part = block[: min(step, rows - first)]
        rows_now = grid[first : first + step]
        if blockwise:
            fingerprint += bitsum(rows_now, declared)
        signs = flip(first * width, part.size).reshape(part.shape)
        np.multiply(rows_now, signs, out=part)
        squares, found = _finite_part(part, rows_now, signs, held)
        sumsq, infinite = sumsq + squares, infinite + found
        sums += part.sum(axis=0)
    if blockwise:
        fingerprint += bitsum(x[rows * width :], declared)
    rest = x[rows * width :]
    signs = flip(rows * width, n - rows * width)
    tail = rest.astype(np.float64) * signs
    squares, found = _finite_part(tail, rest, signs, held[: tail.size])
    sums[: tail.size] += tail
    return Summary(sums, sumsq + squares, wrap(fingerprint), held if infinite + found else None)


def _finite_part(
    part: np.ndarray, x: np.ndarray, signs: np.ndarray, held: np.ndarray
) -> tuple[float, int]:
    """||part||² and the count of x's infinities, where `part` (x·σ in float64, rows of
    `held`'s width or one row of at most it) is first cleared of them in place and their codes'
    signed sums added to `held` bucket by bucket. The squared norm is computed anyway; an
    infinity or a NaN shows in it, so a finite block costs nothing more."""
    flat = part.reshape(-1)
    total = dot(flat, flat)
    if math.isfinite(total):
        return total, 0
    infinite = np.isinf(part)
    count = int(np.count_nonzero(infinite))
    if not count:
        return total, 0  # a NaN: kept, it never passes
    codes = np.where(np.asarray(x, dtype=np.float64) > 0, 1.0, 2.0) * infinite * signs
    held += codes.reshape(-1, held.size).sum(axis=0) if codes.ndim > 1 else codes
    part[infinite] = 0.0
    return dot(flat, flat), count


_ROW = 8192  # elements per row of `dot`
_VECDOT = getattr(np, "vecdot", None)  # numpy >= 2.0


def dot(a: np.ndarray, b: np.ndarray) -> float:
    """a·b for 1-d float64 arrays of one size, on this thread: `np.vecdot` over rows of 8192
    elements, each too short for a threaded BLAS to split (OpenBLAS splits a dot above 10,000
    elements; on a busy machine such a split ran 70x slower, docs/PERFORMANCE.md), about 4x as
    fast as `np.einsum` on 16K elements; the tail too, one row shorter than the others (2x as
    fast as `np.einsum` on a small tensor's 64 elements: 1.9 against 4.0 µs a call). numpy
    before 2.0 takes `np.einsum`."""
    n = a.size
    whole = n - n % _ROW if _VECDOT is not None else 0
    total = 0.0
    with np.errstate(over="ignore", invalid="ignore"):  # a diverged run's inf is the answer
        if whole:
            rows = _VECDOT(a[:whole].reshape(-1, _ROW), b[:whole].reshape(-1, _ROW))
            total = float(np.add.reduce(rows))
        if whole < n:
            tail = (a[whole:], b[whole:])
            total += float(_VECDOT(*tail) if _VECDOT is not None else np.einsum("i,i->", *tail))
    return total


def sketch(values: np.ndarray, width: int = WIDTH) -> np.ndarray:
    return summarize(values, None, width).sketch


@dataclass(frozen=True)
class Estimate:
    """||v|| estimated from S(v): the value and the bounds it holds within."""

    value: float
    low: float
    high: float

    @property
    def exact(self) -> bool:
        return self.low == self.value == self.high


def estimate(delta: np.ndarray, exact: bool, n: int | None = None) -> Estimate:
    """||v|| from S(v) = `delta` (`exact`: the sketch is the tensor itself; `n`: v's elements).

    Besides the statistical bounds, ||v|| ≥ ||S(v)|| / √⌈n/d⌉ always (Cauchy–Schwarz: a bucket
    of m elements sums to at most √m times their norm). Where the statistical lower bound is 0
    (a narrow sketch, or an error in few buckets) that one still holds: a sketch of width 31
    over 120 elements let a gradient 4 times too large pass as '1x the noise floor'."""
    d = np.asarray(delta, dtype=np.float64)
    if not np.isfinite(d).all():
        return Estimate(math.inf, math.inf, math.inf)
    total = dot(d, d)
    value = math.sqrt(total)
    if exact or total == 0.0:
        return Estimate(value, value, value)
    spread = Z * math.sqrt(2.0 * float(np.sum(d**4)))
    low = math.sqrt(max(total - spread, 0.0))
    if n is not None and d.size:
        low = max(low, value / math.sqrt(-(-n // d.size)))
    return Estimate(value, low, math.sqrt(total + spread))


def inner_bounds(x: np.ndarray, y: np.ndarray) -> tuple[float, float]:
    """Bounds on <u, v> from sketches x = S(u), y = S(v) of two vectors of one size, through
    <u, v> = (||u/a + v/b||² − ||u/a − v/b||²)·ab/4 with a = ||x||, b = ||y|| (any constants
    serve; these keep both sums of one scale) and `estimate`'s bounds on each norm."""
    a, b = math.sqrt(dot(x, x)), math.sqrt(dot(y, y))
    if not (a and b and math.isfinite(a) and math.isfinite(b)):
        return (0.0, 0.0) if math.isfinite(a + b) else (-math.inf, math.inf)
    plus, minus = estimate(x / a + y / b, False), estimate(x / a - y / b, False)
    scale = a * b / 4.0
    return (plus.low**2 - minus.high**2) * scale, (plus.high**2 - minus.low**2) * scale
