"""Tensors without a gradient that follow one with a noise-walking gradient: a BatchNorm's
running mean after a bias it cannot see (the bias's exact gradient is 0, so under Adam its
float32 rounding walks it about lr/10 per step, differently in each run, and the batch mean the
BatchNorm tracks moves with it), an EMA or SWA copy of such a parameter. In exact arithmetic
they stand still alike in every run; the walk they follow is drift (judge/drift.py) of a
tensor of their shape. So a tensor that never had a gradient of its own may drift, element by
element, as far as the farthest graded tensor of its shape drifted: the largest of their drifts
at each element. Without one (no tensor of its shape walked) it is judged as before."""

from __future__ import annotations

from collections.abc import Callable, Mapping

import numpy as np


def sources(
    shapes: Mapping[str, tuple], graded: set[str], drifted: Callable[[str], bool]
) -> dict[str, list[str]]:
    """Per tensor that never had a gradient, the graded tensors of its shape that drifted
    (sorted; none listed where none did). One pass over each set, however many tensors."""
    by_shape: dict[tuple, list[str]] = {}
    for other in sorted(graded):
        if other in shapes and drifted(other):
            by_shape.setdefault(tuple(shapes[other]), []).append(other)
    found = {}
    for name, shape in shapes.items():
        if name not in graded and (held := by_shape.get(tuple(shape))):
            found[name] = held
    return found


def followed(
    drift: Mapping[str, np.ndarray], graded: set[str], shapes: Mapping[str, tuple]
) -> dict[str, np.ndarray]:
    """Per tensor that never had a gradient, the elementwise largest drift of the graded tensors
    of its shape (flat float64), where any drifted."""
    found = sources(shapes, graded, lambda other: other in drift)
    return {name: np.maximum.reduce([drift[o] for o in held]) for name, held in found.items()}


def largest(slices: list[np.ndarray | None]) -> np.ndarray | None:
    """The elementwise largest of the slices given (None where none is)."""
    held = [s for s in slices if s is not None]
    return np.maximum.reduce(held) if held else None
