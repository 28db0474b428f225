"""What the kink diagnoses (judge/kinks.py, judge/kink_divergence.py) read of two runs' tensors
at one update: each tensor's error as a share of the second run's, and the few units (rows or
columns) that hold it.

Where both runs kept the update's full files the values are read (`Whole`). Where a run kept
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

import math
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from ..runs.grid_sums import (
    hashed_ones,
    hashed_rows,
    slab_ones,
)
from ..runs.model import Run, Tensors
from ..runs.sketches import estimate
from ..runs.unit_sums import unit_energies
from .kept_sums import grid_sums_of, slab_grids_of, unit_sums_of
from .kink_shape import (
    ESTIMATED_SHARE,
    JUMP_ROWS,
    JUMP_SHARE,
    KINK_UNITS,
    Units,
    along_input,
    fused_experts,
    kink_units,
    localizes,
    one_input,
    same_input,
    slab_input,
    units_holding,
)
from .metrics import _safe_div
from .views import Kept, Sketching, summaries

GRID, SLABS = "grid", "slabs"  # how `_Pair._ranked` read a rank where no values were kept


class _Pair:
    """Two runs' tensors of one kind at one update (`first`, `second`), and where shares are of
    the distance moved, the second run's at an earlier update (`before`): mappings by name."""

    first: Mapping
    second: Mapping
    before: Mapping | None
    counted: frozenset[str] = frozenset()  # tensors no kink is read in (`counted_per_batch`)

    def units(
        self, name: str, most: int | None = None, of_rows: float = JUMP_ROWS, rest: float = math.inf
    ) -> Units | None:
        """The fewest units holding a kink's share of the tensor's error (`units_holding`), the
        rest within `rest`; None where there are none, or no kink is read in the tensor."""
        return None if name in self.counted else self._units(name, most, of_rows, rest)

    def _units(self, name: str, most: int | None, of_rows: float, rest: float) -> Units | None:
        raise NotImplementedError

    def jumped(self, name: str, rest: float) -> Units | None:
        """Where a gradient's jump sits: a kink's few units, or one input's share (a rank-one
        error, `one_input`); None where neither holds it with the rest within `rest`. Fused
        experts' rows along their first axis are experts, not units a kink crosses: a jump held
        in one expert's slab is one input's share where the slabs read so (a token joined that
        expert; model zoo run 266535, Mixtral under float16 at width 2, sketched: the unit
        sums' estimates put 90% of `down_proj`'s error in expert 1, where the values read one
        input's share in experts 0 and 1)."""
        units = self.units(name, rest=rest)
        if units is not None and units[0] == 0 and fused_experts(self.shape(name)):
            return self.one_input(name, rest=rest) or units
        return units or self.one_input(name, rest=rest)

    def one_input(self, name: str, rest: float = math.inf, few: bool = False) -> Units | None:
        """The tensor's error as one input's share (`kink_shape.one_input`, `few` as there);
        None where it is not, where no kink is read in the tensor, or where its rank cannot be
        read (`_ranked`)."""
        both = None if name in self.counted else self._ranked(name, slabs=True)
        if both is None:
            return None
        shape = self.shape(name)
        ones = {None: None, GRID: hashed_ones, SLABS: slab_ones}[both[1]]
        return one_input(*both[0], rest, few, None if ones is None else ones(shape))

    def along_input(self, bias: str, weight: str) -> bool:
        """Whether the bias's error is the same inputs' share as its weight's rank-one error
        (`kink_shape.along_input`); False where either cannot be read. Where the weight is read
        by its grid sums, the bias is hashed as its rows are (`grid_sums.hashed_rows`)."""
        own, pair = self._whole(bias), self._ranked(weight)
        if own is None or pair is None or own[0].shape != self.shape(weight)[:1]:
            return False
        if pair[1] is not None:  # a weight of two axes, as `kink_shape.along_input` reads one
            if len(self.shape(weight)) != 2:
                return False
            own = (hashed_rows(own[0]), hashed_rows(own[1]))
        return along_input(pair[0], own)

    def same_input(self, name: str, other: str) -> bool:
        """Whether two weights' rank-one errors are the same input's share
        (`kink_shape.same_input`); False where either cannot be read, or they have not as many
        columns (trailing axes flattened)."""
        columns = [math.prod(self.shape(n)[1:]) for n in (name, other)]
        both = self._ranked(name, other)
        return both is not None and columns[0] == columns[1] and same_input(*both[0])

    def same_slab_input(self, name: str, fused: str, slab: int) -> bool:
        """Whether a weight's rank-one error is the same input's share as a slab of fused
        experts' (`kink_shape.slab_input`): read from both runs' values, or where either kept
        only a sketch, from the weight's grid sums and the experts' slab grids (the inputs
        hashed alike where both have as many columns); False where neither can be read."""
        own, other = self._whole(name), self._whole(fused)
        if own is not None and other is not None:
            return slab_input(own, other, slab)
        columns = [math.prod(self.shape(name)[1:]), math.prod(self.shape(fused)[2:])]
        if columns[0] != columns[1]:  # inputs hashed alike only where as long
            return False
        own, other = self._grids(name), self._slabs(fused)
        return own is not None and other is not None and slab_input(own, other, slab, True)

    def _ranked(self, *names: str, slabs: bool = False) -> tuple | None:
        """The tensors' pairs as their ranks are read (each name's pair, one name: that pair),
        and how: both runs' values (None), or where either kept only a sketch, both runs' slab
        grids (SLABS, with `slabs`, where kept) or grid sums (GRID); None where any cannot be
        read."""
        pairs = [self._whole(name) for name in names]
        if all(pair is not None for pair in pairs):
            return (pairs[0] if len(names) == 1 else pairs), None
        for how, reader in ((SLABS, self._slabs), (GRID, self._grids)):
            if how == SLABS and not slabs:
                continue
            kept = [reader(name) for name in names]
            if all(k is not None for k in kept):
                return (kept[0] if len(names) == 1 else kept), how
        return None

    def _whole(self, name: str) -> tuple[np.ndarray, np.ndarray] | None:
        raise NotImplementedError

    def _grids(self, name: str) -> tuple[np.ndarray, np.ndarray] | None:
        """Both runs' grid sums of a tensor, where both kept them or its values."""
        return None

    def _slabs(self, name: str) -> tuple[np.ndarray, np.ndarray] | None:
        """Both runs' slab grids of a tensor, where both kept them."""
        return None

    def rank_read(self, name: str) -> str:
        """How `one_input` read the tensor's rank, for a note: '' from its values."""
        return "" if self._whole(name) is not None else ", read from its grid sums"

    def kinked_units(self, name: str, rest: float = math.inf) -> Units | None:
        """`units` as a followed kink reads them, at most KINK_UNITS: rows of a tensor of many
        rows, or columns of one of many columns (`localizes`)."""
        found = self.units(name, KINK_UNITS, rest=rest)
        return found if found is not None and localizes(self.shape(name), found[0]) else None

    def shape(self, name: str) -> tuple[int, ...]:
        raise NotImplementedError

    def __contains__(self, name: str) -> bool:
        return name in self.first and name in self.second

    def names(self) -> set[str]:
        return self.first.keys() & self.second.keys()

    def scalable(self, name: str) -> bool:
        """Whether `scale` can answer for this tensor."""
        return name in self.second and (self.before is None or name in self.before)


