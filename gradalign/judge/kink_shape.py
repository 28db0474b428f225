"""Where a kink's error sits: the fewest units (rows or columns) of a tensor that hold it, the
rest of the tensor bounded, and the shapes in which a few units are evidence of a kink at all
(judge/kink_evidence.py reads the tensors; judge/kinks.py and judge/kink_divergence.py judge)."""

from __future__ import annotations

import math

import numpy as np

from ..runs.model import Tensors
from ..runs.store import slices
from ..runs.unit_sums import BLOCK
from .two_inputs import SPAN, delta_share, in_span, stacked_inputs

JUMP_SHARE = 0.9  # a kink's jump holds this share of its error ...
# ... in the energies unit sums estimate, this share: each unit's estimate is its energy times a
# chi-square of 8 degrees of freedom over 8, so a unit holding 90% is seen holding 75% in 95% of
# draws (99.99% at 99%), one holding half the error in 0.2% (arithmetic, the rest's energy taken
# as known; `tests/test_unit_sums.py` draws it)
ESTIMATED_SHARE = 0.75
JUMP_ROWS = 0.01  # ... in at most this share of the tensor's rows, rounded up (at least one row:
# two units crossed at once in a tensor of 101 to 200 rows, model zoo run 197901)
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
ONE_INPUT = 2  # the axis `one_input` names: one input's outer product, not rows or columns
POWER_STEPS = 64  # power iterations of `one_input` at most (a rank-one error converges in 2)
ONE_INPUT_SLABS = 2  # a token routed to another expert leaves one slab and joins another
WHOLE = frozenset({-1})  # `one_input`'s units where the tensor is read whole, not by slabs


def kink_units(
    merged: np.ndarray,
    ref: np.ndarray,
    most: int | None = None,
    of_rows: float = JUMP_ROWS,
    rest: float = math.inf,
    held: float = JUMP_SHARE,
) -> Units | None:
    """The fewest units that hold `held` (JUMP_SHARE) of the error, as (axis, indices), if
    they are at most `of_rows` of the units (at least one) and at most `most`: rows (axis 0,
    the units a weight feeds, its bias's elements), or for a weight of two or more axes its
    columns (axis 1: the units feeding it), the fewer. A unit at its kink changes its own row
    and the next layer's column: a ReLU unit switched on by a pre-activation that is the
    residue of a cancelling sum (a mostly dead net) put a whole jump of 17.6x into one column
    of the output weight, and nowhere else. `rest`: the most error the other units may hold
    (a norm)."""
    return kink_units_in({"t": merged}, {"t": ref}, "t", np.shape(ref), most, of_rows, rest, held)


def kink_units_in(
    first: Tensors,
    second: Tensors,
    name: str,
    shape: tuple[int, ...],
    most: int | None = None,
    of_rows: float = JUMP_ROWS,
    rest: float = math.inf,
    held: float = JUMP_SHARE,
) -> Units | None:
    """`kink_units` of tensor `name` (of `shape`) of two runs' tensors, read from their files
    a block of whole rows at a time where they are files."""
    energies, own = _energies(first, second, name, shape)
    return units_holding(energies, most, of_rows, held, rest, own)


