"""Without a reference: gradients at weights that differ, off by a term proportional to them.

A loss that adds a penalty on the weights (an L2 term λ·Σw², as many loops write weight decay)
has the gradient g_data + 2λ·w. Where the two runs enter an update with weights that differ
(noise-dominated elements that Adam stepped apart: an attention key bias, whose data gradient
is zero in exact arithmetic), their gradients differ by 2λ·Δw there, exactly, whatever the data
term does. Against a float64 reference that is noise (the reference's key bias walks alike);
against the fixed tolerances it failed a clean Transformer encoder under AdamW with λ = 1e-3
(`in_proj_bias`'s gradient 1.78x, and since a tensor's drift counts only where its gradient
passed, its weights 180x: `tests/test_weight_term.py`).

So at an update the runs enter with weights that differ, a gradient that fails is judged again
net of c·Δw, Δw = w_m − w_b the weights the runs entered it with and c ≥ 0 one coefficient for
the whole model, fitted by least squares: c = Σ⟨Δg, Δw⟩ / Σ‖Δw‖² (2.000e-3 = 2λ on that encoder,
at every update), where that term explains at least `EXPLAINED` of the gradients' squared
difference over the model (98.4% to 99.97% there, at updates 2 to 39 of 40; a ResNet without a
penalty whose runs parted at kinks, zoo run 52030 at update 26, fitted c = 1.1e-3 explaining
0.00%: none). A tensor that passes only so is marked (`netted`: its c) and a note names it. A
bug moves the gradients along its own shape (K times the gradient, another batch's gradient,
one carried over, a penalty counted K times: ∝ w), which the direction of the weights'
difference does not hold, and it shows first at the update it starts, which the runs enter with
the same weights or weights apart by noise alone.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable

import numpy as np

from ..runs.model import Tensors
from ..runs.sketches import dot
from .distributed import listed
from .metrics import TensorDiff
from .results import UpdateResult

EXPLAINED = 0.9  # the share of the gradients' squared difference the fitted term must explain


@dataclasses.dataclass(frozen=True)
class Sums:
    """One tensor's ‖Δg‖², ⟨Δg, Δw⟩ and ‖Δw‖²: Δg = g_m − g_b at an update, Δw = w_m − w_b of
    the weights the runs entered it with."""

    dd: float
    dw: float
    ww: float

    @classmethod
    def of(cls, dg: np.ndarray, dw: np.ndarray) -> Sums:
        """The sums of aligned float64 differences Δg and Δw."""
        return cls(dot(dg, dg), dot(dg, dw), dot(dw, dw))

    def __add__(self, other: Sums) -> Sums:
        return Sums(self.dd + other.dd, self.dw + other.dw, self.ww + other.ww)

    def residual(self, c: float) -> float:
        """‖Δg − c·Δw‖ from the sums."""
        return math.sqrt(max(self.dd - 2 * c * self.dw + c * c * self.ww, 0.0))


def sums_of(gb: np.ndarray, gm: np.ndarray, pb: np.ndarray, pm: np.ndarray) -> Sums:
    """`Sums` of aligned float64 slices (or whole flattened tensors)."""
    return Sums.of(np.subtract(gm, gb), np.subtract(pm, pb))


def whole_sums(gb, gm, pb, pm) -> Sums:
    """`Sums` of whole tensors of any float dtype."""
    flat = (np.asarray(a, dtype=np.float64).ravel() for a in (gb, gm, pb, pm))
    return sums_of(*flat)


def coefficient(sums: Iterable[Sums]) -> float:
    """The least-squares c of Δg ≈ c·Δw over the model, where it is positive and explains at
    least `EXPLAINED` of Σ‖Δg‖²; else 0 (the weights entered alike, or their difference is not
    what sets the gradients apart)."""
    total = Sums(0.0, 0.0, 0.0)
    for s in sums:
        total = total + s
    if not (total.ww > 0 and total.dd > 0):
        return 0.0
    c = total.dw / total.ww
    explained = c * total.dw / total.dd  # ⟨Δg, Δw⟩² / (‖Δw‖²·‖Δg‖²)
    return c if math.isfinite(c) and c > 0 and explained >= EXPLAINED else 0.0


def netted(d: TensorDiff, residual: float, c: float) -> TensorDiff:
    """A failing gradient's judgement, passed net of c·Δw (its `residual` error) where that is
    within what is allowed; otherwise `d` as it was."""
    if d.ok or c <= 0 or not residual <= d.allowed:
        return d
    return dataclasses.replace(d, error=residual, netted=c)


def net_of_weights(
    grads: list[TensorDiff], gb: Tensors, gm: Tensors, pb: Tensors | None, pm: Tensors | None
) -> list[TensorDiff]:
    """From whole tensors: each failing gradient judged again net of c·Δw (`netted`), where both
    runs kept the weights they entered the update with (`pb`, `pm`)."""
    if pb is None or pm is None:
        return grads
    sums = {
        d.name: whole_sums(gb[d.name], gm[d.name], pb[d.name], pm[d.name])
        for d in grads
        if d.name in pb and d.name in pm
    }
    c = coefficient(sums.values())
    return [d if d.name not in sums else netted(d, sums[d.name].residual(c), c) for d in grads]


def failing(diffs: Iterable[TensorDiff]) -> bool:
    """Whether any gradient judged fails (the only updates where the fit is read)."""
    return any(not d.ok for d in diffs)


def netted_notes(results: list[UpdateResult]) -> list[str]:
    """A note naming the gradients that passed only net of a term proportional to the weights."""
    passed = [(r.update, d.name, d.netted) for r in results for d in r.grads if d.netted > 0]
    if not passed:
        return []
    updates = sorted({u for u, _, _ in passed})
    names = listed(sorted({n for _, n, _ in passed}), 3)
    low, high = min(c for *_, c in passed), max(c for *_, c in passed)
    span = f"{low:.3g}" if math.isclose(low, high, rel_tol=1e-3) else f"{low:.3g} to {high:.3g}"
    return [
        f"without a reference, {len(passed)} gradient(s) at {len(updates)} update(s) ({names}; "
        f"first at update {updates[0]}) pass only net of a term proportional to the weights the "
        f"runs entered with, c·(w_merged − w_baseline), c = {span} fitted over the whole model "
        f"and explaining at least {EXPLAINED:.0%} of its gradients' difference: a penalty on the "
        "weights in the loss (c = 2λ for λ·Σw²) at weights the runs' noise set apart; a float64 "
        "reference measures such noise instead"
    ]