class Whole(_Pair):
    """Two runs' tensors of one kind at one update, both read in full."""

    def __init__(self, first: Tensors, second: Tensors, before: Tensors | None = None) -> None:
        self.first, self.second, self.before = first, second, before

    def shape(self, name: str) -> tuple[int, ...]:
        return tuple(np.shape(self.second[name]))

    def share(self, name: str) -> float:
        """||first − second|| / ||second − before|| (before: 0 where none is given)."""
        second = np.asarray(self.second[name], dtype=np.float64)
        error = float(np.linalg.norm(np.asarray(self.first[name], dtype=np.float64) - second))
        return _safe_div(error, self.scale(name))

    def scale(self, name: str) -> float:
        """||second − before||: the second run's tensor, or how far it moved since `before`."""
        second = np.asarray(self.second[name], dtype=np.float64)
        return float(np.linalg.norm(second if self.before is None else second - self.before[name]))

    def _units(self, name: str, most: int | None, of_rows: float, rest: float) -> Units | None:
        return kink_units(self.first[name], self.second[name], most, of_rows, rest)

    def _whole(self, name: str) -> tuple[np.ndarray, np.ndarray] | None:
        return (self.first[name], self.second[name]) if name in self else None

    def readable(self, name: str) -> bool:
        """Whether `units` can answer for this tensor."""
        return True

    def holding(self, name: str) -> str:
        """What `units` found its units holding, for a note."""
        return f"{JUMP_SHARE:.0%} of it"


class Sketched(_Pair):
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

    def _units(self, name: str, most: int | None, of_rows: float, rest: float) -> Units | None:
        first, second = self.first[name], self.second[name]
        shape = self.shape(name)
        if first.exact and second.exact:
            return kink_units(
                first.vector.reshape(shape), second.vector.reshape(shape), most, of_rows, rest
            )
        found = self._unit_sums(name)
        if found is None:
            return None
        (rows_a, columns_a), (rows_b, columns_b) = found
        energies = unit_energies(rows_a - rows_b, columns_a - columns_b)
        own = unit_energies(rows_b, columns_b)
        return units_holding(energies, most, of_rows, ESTIMATED_SHARE, rest, own)

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
        """Both runs' grid sums of a tensor (None where a run has none), read once."""
        return self._kept_sums(name, grid_sums_of)

    def _slabs(self, name: str) -> tuple[np.ndarray, np.ndarray] | None:
        """Both runs' slab grids of a tensor (None where a run has none), read once."""
        return self._kept_sums(name, slab_grids_of)

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