def one_input(
    merged: np.ndarray,
    ref: np.ndarray,
    rest: float = math.inf,
    few: bool = False,
    ones: tuple[np.ndarray, np.ndarray] | None = None,
) -> Units | None:
    """A rank-one error, `(ONE_INPUT, slabs)`: JUMP_SHARE of the error's energy in one outer
    product of a row vector by a column vector, the remainder's norm at most `rest`, in a
    tensor of many rows and many columns (its trailing axes flattened). A weight's gradient is
    Σ δ_s x_sᵀ over its inputs s: one input's share gained or lost whole is rank one, spread
    over every row and column, where a kink holds a few units. A choice made per input (a token
    routed to another expert, an argmax, a tie) went one way in one run and the other way in
    the other: model zoo run 181940 (a mixture of experts, AdamW, bfloat16 autocast) failed its
    expert 2's first gradient at 42x its noise at update 6 alone, 99.9% of the error in one
    outer product, the rest within noise; expert 3's, where the token went, 99.8%. Experts
    fused in one tensor of three axes or more (experts, out, in), as transformers' mixtures of
    experts hold them, are read slab by slab too: a token routed elsewhere leaves one expert's
    slab and joins another's, so at most ONE_INPUT_SLABS slabs (`slabs`, their indices; WHOLE
    for the tensor read whole) hold JUMP_SHARE of the energy, each of them rank one; or two
    tokens moved at once, over any of the slabs: JUMP_SHARE of the energy in two outer products
    of the slabs stacked on one side (judge/two_inputs.py; `slabs`, the fewest holding
    JUMP_SHARE of it), read in tensors of three axes whose slabs have 16 rows and columns at
    least (not a convolution's few taps, whose error any two components may hold). Each
    rank-one energy is read by power iteration from the largest row, a bound from below (never
    more than the share it has). `few`: a matrix of few rows or columns read too, whole (a
    router's gradient, one row per expert, beside experts whose errors hold one input's share
    already: judge/choices.py `same_inputs`). A uniform offset, JUMP_SHARE of the energy in the
    outer product of the all-ones row and column (`ones`: those vectors as the arrays hold the
    tensor's rows and columns, hashed in grid sums; None: the arrays are the tensor), is rank one
    and no input's share: a term c·Σw in the loss adds c to every element of the gradient, at
    every update (tests/test_sketch_walk.py, read from grid sums at width 31)."""
    second = np.asarray(ref, dtype=np.float64)
    err = np.asarray(merged, dtype=np.float64) - second
    if err.ndim < 2:
        return None
    total = float(np.vdot(err, err))
    if not (math.isfinite(total) and total > 0):
        return None
    flat = err.reshape(err.shape[0], -1)
    found, held = (_rank_one(flat), WHOLE) if few or _many(flat) else (0.0, WHOLE)
    if err.ndim > 2 and found < JUMP_SHARE * total and _many(err[0].reshape(err.shape[1], -1)):
        slabs = err.reshape(err.shape[0], err.shape[1], -1)
        energies = np.einsum("ijk,ijk->i", slabs, slabs)
        most = fewest_holding(energies, JUMP_SHARE, ONE_INPUT_SLABS)
        if most is not None:  # the slabs holding most of the energy
            found, held = sum(_rank_one(slabs[i]) for i in most), frozenset(most.tolist())
        if found < JUMP_SHARE * total and fused_experts(err.shape):
            found = stacked_inputs(slabs)  # two tokens moved at once, over any of the slabs
            held = frozenset(fewest_holding(energies, JUMP_SHARE, len(energies)).tolist())
    if found < JUMP_SHARE * total or math.sqrt(max(total - found, 0.0)) > rest:
        return None
    if uniform_energy(flat, ones) >= JUMP_SHARE * total:  # read whole or stacked, no input's share
        return None
    return ONE_INPUT, held


def fused_experts(shape: tuple[int, ...]) -> bool:
    """Whether a tensor of this shape reads as experts fused along its first axis: three axes,
    each slab 16 rows and columns at least (for two tokens' components to say anything; a
    convolution of one spatial axis has a few taps)."""
    return len(shape) == 3 and _enough(shape[1:], SPAN)


def uniform_energy(matrix: np.ndarray, ones: tuple[np.ndarray, np.ndarray] | None) -> float:
    """The energy of a matrix's projection on the outer product of its all-ones row and column
    (`ones`, as hashed; None: ones): a uniform offset's."""
    rows, columns = (
        ones if ones is not None else (np.ones(matrix.shape[0]), np.ones(matrix.shape[1]))
    )
    scale = float(rows @ rows) * float(columns @ columns)
    return float(rows @ matrix @ columns) ** 2 / scale if scale > 0 else 0.0


def _many(matrix: np.ndarray) -> bool:
    """Whether a matrix has rows and columns enough for its rank to say anything."""
    return _enough(matrix.shape, 1)


def _enough(dims: tuple[int, ...], rank: int) -> bool:
    """Whether a matrix of these rows and columns has enough of both for its first `rank`
    components to say anything."""
    return min(dims) * JUMP_OWN_SHARE >= KINK_UNITS * rank


def _rank_one(matrix: np.ndarray) -> float:
    """The energy of a matrix's first singular component (σ₁²), by power iteration from its
    largest row (`_first_component`)."""
    return _first_component(matrix)[0]


