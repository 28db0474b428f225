"""What the kink diagnoses (judge/kinks.py, judge/kink_divergence.py) read of two runs' tensors
at one update: each tensor's error as a share of the second run's, and the few units (rows or
columns) that hold it.

Where both runs kept the update's full files the values are read (`Whole`; a tensor's rank,
past `kink_pair.RANK_ELEMENTS`, from grid sums made of them), a slice or a block of rows at a
time. Where a run kept
sketches there (`--record sketch`), the same questions are answered from what it kept
(`Sketched`): the error's norm estimated from sketch differences (runs/sketches.py), the
second run's exact norm, and each row's and column's error energy estimated from the
gradients' unit sums (runs/unit_sums.py), and the error's rank from their grid sums
(runs/grid_sums.py: one input's share stays one outer product there); a tensor kept whole is
read exactly. An estimate of the units is what it is: the rows it finds hold the error in the
estimated energies, and a tensor without unit sums (a run recorded before them, a weight) has
no units to find, nor a rank without grid sums.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from ..runs.model import Run, Tensors
from ..runs.sketches import estimate
from ..runs.store import shape_of
from ..runs.unit_sums import unit_energies
from .fits import distance
from .kept_sums import grid_sums_of, slab_grids_of, unit_sums_of
from .kink_pair import TensorPair
from .kink_shape import (
    ESTIMATED_SHARE,
    JUMP_SHARE,
    Units,
    kink_units,
    kink_units_in,
    units_holding,
)
from .metrics import _safe_div
from .views import Kept, Sketching, summaries


class Whole(TensorPair):
    """Two runs' tensors of one kind at one update, both read in full."""

    def __init__(self, first: Tensors, second: Tensors, before: Tensors | None = None) -> None:
        self.first, self.second, self.before = first, second, before
        self._made_sums, self._among = {}, {}

    def shape(self, name: str) -> tuple[int, ...]:
        return shape_of(self.second, name)

    def share(self, name: str) -> float:
        """||first − second|| / ||second − before|| (before: 0 where none is given)."""
        return _safe_div(distance(self.first, self.second, [name]), self.scale(name))

    def scale(self, name: str) -> float:
        """||second − before||: the second run's tensor, or how far it moved since `before`."""
        return distance(self.second, self.before, [name])

    def _units(
        self, name: str, most: int | None, of_rows: float, rest: float, held: float
    ) -> Units | None:
        shape = self.shape(name)
        return kink_units_in(self.first, self.second, name, shape, most, of_rows, rest, held)

    def _whole(self, name: str) -> tuple[np.ndarray, np.ndarray] | None:
        return (self.first[name], self.second[name]) if name in self else None

    def readable(self, name: str) -> bool:
        """Whether `units` can answer for this tensor."""
        return True

    def holding(self, name: str) -> str:
        """What `units` found its units holding, for a note."""
        return f"{JUMP_SHARE:.0%} of it"


