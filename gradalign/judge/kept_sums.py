"""What a run kept of a gradient for the kink diagnoses to read in place of its values: its row
and column sums (runs/unit_sums.py), grid sums and slab grids (runs/grid_sums.py), as a
sketch-mode run recorded them, or made from the values where the run kept those."""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np

from ..runs.grid_sums import grid_sums, has_slabs, slab_grids
from ..runs.model import Run, Tensors
from ..runs.unit_sums import has_units, unit_sums


def unit_sums_of(
    run: Run,
    kind: str,
    update: int,
    name: str,
    shape: tuple[int, ...],
    found: Tensors | None = None,
) -> tuple[np.ndarray, np.ndarray] | None:
    """A gradient's row and column sums at an update (runs/unit_sums.py), as `_kept` finds them."""
    kept = _kept(run, kind, update, name, shape, found, ("rows", "columns"), unit_sums)
    return None if kept is None else (kept[0], kept[1])


def _one_kept(
    key: str, made: Callable[[np.ndarray, tuple[int, ...]], np.ndarray], kept_for=has_units
) -> Callable[..., np.ndarray | None]:
    """A reader of one array a sketch-mode run keeps under `key` for gradients of the shapes
    `kept_for` names (`made` from the values where the run kept those), as `_kept` finds it."""

    def read(
        run: Run,
        kind: str,
        update: int,
        name: str,
        shape: tuple[int, ...],
        found: Tensors | None = None,
    ) -> np.ndarray | None:
        if not kept_for(shape):
            return None
        kept = _kept(run, kind, update, name, shape, found, (key,), lambda v, s: (made(v, s),))
        return None if kept is None else kept[0]

    return read


# a gradient's grid sums, and its slab grids (three axes or more; None in a run recorded
# before them): runs/grid_sums.py
grid_sums_of = _one_kept("grid", grid_sums)
slab_grids_of = _one_kept("slabs", slab_grids, has_slabs)


def _kept(
    run: Run,
    kind: str,
    update: int,
    name: str,
    shape: tuple[int, ...],
    found: Tensors | None,
    keys: tuple[str, ...],
    made: Callable[[np.ndarray, tuple[int, ...]], tuple],
) -> tuple | None:
    """What a sketch-mode run recorded of a gradient of two axes or more under `keys` (`found`:
    its sketch file at the update, read once by the caller), or `made` from its values where
    the run kept them (a tensor kept whole in its sketch file, or full files)."""
    if kind != "grads" or not has_units(shape):
        return None
    if found is not None:
        kept = [found.get(f"{key}/{kind}/{name}") for key in keys]
        if all(k is not None for k in kept):
            return tuple(np.asarray(k) for k in kept)
        vector = found.get(f"{kind}/{name}")
        if vector is not None and vector.size == math.prod(shape):
            return made(vector, shape)
    full = run.grads(update)
    if full is None or name not in full:
        return None
    return made(full[name], shape)
