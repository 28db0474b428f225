"""Two runs' tensors of one kind at one update, as the kink diagnoses read them
(judge/kink_evidence.py builds them): the questions every pair answers (a kink's units, one
input's share, the same input in two tensors), each from both runs' values or, where a run kept
only a sketch or a tensor is too large to read its rank from its values, from grid sums."""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping

import numpy as np

from ..runs.grid_sums import grid_sums, has_slabs, hashed_ones, hashed_rows, slab_grids, slab_ones
from ..runs.unit_sums import has_units
from .kink_shape import (
    JUMP_ROWS,
    JUMP_SHARE,
    KINK_UNITS,
    ONE_INPUT,
    WHOLE,
    Units,
    along_input,
    fused_experts,
    localizes,
    one_input,
    same_input,
    slab_input,
    uniform_energy,
)
from .siblings import sibling_groups
from .two_inputs import member_in_stack, two_components, within_inputs

GRID, SLABS = "grid", "slabs"  # how `TensorPair._ranked` read a rank where no values were kept
# A rank is read from a tensor's values up to this many elements (a 2048 x 2048 matrix); past
# it from its grid sums, made from the values as a sketch-mode run makes them: one input's
# share stays one outer product there. The power iterations over values grow faster than the
# tensor (fused experts of 8 x 2048 x 1024 at a failing update: 8.05 s and 10 float32
# tensors' bytes from the values, 0.094 s from grid sums; `bench/rank_reading.py` at `1072fc1`).
RANK_ELEMENTS = 1 << 22


class TensorPair:
    """Two runs' tensors of one kind at one update (`first`, `second`), and where shares are of
    the distance moved, the second run's at an earlier update (`before`): mappings by name."""

    first: Mapping
    second: Mapping
    before: Mapping | None
    counted: frozenset[str] = frozenset()  # tensors no kink is read in (`counted_per_batch`)
    _made_sums: dict[tuple[str, Callable], tuple | None]  # `_made`'s, by tensor and maker
    _among: dict[str, tuple[str, ...]]  # `_among_siblings`'s groups, by tensor read so

    def units(
        self,
        name: str,
        most: int | None = None,
        of_rows: float = JUMP_ROWS,
        rest: float = math.inf,
        held: float = JUMP_SHARE,
    ) -> Units | None:
        """The fewest units holding `held` (a kink's share) of the tensor's error
        (`units_holding`), the rest within `rest`; None where there are none, or no kink is
        read in the tensor."""
        return None if name in self.counted else self._units(name, most, of_rows, rest, held)

    def _units(
        self, name: str, most: int | None, of_rows: float, rest: float, held: float
    ) -> Units | None:
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
        read = one_input(*both[0], rest, few, None if ones is None else ones(shape))
        return read or self._among_siblings(name, rest)

    def _among_siblings(self, name: str, rest: float) -> Units | None:
        """The tensor's error as two inputs' shares read across the same-role tensors it
        stands among (judge/siblings.py: experts held as separate modules), stacked as fused
        experts' slabs are: JUMP_SHARE of the group's error in two outer products, and of the
        tensor's own in their span, its rest within `rest`; one input's share read whole. Read
        from the group's values up to RANK_ELEMENTS in all, else from their grid sums (the same
        signs for tensors of one shape: their inputs hash alike)."""
        shape = self.shape(name)
        if len(shape) < 2 or not fused_experts((2, shape[0], math.prod(shape[1:]))):
            return None
        groups, own = sibling_groups(name, self.names(), self.shape), None
        if groups:
            own = self._ranked(name)
        if own is None:
            return None
        err = _error(own[0])
        if two_components(err) < JUMP_SHARE * float(np.vdot(err, err)):
            return None  # its error is not in two outer products: no group's reading can hold it
        for group in groups:
            if any(member in self.counted for member in group):
                continue
            pairs, ones = None, None
            if len(group) * math.prod(shape) <= RANK_ELEMENTS:
                pairs = [self._whole(member) for member in group]
            if pairs is None or any(pair is None for pair in pairs):
                pairs, ones = [self._grids(member) for member in group], hashed_ones(shape)
            if any(pair is None for pair in pairs):
                continue
            errors = [_error(pair) for pair in pairs]
            if self._stacked_share(errors, group.index(name), rest, ones):
                self._among[name] = tuple(group)
                return ONE_INPUT, WHOLE
        return None

    def stacked_among(self, name: str) -> tuple[str, ...]:
        """The same-role tensors among which `one_input` read the tensor's error as two inputs'
        shares (`_among_siblings`), for a note; () where it read the tensor alone."""
        return self._among.get(name, ())

    @staticmethod
    def _stacked_share(errors: list, index: int, rest: float, ones: tuple | None) -> bool:
        """Whether member `index` of same-role errors holds two inputs' shares of the group's
        (`_among_siblings`): no uniform offset (`kink_shape.uniform_energy`, `ones` as there)."""
        found, total, own = member_in_stack(errors, index)
        mine = float(np.vdot(errors[index], errors[index]))
        if not (math.isfinite(total) and mine > 0 and found >= JUMP_SHARE * total):
            return False
        if own < JUMP_SHARE * mine or math.sqrt(max(mine - own, 0.0)) > rest:
            return False
        return uniform_energy(errors[index], ones) < JUMP_SHARE * mine

    def within_inputs(self, name: str, other: str) -> bool:
        """Whether a weight's error lies in the two inputs whose shares another's holds
        (`two_inputs.within_inputs`: a router's beside experts', two tokens routed otherwise),
        from both runs' values or grid sums (inputs hashed alike where as many)."""
        columns = [math.prod(self.shape(n)[1:]) for n in (name, other)]
        both = self._ranked(name, other)
        if both is None or columns[0] != columns[1]:
            return False
        return within_inputs(*(_error(pair) for pair in both[0]), JUMP_SHARE)

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
        own, other = self._values(name), self._values(fused)
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
        pairs = [self._values(name) for name in names]
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

    def _values(self, name: str) -> tuple[np.ndarray, np.ndarray] | None:
        """Both runs' tensor where its rank is read from its values: both kept it whole, and
        it holds at most RANK_ELEMENTS elements."""
        return self._whole(name) if math.prod(self.shape(name)) <= RANK_ELEMENTS else None

    def _grids(self, name: str) -> tuple[np.ndarray, np.ndarray] | None:
        """Both runs' grid sums of a tensor, made from its values where both kept them."""
        return self._made(name, grid_sums, has_units)

    def _slabs(self, name: str) -> tuple[np.ndarray, np.ndarray] | None:
        """Both runs' slab grids of a tensor, made from its values where both kept them."""
        return self._made(name, slab_grids, has_slabs)

    def _made(self, name: str, made: Callable, made_for: Callable) -> tuple | None:
        """`made` (grid sums or slab grids) of both runs' values, made once; None where a
        tensor of this shape has none (`made_for`) or either run kept no values."""
        key = (name, made)
        if key not in self._made_sums:
            shape, pair = self.shape(name), self._whole(name)
            found = None if pair is None or not made_for(shape) else pair
            self._made_sums[key] = None if found is None else tuple(made(v, shape) for v in found)
        return self._made_sums[key]

    def rank_read(self, name: str) -> str:
        """How `one_input` read the tensor's rank, for a note: '' from its values."""
        return "" if self._values(name) is not None else ", read from its grid sums"

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


def _error(pair: tuple) -> np.ndarray:
    """A pair's error (first − second) in float64, its trailing axes flattened: a matrix."""
    first, second = pair
    return (np.asarray(first, np.float64) - np.asarray(second, np.float64)).reshape(len(first), -1)
