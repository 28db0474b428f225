"""Error measures between two tensors, in float64, NaN-safe (a non-finite value never passes)."""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

import numpy as np

_F = TypeVar("_F", bound=Callable[..., Any])


def quiet(function: _F) -> _F:
    """Run `function` with numpy's floating-point warnings off: a run that went NaN or Inf is
    judged (a non-finite value never passes, and the report says where), and numpy's
    "invalid value encountered" lines on stderr only hid that verdict. The state is per thread:
    the judge's worker threads need it too."""

    @functools.wraps(function)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        with np.errstate(invalid="ignore", over="ignore", divide="ignore"):
            return function(*args, **kwargs)

    return wrapper  # type: ignore[return-value]


@dataclass(frozen=True)
class TensorDiff:
    """How far the merged tensor is from the baseline tensor, and how far it may be."""

    name: str
    max_abs: float
    max_rel: float
    rel_l2: float  # ||m - b|| / ||b||
    cosine: float
    error: float  # the judged error: ||m - b|| (or max |m - b| for printed values)
    allowed: float  # the error the tolerance allows here
    moved: float | None = None  # ||b - b_start||: how far training moved this tensor so far
    noise: float | None = None  # ||b - ref||: the baseline's own error against a precise rerun
    drift: float | None = None  # what noise-dominated elements may add (judge/drift.py)
    excused: str | None = None  # a failure judged honest noise (an isolated gradient jump)
    sketched: bool = False  # error and noise estimated from sketches (judge/sketched.py)
    rounding: float | None = None  # floor·||ref||: the part of `allowed` that is one rounding
    # ||b|| and the element count, where the diff was computed from the values (not compared:
    # the streamed and the whole-tensor judge sum in another order)
    norm: float | None = dataclasses.field(default=None, compare=False)
    size: int | None = dataclasses.field(default=None, compare=False)
    rounded: bool = False  # a gradient that passes only by the rounding floor (judge/rounding.py)
    # sketched: the part of `allowed` that is the estimator's bound (judge/sketched.py)
    slack: float = dataclasses.field(default=0.0, compare=False)
    # without a reference: the c of a gradient that passes only net of c·Δw, a term
    # proportional to the weights the runs entered with (judge/weight_term.py)
    netted: float = dataclasses.field(default=0.0, compare=False)
    # against a reference: ||m|| and ||ref||, the sizes a parted gradient is judged by
    # (judge/parted_sizes.py)
    sizes: tuple[float, float] | None = dataclasses.field(default=None, compare=False)

    @property
    def ok(self) -> bool:
        # False for NaN, and for an infinite error even where the bound overflowed to inf too
        # (finite values near 1e200 square past float64's range: one run's w against -w passed)
        within = self.error <= self.allowed and self.error < math.inf
        return bool(within) or self.excused is not None

    @property
    def unbounded(self) -> float:
        """What is allowed without a sketch estimator's bound (`slack`): that bound is the
        estimate's uncertainty, not what the runs may differ by."""
        return self.allowed - self.slack

    @property
    def clearly_ok(self) -> bool:
        """Within what is allowed without the estimator's bound: a sketched tensor that passes
        only by that bound is no evidence that it passed (judge/kinks.py `most_pass`)."""
        return self.excused is not None or bool(self.error <= self.unbounded)

    @property
    def ratio(self) -> float:
        """error / allowed: below 1 passes."""
        if self.allowed > 0:
            return self.error / self.allowed
        return 0.0 if self.error == 0 else math.inf


def module_of(name: str) -> str:
    """A tensor's module: its name up to the last dot (a weight and its bias share one)."""
    return name.rpartition(".")[0]


def _safe_div(num: float, den: float) -> float:
    if den > 0:
        return num / den
    return 0.0 if num == 0 else math.inf