def _first_component(matrix: np.ndarray) -> tuple[float, np.ndarray, np.ndarray]:
    """A matrix's first singular component by power iteration from its largest row: its energy
    ||E v||² / ||v||², the Rayleigh quotient of EᵀE, rising to its largest eigenvalue (a bound
    from below where it stops early), E v, along its first left singular vector, and v, along
    its first right one."""
    v = matrix[int(np.argmax(np.einsum("ij,ij->i", matrix, matrix)))]
    top, left, right = 0.0, matrix @ v, v
    for _ in range(POWER_STEPS):
        u = matrix @ v
        found = float(u @ u) / float(v @ v)
        if found <= top * (1 + 1e-9):
            break
        top, left, right = found, u, v
        v = matrix.T @ u
        v /= math.sqrt(float(v @ v))
    return top, left, right


def along_input(weight: tuple[np.ndarray, np.ndarray], bias: tuple[np.ndarray, np.ndarray]) -> bool:
    """Whether a bias's error is the same inputs' share as its weight's rank-one error
    (`one_input`): JUMP_SHARE of the bias error's energy along the weight error's first left
    singular vector. A weight's gradient is Σ δ_s x_sᵀ and its bias's Σ δ_s: one input's
    share gained or lost whole is δ_s x_sᵀ in the weight and δ_s in the bias, which may stand
    off by a larger share of itself than the weight does (model zoo run 189608, a tiny mixture
    of experts under bfloat16: a token routed otherwise at update 19, expert 3's second weight
    15% off, its bias 27%). Where the weight's error is two inputs' shares (JUMP_SHARE in two
    outer products, less in one: two tokens, judge/two_inputs.py), the bias's lies in their two
    δ (model zoo run 285856: 98.9% to 99.99%, 0.002% to 94% along the first alone). `weight`,
    `bias`: each (first run's, second run's)."""
    err = np.asarray(weight[0], dtype=np.float64) - np.asarray(weight[1], dtype=np.float64)
    off = np.asarray(bias[0], dtype=np.float64) - np.asarray(bias[1], dtype=np.float64)
    if err.ndim != 2 or off.shape != err.shape[:1]:
        return False
    top, left, _ = _first_component(err)
    if top < JUMP_SHARE * float(np.vdot(err, err)):
        two = delta_share(off, err, JUMP_SHARE)  # two inputs' δ (judge/two_inputs.py)
        if two is not None:
            return two >= JUMP_SHARE
    return _along(left, off)


def same_input(first: tuple[np.ndarray, np.ndarray], second: tuple[np.ndarray, np.ndarray]) -> bool:
    """Whether two weights' rank-one errors are the same input's share: δ₁ xᵀ and δ₂ xᵀ, their
    first right singular vectors one line (JUMP_SHARE of the energy; trailing axes flattened,
    as many columns in both). A token's embedding feeds a router and the experts' first layers:
    model zoo runs 189608, 189706 and 190402 (a tiny mixture of experts under bfloat16), the
    router's error along the experts' at 0.996 to 0.998. A classifier's few rows beside a
    convolution are no such pair, whatever their ranks (run 189218, a ResNet under Adamax with
    a micro-batch's weight wrong, `mean-over-k`: the output weight 99.5% rank one, 4 rows)."""
    errors = [np.asarray(a, np.float64) - np.asarray(b, np.float64) for a, b in (first, second)]
    if any(e.ndim < 2 for e in errors):
        return False
    flat = [e.reshape(e.shape[0], -1) for e in errors]
    if flat[0].shape[1] != flat[1].shape[1]:
        return False
    return _along(_first_component(flat[0])[2], _first_component(flat[1])[2])


