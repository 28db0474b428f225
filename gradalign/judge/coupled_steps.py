"""A tensor whose whole step the optimizer scaled by a norm that rounding noise moved, read for
the `unexplained` message with a reference and without one.

Some optimizers scale each tensor's step by a number computed over all its elements:
Adafactor's update clipping (the update divided by its RMS over the tensor, transformers'
`Adafactor`, as the Trainer's `optim="adafactor"` builds it), LAMB's and LARS's trust ratio.
Where some of a tensor's elements have gradients that are rounding noise (an attention key
bias: softmax ignores it, so its gradient is noise in both runs), their normalized updates
are as large as the others' and differ between the runs, so that norm differs, and every
other element's step differs from the baseline's by one common factor. Measured (transformers
5.17.0, `optim="adafactor"`, a tiny GPT-2, batch 16 against 4 x 4): at update 2, the key bias's
32 of c_attn.bias's 96 elements took 37% of its step, and the other 64 stepped 1.0085 times as
far as the baseline's, what was left 4.8e-7 of the step. Both runs train the same and part by
noise; without a reference nothing tells how far that noise grows from there (against a float64
rerun the pair passes). `tensor_wide_scale` reads that shape at the first update whose weights
fail (with a reference, in the merged run's steps against the reference's). It reads whole
tensors of a few updates, a slice at a time, on the failing path only.
"""

from __future__ import annotations

import math
from collections.abc import Iterator

import numpy as np

from ..runs.model import Run, Tensors
from ..runs.store import slices
from .drift import TAU
from .results import Comparison
from .views import Sketching, exact

PURE_SCALE = 0.05  # what is left after the common factor, at most this share of the factor
# the elements a common factor is read on, at least: one element fits any factor exactly (a
# 16-bit GroupNorm weight of 16 elements, 15 of them noise, "left 1e-16" under RMSprop, whose
# steps no norm over the tensor scales), so the factor must leave some to check it on
FEW_STEPS = 4
SHAPE = (
    "the shape of an optimizer that scales each tensor's step by a norm over all its elements "
    "(Adafactor's update clipping, LAMB's or LARS's trust ratio), which that noise moved"
)


def tensor_wide_scale(c: Comparison) -> str | None:
    """A clause for the `unexplained` message: without a reference, where every weight tensor
    that fails at the first failing update (its gradients passing) stepped by the baseline's
    step times one factor outside its noise-dominated elements, and those elements hold at
    least that factor's share of its step; with one, `_against_reference`."""
    if c.reference is not None:
        return _against_reference(c)
    r = next((r for r in c.results if any(not d.ok for d in r.weights)), None)
    if r is None or any(not d.ok for d in r.grads):
        return None
    failing = [d.name for d in r.weights if not d.ok]
    i = r.update
    runs = [(run.weights(i), _before(run, i), run.grads(i)) for run in (c.baseline, c.merged)]
    if any(part is None for both in runs for part in both):
        return None
    (wb, pb, gb), (wm, pm, gm) = runs
    found = []
    for name in failing:
        if not all(name in t for t in (wb, pb, gb, wm, pm, gm)):
            return None
        reading = _scaled((gb, gm, wb, pb, wm, pm), name)
        if reading is None:
            return None
        found.append((name, *reading))
    name, dominated, size, share, factor, left = max(found, key=lambda f: abs(f[4] - 1.0))
    more = f" (and {len(found) - 1} more tensors alike)" if len(found) > 1 else ""
    return (
        f"at update {i}, {name}{more}: its elements whose gradient is rounding noise "
        f"({dominated} of {size}) took {share:.0%} of its step, and its other elements stepped "
        f"{factor:.6g} times as far as the baseline's (what is left: {left:.2g} of the step): "
        f"{SHAPE}; both runs then train apart by rounding alone, which only a reference measures"
    )


def _against_reference(c: Comparison) -> str | None:
    """With a reference: the same shape in the merged run's steps against the reference's, at
    the first failing update or the two before it (a step scaled at update i moves every
    gradient from update i + 1 on). The baseline's own distance from the reference is one draw
    of that noise, and a small one where its norm happened to move little: transformers'
    Adafactor on the model zoo's GPT (`bench/model_zoo.py --optimizers hf-adafactor`, run
    180516): the merged run's attention bias stepped 0.98 times as far as the reference's at
    update 1, the baseline's 1.0003 times, and every gradient parted from update 2."""
    assert c.reference is not None
    first = next((r.update for r in c.results if not r.tensors_ok), None)
    if first is None:
        return None
    found = scaled_steps(c.reference, c.merged, max(0, first - 2), first)
    if not found:
        return None
    i, name, dominated, size, share, factor, left = max(found, key=lambda f: abs(f[5] - 1.0))
    return (
        f"at update {i}, {name}: its elements whose gradient is rounding noise ({dominated} of "
        f"{size}) took {share:.0%} of the merged run's step, and its other elements stepped "
        f"{factor:.6g} times as far as the reference's (what is left: {left:.2g} of the step): "
        f"{SHAPE}; the runs then train apart by rounding alone, by more than the baseline's own "
        "distance from the reference (one draw of that noise) shows"
    )