def fixed_allowed(
    rtol: float, scale: float, atol: float, size: int, floor: float = 0.0, norm: float = 0.0
) -> float:
    """The fixed tolerance's bound: rtol of a scale (distance moved, or the norm) + atol·√n,
    and for a weight one rounding of its stored values, floor·||b|| (`norm`): a stored value
    is known to one rounding of itself, however little training moved it (one ulp of a weight
    near 1 failed a tensor that had moved 9e-4 at 1.26x)."""
    rounding = floor * norm if floor else 0.0
    return rtol * scale + atol * math.sqrt(size) + rounding


def noise_allowed(factor: float, noise: float, floor: float, ref_norm: float) -> float:
    """The noise floor's bound: factor·||b − ref|| + floor·||ref||."""
    return factor * noise + floor * ref_norm


def agreed_non_finite(b: np.ndarray, start: np.ndarray | None, *others: np.ndarray | None):
    """`b`, `start` and `others` with 0 where `b` is not finite and holds the very infinity it
    started with, as every other array does there, copied (a buffer of -inf, an attention
    mask, is no divergence); as given where any differs, or a NaN or an infinity that training
    produced is among them (those never pass)."""
    bad = ~np.isfinite(b)
    held = b[bad]
    if start is None or start.shape != b.shape or np.isnan(held).any():
        return (b, start, *others)
    for other in (start, *others):
        if other is not None and other.shape == b.shape and not np.array_equal(other[bad], held):
            return (b, start, *others)
    cleared = []
    for x in (b, start, *others):
        if x is not None and x.shape == b.shape:
            x = x.copy()
            x[bad] = 0.0
        cleared.append(x)
    return tuple(cleared)


def diff(
    name: str,
    base: np.ndarray,
    merged: np.ndarray,
    *,
    rtol: float,
    atol: float,
    start: np.ndarray | None = None,
    elementwise: bool = False,
    slack: np.ndarray | None = None,
    floor: float = 0.0,
    printed_start: np.ndarray | None = None,
    walk: float = 0.0,
) -> TensorDiff:
    """Compare one tensor.

    With `start` (the tensor's value when training began) the error is judged against how far
    training moved it: ||m - b|| <= rtol * ||b - start|| + atol * sqrt(n). With `elementwise`
    (printed values, no history) each element must hold |m - b| <= atol + slack, `slack` being
    the elements' print resolutions; the worst element (by its share of what it is allowed) is
    the error reported, each also allowed `walk` times its own size (the roundings that two
    trainings summing in other orders take apart, update by update: a few spacings of a weight
    after tens of updates). `printed_start`: the baseline's first printed values, from which the
    distance moved is reported (`moved`). Otherwise the scale is ||b||. `floor`: a weight's
    rounding, in units of its norm (`fixed_allowed`).
    """
    b = np.asarray(base, dtype=np.float64).ravel()
    m = np.asarray(merged, dtype=np.float64).ravel()
    if not np.isfinite(b).all() and start is not None:  # held from the start (a mask)
        b, start, m = agreed_non_finite(b, np.asarray(start, dtype=np.float64).ravel(), m)
    if not (np.isfinite(b).all() and np.isfinite(m).all()):  # ||b|| kept where b is finite
        nan, finite_b = math.nan, bool(np.isfinite(b).all())
        norm = float(np.linalg.norm(b)) if finite_b else None
        return TensorDiff(name, nan, nan, nan, nan, math.inf, 0.0, None, norm=norm)
    d = m - b
    abs_d = np.abs(d)
    abs_b = np.abs(b)
    max_abs = float(abs_d.max(initial=0.0))
    nonzero = abs_b > 0
    max_rel = float((abs_d[nonzero] / abs_b[nonzero]).max(initial=0.0))
    if (abs_d[~nonzero] > 0).any():
        max_rel = math.inf
    norm_d, norm_b, norm_m = (float(np.linalg.norm(v)) for v in (d, b, m))
    cosine = _safe_div(float(b @ m), norm_b * norm_m) if norm_b and norm_m else float(norm_d == 0)
    moved = None
    if elementwise:
        allowed_each = atol + (0.0 if slack is None else np.asarray(slack, np.float64).ravel())
        allowed_each = allowed_each + walk * abs_b
        allowed_each = np.broadcast_to(allowed_each, abs_d.shape)
        if abs_d.size == 0:
            error, allowed = 0.0, float(atol)
        else:
            fallback = np.where(abs_d > 0, np.inf, 0.0)
            share = np.divide(abs_d, allowed_each, out=fallback, where=allowed_each > 0)
            worst = int(share.argmax())
            error, allowed = float(abs_d[worst]), float(allowed_each[worst])
        if printed_start is not None:
            moved = float(np.linalg.norm(b - np.asarray(printed_start, np.float64).ravel()))
    else:
        if start is not None:
            moved = float(np.linalg.norm(b - np.asarray(start, dtype=np.float64).ravel()))
            scale = moved
        else:
            scale = norm_b
        error, allowed = norm_d, fixed_allowed(rtol, scale, atol, b.size, floor, norm_b)
    return TensorDiff(
        name,
        max_abs,
        max_rel,
        _safe_div(norm_d, norm_b),
        cosine,
        error,
        allowed,
        moved,
        norm=norm_b,
        size=b.size,
    )


