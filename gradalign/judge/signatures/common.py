"""Helpers every signature uses: which update fails first, K, norms of tensor sets."""

from __future__ import annotations

import math

import numpy as np

from ..results import Comparison, UpdateResult

COSINE_SAME_DIRECTION = 1 - 1e-6  # a pure rescaling keeps the direction to rounding error
RATIO_MATCH = 1e-3  # relative distance to K, 1/K or K+1 that names the loss-scale variant


def finite(value: float | None) -> float | None:
    return float(value) if value is not None and math.isfinite(value) else None


def window(c: Comparison) -> int:
    """K of the merged run relative to the baseline's."""
    return max(1, c.merged.accum_steps // max(1, c.baseline.accum_steps))


def failing(c: Comparison) -> UpdateResult | None:
    return next((r for r in c.results if not r.ok), None)


def first_gradient_failure(c: Comparison) -> UpdateResult | None:
    return next((r for r in c.results if any(not d.ok for d in r.grads)), None)


def norm(tensors: dict[str, np.ndarray]) -> float:
    """The L2 norm of all tensors together, in float64."""
    return math.sqrt(sum(float(np.sum(np.square(t, dtype=np.float64))) for t in tensors.values()))


def relative_error(base: dict[str, np.ndarray], merged: dict[str, np.ndarray]) -> float | None:
    """||merged - base|| / ||base|| over all tensors together."""
    size = norm(base)
    gap = norm({n: merged[n].astype(np.float64) - base[n] for n in base})
    return gap / size if size > 0 else None