def scaled_steps(
    ref: Run, merged: Run, start: int, last: int, seen: Sketching | None = None
) -> list[tuple]:
    """Each (update, tensor, noise-dominated elements, elements, their share of the step, the
    common factor, what is left) from update `start` to `last` where the merged run's step of
    that tensor shows the shape against the reference's (`_scaled`). `seen`: the runs are seen
    through sketches, and the tensors they kept whole are read (an attention bias, 1-D)."""
    found, runs = [], (ref, merged)

    def read(run: Run, kind: str, i: int) -> Tensors | None:
        return exact(run, kind, i if i >= 0 else None, seen, files=True)

    before = [read(run, "weights", start - 1) for run in runs]  # each update's weights read once
    for i in range(start, last + 1):
        after = [read(run, "weights", i) for run in runs]
        parts = [*after, *before, *(read(run, "grads", i) for run in runs)]
        before = after
        if any(part is None for part in parts):
            continue
        wr, wm, pr, pm, gr, gm = parts
        for name in (n for n in wm if all(n in t for t in (wr, pr, gr, pm, gm))):
            reading = _scaled((gr, gm, wr, pr, wm, pm), name)
            if reading is not None:
                found.append((i, name, *reading))
    return found


def _before(run: Run, i: int) -> Tensors | None:
    """The weights update i started from."""
    return run.weights(i - 1) if i > 0 else run.init_weights()


def _scaled(parts: tuple[Tensors, ...], name: str) -> tuple[int, int, float, float, float] | None:
    """(noise-dominated elements, elements, their share of either run's step energy (the
    larger: a float64 reference steps them by almost nothing), the common factor of the
    others' steps, the residual's share of their step) where tensor `name` shows the shape,
    else None. `parts`: the two gradients, then each run's weights after and before the step
    (gb, gm, b, pb, m, pm). Dominated as `drift.shared_steps` reads it: neither gradient above
    TAU times their difference (or the tensor's RMS difference). Read SLICE elements at a time
    in three passes (the gradients' RMS difference, the sums, the residual), so a tensor of any
    size takes a slice's memory."""
    sq, size = 0.0, 0
    for gb, gm in zip(slices(parts[0], name), slices(parts[1], name), strict=True):
        diff = gb.astype(np.float64) - gm
        sq, size = sq + float(np.dot(diff, diff)), size + diff.size
    rms = math.sqrt(sq / size) if size else 0.0
    # dominated elements; Σ db², Σ dm² over all and over the dominated; Σ dbr², Σ dmr·dbr
    count, total, moved, total_in, moved_in, base, cross = 0, *([0.0] * 6)
    for dominated, db, dm in _steps(parts, name, rms):
        count += int(np.count_nonzero(dominated))
        total, moved = total + float(np.dot(db, db)), moved + float(np.dot(dm, dm))
        dbd, dmd = db[dominated], dm[dominated]
        total_in, moved_in = total_in + float(np.dot(dbd, dbd)), moved_in + float(np.dot(dmd, dmd))
        dbr, dmr = db[~dominated], dm[~dominated]
        base, cross = base + float(np.dot(dbr, dbr)), cross + float(np.dot(dmr, dbr))
    if count == 0 or size - count < FEW_STEPS or total == 0.0 or base == 0.0:
        return None
    factor = cross / base
    residual = 0.0
    for dominated, db, dm in _steps(parts, name, rms):
        off = dm[~dominated] - factor * db[~dominated]
        residual += float(np.dot(off, off))
    left = math.sqrt(residual / base)
    share = max(total_in / total, moved_in / moved if moved > 0 else 0.0)
    apart = abs(factor - 1.0)
    if apart == 0.0 or left > PURE_SCALE * apart or apart > share:
        return None
    return count, size, share, factor, left


def _steps(
    parts: tuple[Tensors, ...], name: str, rms: float
) -> Iterator[tuple[np.ndarray, np.ndarray, np.ndarray]]:
    """Slice by slice of tensor `name` (`_scaled`'s `parts`): which elements are dominated,
    and both runs' steps there, in float64."""
    for gb, gm, b, pb, m, pm in zip(*(slices(t, name) for t in parts), strict=True):
        gb, gm = gb.astype(np.float64), gm.astype(np.float64)
        diff = np.abs(gb - gm)
        dominated = np.maximum(np.abs(gb), np.abs(gm)) <= TAU * np.maximum(diff, rms)
        yield dominated, b.astype(np.float64) - pb, m.astype(np.float64) - pm