def calibrate(
    d: TensorDiff,
    base: np.ndarray,
    merged: np.ndarray,
    ref: np.ndarray,
    *,
    factor: float,
    floor: float,
    start: np.ndarray | None = None,
) -> TensorDiff:
    """Judge against a more precise reference run instead of a fixed tolerance:
    ||m - ref|| <= factor * ||b - ref|| + floor * ||ref||, floor in units of the tensor's size."""
    r = np.asarray(ref, dtype=np.float64).ravel()
    b = np.asarray(base, dtype=np.float64).ravel()
    m = np.asarray(merged, dtype=np.float64).ravel()
    if not np.isfinite(b).all() and start is not None:  # held from the start (a mask)
        b, _, m, r = agreed_non_finite(b, np.asarray(start, dtype=np.float64).ravel(), m, r)
    if not (np.isfinite(r).all() and np.isfinite(b).all() and np.isfinite(m).all()):
        return dataclasses.replace(d, error=math.inf, allowed=0.0, noise=math.nan)
    noise = float(np.linalg.norm(b - r))
    error = float(np.linalg.norm(m - r))
    ref_norm = float(np.linalg.norm(r))
    allowed = noise_allowed(factor, noise, floor, ref_norm)
    rounding = floor * ref_norm
    sizes = (float(np.linalg.norm(m)), ref_norm)
    return dataclasses.replace(
        d, error=error, allowed=allowed, noise=noise, rounding=rounding, sizes=sizes
    )


def fit_ratio(base: list[np.ndarray], merged: list[np.ndarray]) -> tuple[float, float]:
    """Least-squares scalar r with merged ~ r * base over all tensors, and their cosine."""
    return fit_of(*fit_sums(base, merged))


def fit_sums(base: list[np.ndarray], merged: list[np.ndarray]) -> tuple[float, float, float]:
    """Σb², Σm² and Σbm over all tensors, in float64, one tensor at a time (`fit_total`)."""
    terms = []
    for x, y in zip(base, merged, strict=True):
        b = np.asarray(x, dtype=np.float64).ravel()
        m = np.asarray(y, dtype=np.float64).ravel()
        terms.append((float(b @ b), float(m @ m), float(b @ m)))
    bb, mm, bm = (fit_total([t[k] for t in terms]) for k in range(3))
    return bb, mm, bm


def fit_total(terms: list[float]) -> float:
    """The tensors' sums of the ratio fit added exactly where each is finite; where one is not
    (a 16-bit gradient that overflowed), as one dot product over all of them has it: inf, or
    NaN for inf − inf (math.fsum raised there: model zoo run 202007, a GRU under Rprop, float16
    autocast, the step taken every micro-step)."""
    return math.fsum(terms) if all(math.isfinite(t) for t in terms) else float(sum(terms))


def fit_of(bb: float, mm: float, bm: float) -> tuple[float, float]:
    """`fit_ratio`'s ratio and cosine from its sums (`fit_sums`)."""
    cosine = _safe_div(bm, math.sqrt(bb * mm)) if bb and mm else float(bb == mm)
    return _safe_div(bm, bb), cosine