class Sketched(TensorPair):
    """Two runs' tensors of one kind at one update as sketches (judge/views.py), with their
    gradients' unit sums where kept; the runs themselves are read only for the unit sums, and
    only for the tensors asked about."""

    def __init__(
        self,
        runs: tuple[Run, Run],
        kind: str,
        update: int,
        kept: tuple[dict[str, Kept], dict[str, Kept]],
        before: dict[str, Kept] | None = None,
    ) -> None:
        self.runs, self.kind, self.update = runs, kind, update
        self.first, self.second = kept
        self.before = before
        self.shapes = {t.name: tuple(t.shape) for t in runs[1].tensors}
        self._sums: dict[tuple[str, Callable], tuple | None] = {}
        self._files: list[Tensors | None] | None = None  # each run's sketch file, read once
        self._made_sums, self._among = {}, {}

    def shape(self, name: str) -> tuple[int, ...]:
        return self.shapes.get(name, self.second[name].vector.shape)

    def share(self, name: str) -> float:
        """||first − second|| / ||second − before||, the norms of differences estimated."""
        first, second = self.first[name], self.second[name]
        return _safe_div(self._distance(first, second), self.scale(name))

    def scale(self, name: str) -> float:
        """||second − before||: the exact norm, or the distance moved estimated."""
        second = self.second[name]
        if self.before is None:
            return second.norm
        return self._distance(second, self.before[name])

    @staticmethod
    def _distance(a: Kept, b: Kept) -> float:
        """||a − b||, estimated from their sketches (exact where both are whole)."""
        return estimate(a.vector - b.vector, a.exact and b.exact).value

    def _units(
        self, name: str, most: int | None, of_rows: float, rest: float, held: float
    ) -> Units | None:
        first, second = self.first[name], self.second[name]
        shape = self.shape(name)
        if first.exact and second.exact:
            return kink_units(
                first.vector.reshape(shape), second.vector.reshape(shape), most, of_rows, rest, held
            )
        found = self._unit_sums(name)
        if found is None:
            return None
        (rows_a, columns_a), (rows_b, columns_b) = found
        energies = unit_energies(rows_a - rows_b, columns_a - columns_b)
        own = unit_energies(rows_b, columns_b)
        estimated = held * ESTIMATED_SHARE / JUMP_SHARE  # as much lower as a kink's share is
        return units_holding(energies, most, of_rows, estimated, rest, own)

    def _whole(self, name: str) -> tuple[np.ndarray, np.ndarray] | None:
        """Both runs' tensor, where both kept it whole."""
        if name not in self:
            return None
        first, second = self.first[name], self.second[name]
        if not (first.exact and second.exact):
            return None
        shape = self.shape(name)
        return first.vector.reshape(shape), second.vector.reshape(shape)

    def _grids(self, name: str) -> tuple[np.ndarray, np.ndarray] | None:
        """Both runs' grid sums of a tensor (None where a run has none), read once; made from
        its values where both kept them whole and kept no grid sums (a weight)."""
        return self._kept_sums(name, grid_sums_of) or super()._grids(name)

    def _slabs(self, name: str) -> tuple[np.ndarray, np.ndarray] | None:
        """Both runs' slab grids of a tensor (None where a run has none), read once; made
        from its values as `_grids`."""
        return self._kept_sums(name, slab_grids_of) or super()._slabs(name)

    def holding(self, name: str) -> str:
        """What `units` found its units holding, for a note."""
        if self.first[name].exact and self.second[name].exact:
            return f"{JUMP_SHARE:.0%} of it"
        return f"{ESTIMATED_SHARE:.0%} of it by its unit sums' estimate"

    def readable(self, name: str) -> bool:
        """Whether `units` can answer for this tensor: both kept it whole, or both have its
        unit sums."""
        first, second = self.first[name], self.second[name]
        return (first.exact and second.exact) or self._unit_sums(name) is not None

    def _unit_sums(self, name: str) -> tuple | None:
        """Both runs' unit sums of a tensor (None where a run has none), read once."""
        return self._kept_sums(name, unit_sums_of)

    def _kept_sums(self, name: str, reader: Callable[..., Any]) -> tuple | None:
        """Both runs' sums of a tensor as `reader` (`unit_sums_of`, `grid_sums_of`,
        `slab_grids_of`) finds them, read once; None where a run has none."""
        key = (name, reader)
        if key not in self._sums:
            if self._files is None:
                self._files = [
                    run.sketches(self.update) if run.record == "sketch" else None
                    for run in self.runs
                ]
            shape = self.shape(name)
            found = [
                reader(run, self.kind, self.update, name, shape, kept)
                for run, kept in zip(self.runs, self._files, strict=True)
            ]
            self._sums[key] = None if any(f is None for f in found) else tuple(found)
        return self._sums[key]


Pair = Whole | Sketched  # what `apart` gives


def apart(
    first: Run,
    second: Run,
    kind: str,
    update: int,
    seen: Sketching | None,
    since: int | None = None,
) -> Pair | None:
    """Two runs' gradients ("grads") or weights at `update`, as the kink diagnoses read them;
    `since`: for weights, the second run's at that update (-1: its initial weights) is what
    each share is of the distance moved from. None where a run kept neither files nor
    sketches there."""
    if kind == "grads":
        whole = first.grads(update), second.grads(update)
    else:
        whole = first.weights(update), second.weights(update)
    before_whole = None
    if since is not None:
        before_whole = second.init_weights() if since < 0 else second.weights(since)
    pair: Pair | None = None
    if all(t is not None for t in whole) and (since is None or before_whole is not None):
        pair = Whole(whole[0], whole[1], before_whole)
    elif seen is not None:
        kept = summaries(first, kind, update, seen), summaries(second, kind, update, seen)
        before = None
        if since is not None:
            before = summaries(second, "weights", None if since < 0 else since, seen)
        if kept[0] is not None and kept[1] is not None and (since is None or before is not None):
            pair = Sketched((first, second), kind, update, (kept[0], kept[1]), before)
    if pair is not None:
        pair.counted = counted_per_batch(first, second)
    return pair


def counted_per_batch(*runs: Run) -> frozenset[str]:
    """The tensors of embeddings that divide each row's gradient by its index's count in the
    batch (`model.grad_by_frequency`): a micro-batch counts its own indices, so their rows part
    from the batch's by what each micro-batch held, in as few rows as a kink's. No kink there."""
    layers = {layer for run in runs for layer in run.model_facts.get("grad_by_frequency") or []}
    if not layers:
        return frozenset()
    return frozenset(
        t.name
        for run in runs
        for t in run.tensors
        if any(t.name.startswith(f"{layer}.") for layer in layers)
    )
