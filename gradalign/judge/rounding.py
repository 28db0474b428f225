"""Without a reference, a gradient that is nothing but rounding: zero in exact arithmetic (a
bias right before InstanceNorm or BatchNorm, a constant added to every logit, an attention key
bias) and, in the compute dtype, the rounding of sums whose terms cancel. Its two runs' values
are two draws of that rounding, as far apart as they are large, so the fixed tolerance (a share
of the tensor's own norm, plus `weight_atol` per element) failed clean runs: conv → InstanceNorm
failed 10 of 10 seeds at 3-5x, and under Adam the noise it steps on failed the weights too.

Such rounding is about one unit of the dtype's precision of the terms summed, and those terms
are of the model's gradients' own scale. So each gradient may also differ by ROUNDINGS·ε·G per
element (·√n for a tensor of n; at most grad_rtol/16·G), G the RMS element of the whole
model's baseline gradient at that update: a tensor of typical size sees 1e-6 of its norm in
float32 (grad_rtol is 1e-4), one a hundredth of the model's scale a hundred times as much.
Float32 and float64 only: a 16-bit grad_rtol is coarse already, and such a floor let a bfloat16
token-normalization bug through (tests/test_token_noise.py). Measured need: 0.4-0.6 units
(`tests/test_rounding_floor.py`). A gradient that passes by it counts as passed for the drift
of its weights (judge/drift.py); a note names what passes only by it.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from typing import Any

import numpy as np

from .distributed import listed
from .metrics import TensorDiff
from .results import UpdateResult
from .tolerances import Tolerances, eps

ROUNDINGS = 8  # the measured need is about half a unit (module docstring): 16x margin
# the floor widens every gradient in float32 and float64 only: in 16 bits grad_rtol is coarse
# already, and a floor of the model's scale let a bfloat16 token-normalization bug through
# (tests/test_token_noise.py); there it passes only a gradient at that scale (`rounding_in_both`)
WIDE = ("float64", "float32")
SIXTEEN = ("float16", "bfloat16")


def _unit(tol: Tolerances, dtype: str, sumsq: float, elements: int) -> float:
    """ROUNDINGS units of the dtype's epsilon of the RMS element of baseline gradients holding
    Σg² = `sumsq` over `elements`, at most a sixteenth of `grad_rtol` of it (0 without sums)."""
    if elements <= 0 or not math.isfinite(sumsq):
        return 0.0
    return min(ROUNDINGS * eps(dtype), tol.grad_rtol / 16) * math.sqrt(sumsq / elements)


def gradient_atol(tol: Tolerances, dtype: str, sumsq: float, elements: int) -> float:
    """`weight_atol` per element, plus the rounding floor (`_unit`) in float32 and float64."""
    return tol.weight_atol + (_unit(tol, dtype, sumsq, elements) if dtype in WIDE else 0.0)


def sixteen_bit_floor(tol: Tolerances, dtype: str, sumsq: float, elements: int) -> float:
    """In a 16-bit run, the per-element rounding of the model's gradient scale (`_unit`), which
    `rounding_in_both` reads; 0 elsewhere."""
    return _unit(tol, dtype, sumsq, elements) if dtype in SIXTEEN else 0.0


def floors(tol: Tolerances, dtype: str, sumsq: float, elements: int) -> tuple[float, float]:
    """`gradient_atol` and `sixteen_bit_floor` of one update's baseline gradient sums, as the
    in-memory, streamed and sketched judges read them without a reference."""
    return gradient_atol(tol, dtype, sumsq, elements), sixteen_bit_floor(
        tol, dtype, sumsq, elements
    )


def rounding_floors(
    tol: Tolerances, dtype: str, grads: Mapping[str, Any], names: list[str], floored: bool
) -> tuple[float, float]:
    """`floors` from whole baseline gradients (`floored`: without a reference; else
    `weight_atol` and 0)."""
    if not floored:
        return tol.weight_atol, 0.0
    sumsq = sum(float(np.sum(np.square(grads[n], dtype=np.float64))) for n in names)
    return floors(tol, dtype, sumsq, sum(int(np.size(grads[n])) for n in names))


def rounding_in_both(d: TensorDiff, floor: float) -> TensorDiff:
    """`d` passed (marked `rounded`) where, in a 16-bit run, the tensor's gradient is rounding in
    both runs: the baseline's stands within `floor` per element (`sixteen_bit_floor`), and the
    merged run's within twice that of it. An attention key bias, which softmax ignores, has a
    gradient of 1e-3 of the model's scale under bfloat16 autocast, drawn anew by each summation
    order: it failed 3 of 3 clean seeds at 3-8x. Unlike the float32 floor, this widens no
    tensor of a larger scale, whose disagreement still shows a bug that reweights micro-batches
    (`tests/test_token_noise.py`)."""
    if d.ok or floor <= 0 or not d.size or d.norm is None:
        return d
    scale = floor * math.sqrt(d.size)
    if d.norm <= scale and d.error <= 2 * scale:
        return dataclasses.replace(d, allowed=max(d.allowed, 2 * scale), rounded=True)
    return d


def marked(d: TensorDiff, atol: float, wider: float) -> TensorDiff:
    """`d`, judged with `wider` per element, marked where it passes only by more than `atol`."""
    if not d.ok or wider <= atol or d.size is None:
        return d
    if d.error <= d.allowed - (wider - atol) * math.sqrt(d.size):
        return d
    return dataclasses.replace(d, rounded=True)


def rounding_notes(results: list[UpdateResult]) -> list[str]:
    """A note naming the gradients that passed only by the rounding floor."""
    passed = [(r.update, d.name) for r in results for d in r.grads if d.rounded]
    if not passed:
        return []
    updates = sorted({u for u, _ in passed})
    names = sorted({n for _, n in passed})
    shown = listed(names, 3)
    return [
        f"without a reference, {len(passed)} gradient(s) at {len(updates)} update(s) ({shown}) "
        "pass only by the rounding floor: each is a small fraction of the model's gradient "
        f"scale, where {ROUNDINGS} units of rounding of the terms summed (a gradient zero in "
        "exact arithmetic, as a bias right before a normalization) exceed a share of its own "
        "norm; a float64 reference measures such noise instead"
    ]
