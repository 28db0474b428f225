"""The judge's per-tensor arithmetic over slices: every sum `metrics.diff`, `metrics.calibrate`,
`drift.Drift` and `compatible.check_reference_weights` need, in one pass over aligned slices of
the baseline (b), merged (m) and reference (r) tensors, the starting weights (s), the previous
update's weights (pb, pr) and, for the drift, the gradients (gb, gr).

Each slice is widened to float64 once and summed without BLAS (`runs.sketches.dot`); sums of
squares double as the finiteness test (a float32 square cannot overflow; a float64 one that does
is checked element by element). The results equal the whole-tensor functions' up to the order of
float64 additions; `Pair.diff` and `Pair.calibrate` turn them into the same `TensorDiff`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from ..runs.sketches import dot
from .metrics import TensorDiff, _safe_div, agreed_non_finite, fixed_allowed, noise_allowed


def _sumsq(x: np.ndarray) -> tuple[float, bool]:
    """Σx² and whether every element is finite."""
    total = dot(x, x)
    return total, math.isfinite(total) or bool(np.isfinite(x).all())


@dataclass
class Pair:
    """Running sums for one tensor of b against m (and r, s)."""

    n: int = 0
    finite_b: bool = True
    finite_m: bool = True
    finite_r: bool = True
    max_abs: float = 0.0
    max_rel: float = 0.0
    dd: float = 0.0  # Σ(m−b)²
    bb: float = 0.0
    mm: float = 0.0
    bm: float = 0.0
    bs: float = 0.0  # Σ(b−s)²
    br: float = 0.0  # Σ(b−r)²
    mr: float = 0.0  # Σ(m−r)²
    rr: float = 0.0
    rs: float = 0.0  # Σ(r−s)²
    noise_ok: bool = True  # every |gb − gr| finite (the drift's condition)
    beyond: float = 0.0  # Σ max(|m − b| − drift, 0)² (drift.beyond_drift), where a drift is given
    extra: dict = field(default_factory=dict)

    def add(
        self,
        b: np.ndarray,
        m: np.ndarray | None,
        r: np.ndarray | None = None,
        s: np.ndarray | None = None,
        drift: np.ndarray | None = None,
    ) -> tuple[np.ndarray, np.ndarray | None]:
        """Take one aligned slice (float64); returns b and r for further use. `drift`: the
        slice's noise-dominated drift, measured against the merged run (no reference)."""
        self.n += b.size
        bb, ok = _sumsq(b)
        if not ok:  # infinities held from the start alike (a mask buffer of -inf): equal
            b, s, m, r = agreed_non_finite(b, s, m, r)
            bb, ok = _sumsq(b)
            if ok and drift is not None:  # its drift there is no step of training either
                drift = np.where(np.isfinite(drift), drift, 0.0)
        self.bb += bb
        self.finite_b &= ok
        if m is not None:
            mm, ok = _sumsq(m)
            self.mm += mm
            self.finite_m &= ok
            self.bm += dot(b, m)
            d = m - b
            self.dd += dot(d, d)
            np.abs(d, out=d)
            if d.size:
                self.max_abs = max(self.max_abs, float(d.max()))
                scaled = np.abs(b)
                with np.errstate(divide="ignore", invalid="ignore"):
                    rel = np.fmax.reduce(np.divide(d, scaled, out=scaled), initial=0.0)
                self.max_rel = max(self.max_rel, float(rel))
            if drift is not None:  # d is |m − b|
                d -= drift
                np.maximum(d, 0.0, out=d)
                self.beyond += dot(d, d)
        if s is not None:
            t = b - s
            self.bs += dot(t, t)
        if r is not None:
            rr, ok = _sumsq(r)
            self.rr += rr
            self.finite_r &= ok
            t = b - r
            self.br += dot(t, t)
            if m is not None:
                np.subtract(m, r, out=t)
                self.mr += dot(t, t)
            if s is not None:
                np.subtract(r, s, out=t)
                self.rs += dot(t, t)
        return b, r

    def diff(
        self, name: str, rtol: float, atol: float, start: bool, floor: float = 0.0
    ) -> TensorDiff:
        """What `metrics.diff` returns for these sums."""
        if not (self.finite_b and self.finite_m):  # ||b|| kept where b is finite
            norm = math.sqrt(self.bb) if self.finite_b else None
            nan = math.nan
            return TensorDiff(name, nan, nan, nan, nan, math.inf, 0.0, None, norm=norm)
        norm_d, norm_b, norm_m = math.sqrt(self.dd), math.sqrt(self.bb), math.sqrt(self.mm)
        both = norm_b and norm_m
        cosine = _safe_div(self.bm, norm_b * norm_m) if both else float(norm_d == 0)
        moved = math.sqrt(self.bs) if start else None
        scale = moved if moved is not None else norm_b
        allowed = fixed_allowed(rtol, scale, atol, self.n, floor, norm_b)
        return TensorDiff(
            name,
            self.max_abs,
            self.max_rel,
            _safe_div(norm_d, norm_b),
            cosine,
            norm_d,
            allowed,
            moved,
            norm=norm_b,
            size=self.n,
        )

    def calibrate(self, d: TensorDiff, factor: float, floor: float) -> TensorDiff:
        """What `metrics.calibrate` returns for these sums."""
        import dataclasses

        if not (self.finite_r and self.finite_b and self.finite_m):
            return dataclasses.replace(d, error=math.inf, allowed=0.0, noise=math.nan)
        noise, error = math.sqrt(self.br), math.sqrt(self.mr)
        allowed = noise_allowed(factor, noise, floor, math.sqrt(self.rr))
        rounding = floor * math.sqrt(self.rr)
        sizes = (math.sqrt(self.mm), math.sqrt(self.rr))
        return dataclasses.replace(
            d, error=error, allowed=allowed, noise=noise, rounding=rounding, sizes=sizes
        )


def widen64(x: np.ndarray) -> np.ndarray:
    """A slice as float64 (a float64 slice as it is)."""
    return x if x.dtype == np.float64 else x.astype(np.float64)