def slab_input(
    first: tuple[np.ndarray, np.ndarray],
    fused: tuple[np.ndarray, np.ndarray],
    slab: int,
    hashed: bool = False,
) -> bool:
    """Whether a weight's rank-one error (a router's, δ xᵀ) is the same input's share as slab
    `slab` of fused experts' (experts first, one outer product in the slab: `one_input`): its
    first right singular vector along either of the slab's, the input axis standing last
    (Mixtral's `gate_up_proj`, experts x out x in) or first (gpt-oss's, experts x in x out).
    Model zoo run 233003 (transformers' Mixtral under float16 autocast, RAdam, K=4): a token
    routed from expert 0 to 2 at update 4, the router's gradient 4.9% off along slab 0's input
    and slab 2's. `hashed`: grid sums, the weight's and the slab grids' (runs/grid_sums.py),
    whose columns hash alike where there are as many: the right vectors alone compare."""
    err = np.asarray(first[0], np.float64) - np.asarray(first[1], np.float64)
    whole = np.asarray(fused[0], np.float64) - np.asarray(fused[1], np.float64)
    if err.ndim != 2 or whole.ndim < 3 or not 0 <= slab < whole.shape[0]:
        return False
    matrix = whole[slab].reshape(whole.shape[1], -1)
    top, left, right = _first_component(matrix)
    line = _first_component(err)[2]
    vectors = (right,) if hashed else (left, right)
    if top < JUMP_SHARE * float(np.vdot(matrix, matrix)):  # two tokens' slab: their span
        return in_span(line, matrix, JUMP_SHARE, right_only=hashed)
    return any(v.shape == line.shape and _along(v, line) for v in vectors)


def _along(line: np.ndarray, vector: np.ndarray) -> bool:
    """Whether JUMP_SHARE of `vector`'s energy lies along `line`."""
    total, scale = float(vector @ vector), float(line @ line)
    if not (math.isfinite(total) and total > 0 and math.isfinite(scale) and scale > 0):
        return False
    return float(line @ vector) ** 2 / scale >= JUMP_SHARE * total


def _energies(
    merged: Tensors, ref: Tensors, name: str, shape: tuple[int, ...]
) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """Each row's squared norm, and for two axes or more each column's, of tensor `name`'s
    error (merged − ref) and of `ref`'s: in float64, a block of whole rows at a time (about
    BLOCK elements; runs/store.py `slices`), so a tensor of any size takes a block's memory."""
    rows = shape[0] if len(shape) else 1
    columns = shape[1] if len(shape) > 1 else 0
    width = max(math.prod(shape[1:]), 1)
    found = [[np.zeros(rows), np.zeros(columns)] for _ in range(2)]
    size = max(1, BLOCK // width) * width  # whole rows
    first = 0
    for m, r in zip(slices(merged, name, size), slices(ref, name, size), strict=True):
        second = np.asarray(r, np.float64).reshape(-1, width)
        err = np.asarray(m, np.float64).reshape(-1, width) - second
        for values, (row_energies, column_energies) in zip((err, second), found, strict=True):
            squared = values * values
            row_energies[first : first + len(values)] = squared.sum(axis=1)
            if columns:
                column_energies += squared.reshape(len(values), columns, -1).sum(axis=(0, 2))
        first += len(second)
    (error_rows, error_columns), (own_rows, own_columns) = found
    if not columns:
        return [error_rows], [own_rows]
    return [error_rows, error_columns], [own_rows, own_columns]


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
        limit = max(1, math.ceil(round(of_rows * energy.shape[0], 9)))
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


def many_rows(shape: tuple[int, ...]) -> bool:
    """Whether a kink's few rows are evidence in a tensor of this shape: its error in a few rows
    of a tensor of many (in a tensor of one row, a 0-d temperature or a bias, it always is: a
    wrong loss scale showed as a kink there)."""
    return rows_of(shape) * JUMP_OWN_SHARE >= KINK_UNITS


def held_in_many_rows(shape: tuple[int, ...], units: Units) -> bool:
    """Whether a jump held in `units` of a tensor of `shape` is evidence by where it sits
    (`many_rows`): one input's share read in fused experts' slabs is read in a slab's rows (each
    slab's error rank one, or two tokens' rank two), however few experts the tensor holds. Model
    zoo run 255552 (transformers' Mixtral of 4 experts under float16 autocast, SGD with
    Nesterov, K=4): a token routed otherwise at update 16, slabs 0 and 2 of both fused weights
    one input's share, every weight within its noise; read by the fused tensors' first axis, 4
    experts, no tensor held many rows and the jump went unread."""
    if units[0] == ONE_INPUT and units[1] != WHOLE and len(shape) >= 3:
        return many_rows(shape[1:])
    return many_rows(shape)


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
