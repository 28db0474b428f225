"""What the kink diagnoses (judge/kinks.py, judge/kink_divergence.py) read of two runs' tensors
at one update: each tensor's error as a share of the second run's, and the few units (rows or
columns) that hold it.

Where both runs kept the update's full files the values are read (`Whole`). Where a run kept
sketches there (`--record sketch`), the same questions are answered from what it kept
(`Sketched`): the error's norm estimated from sketch differences (runs/sketches.py), the
second run's exact norm, and each row's and column's error energy estimated from the
gradients' unit sums (runs/unit_sums.py); a tensor kept whole is read exactly. An estimate of
the units is what it is: the rows it finds hold the error in the estimated energies, and a
tensor without unit sums (a run recorded before them, a weight) has no units to find.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import numpy as np

from ..runs.model import Run, Tensors
from ..runs.sketches import estimate
from ..runs.unit_sums import has_units, unit_energies, unit_sums
from .metrics import _safe_div
from .views import Kept, Sketching, summaries

JUMP_SHARE = 0.9  # a kink's jump holds this share of its error ...
# ... in the energies unit sums estimate, this share: each unit's estimate is its energy times a
# chi-square of 8 degrees of freedom over 8, so a unit holding 90% is seen holding 75% in 95% of
# draws (99.99% at 99%), one holding half the error in 0.2% (arithmetic, the rest's energy taken
# as known; `tests/test_unit_sums.py` draws it)
ESTIMATED_SHARE = 0.75
JUMP_ROWS = 0.01  # ... in at most this share of the tensor's rows (at least one row)
JUMP_OWN_SHARE = 0.25  # a baseline's own jump holds it in at most this share of the rows
KINK_UNITS = 2  # a divergence followed from a kink crossed at most this many units
# Where the rest of a kinked gradient is off by more than its check allows, it may still be the
# kink's echo: a norm between the weight and the kink (a conv, GroupNorm, ReLU) hands each unit of
# the group a share of the kinked unit's change. The units are then off by a far larger share of
# themselves than the rest is (80x in a ResNet's conv under GroupNorm, model zoo run 52030; 5e4x
# in the norm's bias), where a bug whose error sits where the gradient's energy sits is off by
# about the same share all over (0.36x to 4.6x: the lookalikes of tests/test_kink_lookalikes.py,
# three seeds each, at updates 0 and 1). The units must be off this many times the rest's share.
ECHO = 16

Units = tuple[int, frozenset[int]]  # (axis, indices): rows (0) or columns (1)


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
        self._sums: dict[str, tuple | None] = {}
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
        if name not in self._sums:
            if self._files is None:
                self._files = [
                    run.sketches(self.update) if run.record == "sketch" else None
                    for run in self.runs
                ]
            shape = self.shape(name)
            found = [
                unit_sums_of(run, self.kind, self.update, name, shape, kept)
                for run, kept in zip(self.runs, self._files, strict=True)
            ]
            self._sums[name] = None if any(f is None for f in found) else tuple(found)
        return self._sums[name]


Pair = Whole | Sketched  # what `apart` gives


def unit_sums_of(
    run: Run,
    kind: str,
    update: int,
    name: str,
    shape: tuple[int, ...],
    found: Tensors | None = None,
) -> tuple[np.ndarray, np.ndarray] | None:
    """A tensor's unit sums at an update: as recorded by a sketch-mode run (`found`: its
    sketch file there, read once by the caller), or from its values where the run kept them
    (full files, or a tensor kept whole in its sketch file)."""
    if kind != "grads" or not has_units(shape):
        return None
    if found is not None:
        rows, columns = found.get(f"rows/{kind}/{name}"), found.get(f"columns/{kind}/{name}")
        if rows is not None and columns is not None:
            return np.asarray(rows), np.asarray(columns)
        vector = found.get(f"{kind}/{name}")
        if vector is not None and vector.size == math.prod(shape):
            return unit_sums(vector, shape)
    full = run.grads(update)
    if full is None or name not in full:
        return None
    return unit_sums(full[name], shape)


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


def kink_units(
    merged: np.ndarray,
    ref: np.ndarray,
    most: int | None = None,
    of_rows: float = JUMP_ROWS,
    rest: float = math.inf,
) -> Units | None:
    """The fewest units that hold JUMP_SHARE of the error, as (axis, indices), if they are at
    most `of_rows` of the units (at least one) and at most `most`: rows (axis 0, the units a
    weight feeds, its bias's elements), or for a weight of two or more axes its columns (axis
    1: the units feeding it), the fewer. A unit at its kink changes its own row and the next
    layer's column: a ReLU unit switched on by a pre-activation that is the residue of a
    cancelling sum (a mostly dead net) put a whole jump of 17.6x into one column of the output
    weight, and nowhere else. `rest`: the most error the other units may hold (a norm)."""
    second = np.asarray(ref, dtype=np.float64)
    err = np.asarray(merged, dtype=np.float64) - second
    return units_holding(_energies(err), most, of_rows, JUMP_SHARE, rest, _energies(second))


def _energies(values: np.ndarray) -> list[np.ndarray]:
    """Each row's squared norm, and for two axes or more each column's."""
    squared = (
        values.reshape(values.shape[0], -1) ** 2 if values.ndim > 1 else values.reshape(-1, 1) ** 2
    )
    energies = [squared.sum(axis=1)]
    if values.ndim > 1:
        energies.append(
            (values.reshape(values.shape[0], values.shape[1], -1) ** 2).sum(axis=(0, 2))
        )
    return energies


def units_holding(
    energies: list[np.ndarray] | tuple[np.ndarray, ...],
    most: int | None,
    of_rows: float,
    share: float = JUMP_SHARE,
    rest: float = math.inf,
    own: list[np.ndarray] | tuple[np.ndarray, ...] | None = None,
) -> Units | None:
    """Of the rows' (and the columns') error energies, the fewest units holding `share` of it
    (`kink_units`), the others holding an error of norm at most `rest`, or, given the second
    run's own energies (`own`), off by at most 1/ECHO of the share of themselves the units are
    off by (a kink's echo)."""
    units = []
    for axis, energy in enumerate(energies):
        if axis and energy.shape[0] < 2:
            continue  # one column (a first conv of one input channel): any error is all in it
        limit = max(1, int(of_rows * energy.shape[0]))
        limit = limit if most is None else min(limit, most)
        found = fewest_holding(energy, share, limit)
        if found is not None and not _rest_within(
            energy, found, rest, None if own is None else own[axis]
        ):
            found = None
        if found is not None:
            units.append((len(found), axis, frozenset(found.tolist())))
    return min(units, key=lambda u: (u[0], u[1]))[1:] if units else None


def _rest_within(
    error: np.ndarray, units: np.ndarray, rest: float, own: np.ndarray | None = None
) -> bool:
    """Whether the units other than `units` hold an error of norm at most `rest`, or (`own`:
    the second run's energies of the same units) one at most 1/ECHO of the share of
    themselves `units` are off by (energies summed: estimated ones too, whose sum over many
    units is close)."""
    if math.isinf(rest):
        return True
    inside = np.zeros(error.shape[0], dtype=bool)
    inside[units] = True
    off = float(error[~inside].sum())
    if math.sqrt(off) <= rest:
        return True
    if own is None:
        return False
    # (off / own_rest) · ECHO² <= error_units / own_units, squared shares, without a division
    return off * ECHO**2 * float(own[inside].sum()) <= float(error[inside].sum()) * float(
        own[~inside].sum()
    )


def fewest_holding(energy: np.ndarray, share: float, most: int) -> np.ndarray | None:
    """The indices of the fewest entries of `energy` (squared errors of rows or elements) that
    hold `share` of its sum, if they are at most `most`; None if more, or if the sum is 0 or not
    finite."""
    total = float(energy.sum())
    if not np.isfinite(total) or total <= 0:
        return None
    order = np.argsort(energy, kind="stable")[::-1]
    needed = int(np.searchsorted(np.cumsum(energy[order]), share * total)) + 1
    return order[:needed] if needed <= most else None


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


def many_rows(shape: tuple[int, ...]) -> bool:
    """Whether a kink's few rows are evidence in a tensor of this shape: its error in a few rows
    of a tensor of many (in a tensor of one row, a 0-d temperature or a bias, it always is: a
    wrong loss scale showed as a kink there)."""
    return rows_of(shape) * JUMP_OWN_SHARE >= KINK_UNITS


def many_units(shape: tuple[int, ...]) -> bool:
    """Whether a kink's few units can be evidence in a tensor of this shape: many rows, or many
    columns (a classifier's weight of few classes: the kinked unit is its column; model zoo run
    66003, a convolutional text model at width 4 under SGD with momentum, no reference: one
    channel's column of the 4-class output weight held its error two updates after a kink)."""
    return many_rows(shape) or _many_columns(shape)


def localizes(shape: tuple[int, ...], axis: int) -> bool:
    """Whether units on this axis (0: rows, 1: columns) are a kink's in a tensor of this shape:
    any in one of many rows, columns alone in one of few rows and many columns."""
    return many_rows(shape) or (axis == 1 and _many_columns(shape))


def _many_columns(shape: tuple[int, ...]) -> bool:
    return len(shape) > 1 and int(shape[1]) * JUMP_OWN_SHARE >= KINK_UNITS


def rows_of(shape: tuple[int, ...]) -> int:
    """The rows `kink_units` counts: the first axis, or each element of a 1-D tensor."""
    return int(shape[0]) if len(shape) > 1 else math.prod(shape)
