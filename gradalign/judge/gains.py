"""One element stepped far by the optimizer's gain there: an honest weight difference that a
single baseline draw does not show.

Under momentum (Adam's first moment, heavy-ball SGD) a step is a running sum of gradients, and
where that sum nearly cancels (the element's gradient changed sign) the step is small while its
response to the update's gradient is not: Adam moves an element by about lr·δg/√v̂ for a gradient
error δg, whatever its step. An element whose gradient is small against the learning rate's
scale (a LayerNorm bias element) then moves thousands of times further per unit of gradient
error than its neighbours. Its weight error is the sum of each run's gradient errors there
through that gain, one or two draws: the baseline may draw errors that cancel through the
momentum (0.6 times the tensor's RMS gradient noise, then the other sign), the merged run a
plain 2 RMS, and the tensor, whose whole error sits in that element, fails at the first update
after the sign change (measured: a GPT under Adam with eps 1e-6 at 1.8x, a Transformer encoder
under NAdam at 1.8x, both at update 1, in 870 runs of bench/model_zoo.py).

`follow_gain_divergence` recognises it at the first failing update: no bookkeeping problem, the
loss and every gradient within noise, and each failing weight's error, ≥ `GAIN_SHARE` of it, in
at most `GAIN_ELEMENTS` elements and 10% of the tensor (two of a LayerNorm's 24: under RMSprop a
GPT's bias held 84% in one element and 96% in two). It bounds, per such element i, what the
merged run's own gradient errors could have moved it: Γ_i·Σ_t |g_m − g_ref|_i(t), where Γ_i is the
largest step per unit of gradient the reference's optimizer showed there so far,
max_t |w_ref(t) − w_ref(t−1)|_i / rms_{t'≤t} g_ref,i(t') (Adam's first step is lr·sign(g), so
Γ ≥ lr/|g(0)|; SGD's is lr). From that update on, the tensor may also differ by `GAIN_SLACK`
times the norm of that bound over those elements (the bound grows with the gradient errors it
sums), and a note says so. The elements feed every later forward, so from the next update on
every tensor may also differ by as many times its noise as the followed tensor did, at most
16 (`noise.carry`: model zoo run 6035, a LayerNorm MLP under Adagrad, followed a bias element at
9.3x its noise, and the next update's output-layer gradient stood 5.8x its own).

Where the merged run's gradient at such an element took the other sign than the reference's at
an update whose gradient passed, the two runs' steps there may point apart from that update
on, and the element may also differ by their sum, |Δm| + |Δr| at each update since (the
triangle inequality; no gain is read), the merged run's step counted up to `STEP_RATIO` times
the largest the reference took there so far: an optimizer that steps by the sign (Rprop,
Lion) moves the same distance for a gradient of any size, and Rprop's step sizes stay apart
once the signs seen differ (model zoo run 244281, a mixture of experts under Rprop, float16
autocast: one bias element's gradient +5.3e-6 in the baseline, +5.1e-6 in the reference and
-5.5e-6 in the merged run, within the tensor's noise, where its median element's differs by
2e-7; the merged run stepped it +6e-4 where both others stepped -6e-4, and 1.2e-3 stood 365
times its allowed error, the largest step per unit of gradient allowing 7e-5).

If that does not make the first failing update pass, nothing is widened. Where a run kept
sketches, the tensors kept whole (a LayerNorm's bias, at most the manifest's `whole_1d`
elements) are read as in a full run; where it kept sketches of the tensors this needs, the
failure stays and a note says what would tell it from a bug.
An accumulation bug moves the gradients (which fail) or every element a window touches, not
one or two elements of one tensor through gradients that passed.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from ..runs.model import Run
from .kink_shape import fewest_holding
from .kinks import first_failing
from .metrics import TensorDiff
from .noise import carry
from .results import UpdateResult
from .views import Sketching, exact, full_rerun

GAIN_SHARE = 0.9  # the elements hold at least this share of the tensor's squared error ...
GAIN_ELEMENTS = 2  # ... and are at most this many (and at most 10% of the tensor's elements)
GAIN_SLACK = 2.0  # momentum's bias correction spreads an early error over ~2.6 gains
# A merged step after a sign seen otherwise counts up to this many times the reference's
# largest step there: Rprop's step sizes (x1.2 where the sign held, x0.5 where it flipped, then
# left one update) stand 1.2^2 / 0.5 = 2.88 times apart after one sign seen otherwise
STEP_RATIO = 3.0


def _unreadable(u: int, results: list[UpdateResult]) -> str:
    """The note where the elements' values are unknown: they are followed from the first
    failing update `u` to the last that fails, so a full rerun must reach that one."""
    last = max((r.update for r in results if not r.tensors_ok), default=u)
    through = "up to it" if last == u else f"up to the last that fails, {last}"
    return (
        f"update {u}: weights alone failed while the loss and every gradient stayed within "
        "noise, as when one element's optimizer gain turns gradient noise into its step; "
        "telling that from a bug needs full weights and gradients in both runs at every update "
        f"{through} ({full_rerun(last)})"
    )


def follow_gain_divergence(
    results: list[UpdateResult], merged: Run, ref: Run, factor: float, seen: Sketching | None = None
) -> list[str]:
    """Widen the updates from a high-gain element's divergence on (module docstring); a note if
    the first failing update is one. `seen`: the runs are seen through sketches, whose tensors
    kept whole are read as in full runs."""
    first = first_failing(results)
    if first is None:
        return []
    at = results[first]
    moved = [d for d in at.weights if not d.ok]
    if at.problems or not at.loss_ok or not moved or not at.grads:
        return []  # no gradient recorded: nothing tells a gain from a bug
    if not all(d.ok for d in at.grads):
        return []
    wm, wr = exact(merged, "weights", at.update, seen), exact(ref, "weights", at.update, seen)
    gm, gr = exact(merged, "grads", at.update, seen), exact(ref, "grads", at.update, seen)
    if wm is None or wr is None or gm is None or gr is None:
        return [_unreadable(at.update, results)]
    elements = {}
    for d in moved:
        if d.name not in wm or d.name not in wr:
            return [_unreadable(at.update, results)]  # sketched
        if d.name not in gm or d.name not in gr:
            return []  # a buffer, or a tensor without a gradient: no optimizer gain moved it
        found = _top_elements(wm[d.name], wr[d.name])
        if found is None:
            return []
        elements[d.name] = found
    followed = _bounds(results, merged, ref, elements, seen)
    if followed is None:
        return [_unreadable(at.update, results)]
    bounds, crossings = followed
    widened = _widened(at.weights, bounds[first])
    if not all(d.ok for d in widened if d.name in elements):
        return []
    at.weights[:] = widened
    # measured before widening; a tensor the baseline computed exactly sets no scale to carry
    excess = max((d.error / d.noise for d in moved if d.noise), default=1.0)
    for k in range(first + 1, len(results)):
        results[k].weights[:] = _widened(results[k].weights, bounds[k])
        carry(results[k], excess, factor)  # the elements feed every later forward
    shown = ", ".join(
        f"{name} element {', '.join(map(str, idx))}" for name, idx in elements.items()
    )
    worst = max(moved, key=lambda d: d.ratio)
    signs = "".join(
        f"; {name}'s gradient there took the other sign than the reference's at update {u} "
        "(within the tensor's noise), and from then on they may differ by both runs' steps "
        "there (an optimizer that steps by the sign, as Rprop, took opposite steps)"
        for name, u in crossings.items()
    )
    return [
        f"update {at.update}: {shown} stepped to {worst.ratio:.3g}x its allowed error while the "
        f"loss and every gradient stayed within noise, at least {GAIN_SHARE:.0%} of its error "
        "there: the optimizer's gain there (a step per unit of gradient error many times "
        "its neighbours', as where momentum nearly cancels) turned the merged run's own gradient "
        f"noise into it. From update {at.update} on, those elements may also differ by "
        f"{GAIN_SLACK:g} x the largest step per unit of gradient the reference showed there "
        f"times the merged run's gradient errors there so far{signs}"
    ]


def _top_elements(merged: np.ndarray, ref: np.ndarray) -> tuple[int, ...] | None:
    """The flat indices of the fewest elements holding GAIN_SHARE of the squared error, if they
    are at most GAIN_ELEMENTS and 10% of the elements (at least one)."""
    err = (np.asarray(merged, dtype=np.float64) - np.asarray(ref, dtype=np.float64)).ravel()
    found = fewest_holding(err * err, GAIN_SHARE, min(GAIN_ELEMENTS, max(1, err.size // 10)))
    return None if found is None else tuple(sorted(int(i) for i in found))


def _bounds(
    results: list[UpdateResult],
    merged: Run,
    ref: Run,
    elements: dict[str, tuple[int, ...]],
    seen: Sketching | None,
) -> tuple[list[dict[str, float]], dict[str, int]] | None:
    """Per judged update, per tensor: ||GAIN_SLACK·Γ·Σ|g_m − g_ref| + Σ'(|Δm| + |Δr|)|| over
    its elements, where Σ' sums both runs' steps from the first update at which the merged
    gradient took the other sign than the reference's there while its tensor's gradient passed
    (a sign is all a sign-decided step reads, and the two runs' steps may then point apart,
    which bounds their difference whatever the optimizer), the merged run's each at most
    STEP_RATIO times the reference's largest step there so far; and the tensors whose elements
    crossed so, with that update. None where a run lacks an update's gradients of those tensors
    or the reference its weights, unless neither run's elements moved there: an update a loss
    scaler skipped keeps no gradient (model zoo run 214267, a tiny mixture of experts under
    float16 autocast, Adam with eps 1e-6: update 0 skipped at a scale of 65536, one bias
    element stepped the other way at update 1)."""
    before = exact(ref, "weights", None, seen)
    if before is None or any(name not in before for name in elements):
        return None
    idx = {name: np.asarray(found) for name, found in elements.items()}
    prev = {name: _pick(before, name, i) for name, i in idx.items()}
    prev_m = dict(prev)  # the merged run's elements before each update (the same start)
    squares = {name: np.zeros(len(i)) for name, i in idx.items()}
    gain = {name: np.zeros(len(i)) for name, i in idx.items()}
    errors = {name: np.zeros(len(i)) for name, i in idx.items()}
    crossed = {name: np.zeros(len(i), dtype=bool) for name, i in idx.items()}
    apart = {name: np.zeros(len(i)) for name, i in idx.items()}  # Σ |Δm| + |Δr| since crossed
    largest = {name: np.zeros(len(i)) for name, i in idx.items()}  # the reference's, so far
    crossings: dict[str, int] = {}
    out: list[dict[str, float]] = []
    read = 0  # updates whose gradients were read
    for r in results:
        gm, gr = exact(merged, "grads", r.update, seen), exact(ref, "grads", r.update, seen)
        wr = exact(ref, "weights", r.update, seen)
        if wr is None or any(name not in wr for name in elements):
            return None
        if gm is None or gr is None or any(name not in t for t in (gm, gr) for name in elements):
            if not _still(merged, r.update, idx, seen) or any(
                not np.array_equal(_pick(wr, name, i), prev[name]) for name, i in idx.items()
            ):
                return None
            out.append(out[-1] if out else {name: 0.0 for name in idx})
            continue
        read += 1
        row = {}
        passed = {d.name for d in r.grads if d.ok}
        wm = exact(merged, "weights", r.update, seen)
        for name, i in idx.items():
            g, w, g_m = _pick(gr, name, i), _pick(wr, name, i), _pick(gm, name, i)
            squares[name] += g * g
            rms = np.sqrt(squares[name] / read)
            step = np.abs(w - prev[name])
            np.maximum(gain[name], np.divide(step, rms, out=np.zeros_like(step), where=rms > 0),
                       out=gain[name])  # fmt: skip
            errors[name] += np.abs(g_m - g)
            if name in passed:  # the sign the merged run's noise drew, where its gradient passed
                crossed[name] |= np.sign(g_m) != np.sign(g)
                if crossed[name].any():
                    crossings.setdefault(name, r.update)
            np.maximum(largest[name], step, out=largest[name])
            if wm is not None and name in wm:
                w_m = _pick(wm, name, i)
                own = np.minimum(np.abs(w_m - prev_m[name]), STEP_RATIO * largest[name])
                apart[name] += crossed[name] * (own + step)
                prev_m[name] = w_m
            prev[name] = w
            bound = GAIN_SLACK * gain[name] * errors[name] + apart[name]
            total = float(np.linalg.norm(bound))
            row[name] = total if np.isfinite(total) else 0.0
        out.append(row)
    return out, crossings


def _still(run: Run, update: int, idx: dict[str, np.ndarray], seen: Sketching | None) -> bool:
    """Whether `run` left the elements `idx` where they stood before `update` (its weights
    there or before it unknown: not still)."""
    after = exact(run, "weights", update, seen)
    before = exact(run, "weights", update - 1 if update else None, seen)
    if after is None or before is None:
        return False
    return all(
        name in after
        and name in before
        and np.array_equal(_pick(after, name, i), _pick(before, name, i))
        for name, i in idx.items()
    )


def _pick(tensors, name: str, idx: np.ndarray) -> np.ndarray:
    """The elements `idx` of a tensor, widened to float64 (those alone, not the tensor)."""
    return np.asarray(tensors[name]).ravel()[idx].astype(np.float64)


def _widened(diffs: list[TensorDiff], extra: dict[str, float]) -> list[TensorDiff]:
    return [
        dataclasses.replace(d, allowed=d.allowed + extra[d.name]) if d.name in extra else d
        for d in diffs
    ]
