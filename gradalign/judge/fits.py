"""Sums of products of two runs' tensors, and least-squares fits of a difference between runs
over a whole model, read a slice at a time (runs/store.py `slices`): a fit over every
parameter of a model of any size holds a few slices of float64 at once, not the model widened
(at `1863033` a 10M-parameter MLP without zero_grad() took 514 MiB to name, its gradients
concatenated three times, and a 54M-parameter one 2.2 GiB: `bench/failing_memory.py`).

A `Columns` is a pass over the model: for each tensor, slice by slice, the fit's columns in
float64, the difference first and its bases after. One pass sums their Gram matrix; a fit's
residual is summed on a second, from the coefficients, so its share stays exact where the fit
explains nearly all (not 1 − cos² read from the Gram matrix). The Gram matrix alone serves any
sum of products read so: a distance between runs, a slope along their step."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass

import numpy as np

from ..runs.model import Tensors
from ..runs.store import slices

Columns = Callable[[], Iterator[tuple[np.ndarray, ...]]]


def columns(
    sets: Sequence[Tensors],
    names: Iterable[str],
    make: Callable[..., tuple[np.ndarray, ...]],
    widen: bool = True,
) -> Columns:
    """Passes over tensors `names` of each of `sets`, slice by slice: `make` of the sets'
    float64 slices (the difference first, then the bases); `widen` False: of the slices as
    stored, `make` returning float64 columns."""
    names = list(names)

    def one_pass() -> Iterator[tuple[np.ndarray, ...]]:
        for name in names:
            for parts in zip(*(slices(t, name) for t in sets), strict=True):
                yield make(*(np.asarray(p, np.float64) if widen else p for p in parts))

    return one_pass


def distance(first: Tensors, second: Tensors | None, names: Iterable[str]) -> float:
    """||first − second|| over tensors `names` (second None: ||first||), in float64."""
    if second is None:
        return math.sqrt(gram(columns((first,), names, lambda a: (a,)), 1)[0, 0])
    return math.sqrt(gram(columns((first, second), names, lambda a, b: (a - b,)), 1)[0, 0])


def gram(source: Columns, width: int) -> np.ndarray:
    """The `width` x `width` Gram matrix of the columns over one pass (zeros where none)."""
    total = np.zeros((width, width))
    for cols in source():
        stacked = np.stack(cols)
        total += stacked @ stacked.T
    return total


def fit(source: Columns, g: np.ndarray, basis: tuple[int, ...]) -> tuple[np.ndarray, float]:
    """The least-squares coefficients of column 0 on the columns `basis` (`g`: the Gram
    matrix), and the residual's energy; zeros and column 0's own energy where it is zero, a
    basis column is, or two of them lie along one line."""
    dd = float(g[0, 0])
    sub = g[np.ix_(basis, basis)]
    none = np.zeros(len(basis)), max(dd, 0.0)
    if dd <= 0 or any(sub[i, i] <= 0 for i in range(len(basis))):
        return none
    if len(basis) > 1 and abs(np.linalg.det(sub)) <= 1e-12 * np.prod(np.diag(sub)):
        return none
    a = np.linalg.solve(sub, g[0, list(basis)])
    return a, residual(source, a, basis)


def explained(dd: float, rest: float) -> float:
    """The share of a difference of energy `dd` a fit leaving `rest` explains: 1 − the
    residual's norm over the difference's (0 where the difference is zero)."""
    return 1.0 - math.sqrt(rest / dd) if dd > 0 else 0.0


@dataclass(frozen=True)
class TensorFit:
    """One tensor's fit on one basis column: its coefficient, its residual's energy, and the
    Gram matrix of its columns."""

    a: float
    rest: float
    gram: np.ndarray


def tensor_fits(sources: Iterable[tuple[str, Columns]], width: int) -> dict[str, TensorFit]:
    """Each tensor's own fit of its column 0 on its column 1 (`sources`: a tensor's name and
    its passes, columns `width` wide)."""
    found = {}
    for name, source in sources:
        g = gram(source, width)
        a, rest = fit(source, g, (1,))
        found[name] = TensorFit(float(a[0]), rest, g)
    return found


def per_tensor_share(fits: dict[str, TensorFit]) -> float:
    """The share of all the tensors' differences together that each one's own multiple of its
    basis explains."""
    return explained(sum(f.gram[0, 0] for f in fits.values()), sum(f.rest for f in fits.values()))


def residual(source: Columns, a: np.ndarray, basis: tuple[int, ...]) -> float:
    """Σ (column 0 − Σ a_i column_basis[i])² over one pass."""
    total = 0.0
    for cols in source():
        left = cols[0].copy()
        for coefficient, i in zip(a, basis, strict=True):
            left -= coefficient * cols[i]
        total += float(np.dot(left, left))
    return total
