"""Gradients cleared inside the window: zero_grad() counted between two micro-steps, or, where
none was counted, the gradient's shape: about 1/K of the baseline's and pointing elsewhere, over
the whole model or over the tensors one part of the loop clears (a second optimizer's
zero_grad(), which the Recorder does not watch; `p.grad = None` on a head)."""

from __future__ import annotations

import numpy as np

from ..distributed import listed
from ..results import Comparison, Diagnosis, UpdateResult
from .common import finite, grads_of, on_ranks, same_direction, window
from .decisive import draws

ZERO_GRAD_FIX = (
    "call optimizer.zero_grad() once per update, after optimizer.step(), never inside the "
    "micro-batch loop"
)


def zero_grad_counted(c: Comparison, r: UpdateResult) -> Diagnosis | None:
    """The Recorder saw zero_grad() inside the failing update's window, between two of its
    micro-steps, where it discards the gradient accumulated so far; or, none seen, every
    gradient cleared by hand there (`cleared_by_hand`)."""
    counts = c.merged.zero_grads_inside
    if counts is None or not counts[r.update]:
        return cleared_by_hand(c, r)
    if r.grad_ratio is not None and r.grad_ratio >= 1.5:
        # Clearing leaves the last micro-batches' share, which projects on the baseline's
        # gradient by at most about 1 (all of it, where those dominate): a gradient half as
        # large again was not cleared away, the loop kept it elsewhere first (its own buffers).
        return None
    i, calls = r.update, int(counts[r.update])
    windows = int(np.count_nonzero(counts))
    ratio = f"{r.grad_ratio:.3g}" if finite(r.grad_ratio) is not None else "not finite"
    where, ranks = on_ranks(c, "update/zero_grads_inside", i)
    return Diagnosis(
        "zero-grad-in-window",
        f"zero_grad() was called {calls} time(s){where} inside window {i}, between its "
        "micro-steps "
        f"({windows} window(s) so), and the accumulated gradient is {ratio} times the "
        "baseline's: what was cleared inside the window, and not kept elsewhere first, is lost",
        {
            "update": i,
            "zero_grad_calls_inside_window": calls,
            "windows_with_calls": windows,
            "grad_ratio": finite(r.grad_ratio),
            "grad_cosine": finite(r.grad_cosine),
            **ranks,
        },
        ZERO_GRAD_FIX,
    )


def cleared_by_hand(c: Comparison, r: UpdateResult) -> Diagnosis | None:
    """The Recorder saw every gradient gone or replaced by another tensor between two of the
    window's micro-steps (`p.grad = None` in the micro-batch loop: `cleared_inside`), no
    zero_grad() among them, and the gradient is smaller than the baseline's along it, turned or
    short by half the cleared micro-batches' share at least. A loop that assigns a new tensor
    holding the sum so far (`p.grad = p.grad + g`) reads as a clear too: the gradient's size
    tells them apart (probe loop `p.grad = None` before each micro-batch's forward, an MLP
    regressed under Adam, K=4: the last micro-batch's gradient 0.506 times the baseline's along
    it, cosine 0.60, was named `cross-sample-loss`, "2 of the K micro-batches left out")."""
    cleared, before = c.merged.cleared_inside, c.baseline.cleared_inside
    if cleared is None or not cleared[r.update] or (before is not None and before[r.update]):
        return None
    ratio, cosine = finite(r.grad_ratio), finite(r.grad_cosine)
    if ratio is None or cosine is None or not ratio < 1:  # one micro-batch's may even be 0
        return None
    i, lost, size = r.update, int(cleared[r.update]), int(c.merged.sizes[r.update])
    if cosine >= same_direction(c, r) and ratio > 1 - lost / (2 * size):
        return None  # the whole window's gradient, as a sum assigned anew keeps it
    windows = int(np.count_nonzero(cleared))
    return Diagnosis(
        "zero-grad-in-window",
        f"the Recorder saw every gradient cleared by hand (set to None, or to another tensor) "
        f"between micro-steps of window {i}: the first {lost} of its {size} micro-steps' "
        f"gradients were gone before it stepped ({windows} window(s) so; no zero_grad() was "
        f"seen), and the accumulated gradient is {ratio:.3g} times the baseline's (cosine "
        f"{cosine:.4f}): only the last micro-batches' gradient survived",
        {
            "update": i,
            "micro_steps_cleared": lost,
            "windows_cleared": windows,
            "grad_ratio": ratio,
            "grad_cosine": cosine,
        },
        f"{ZERO_GRAD_FIX}; clear no .grad by hand inside it (`p.grad = None`), and accumulate "
        "into .grad in place (`p.grad.add_(g)`)",
    )


def zero_grad_in_window(c: Comparison, r: UpdateResult) -> Diagnosis | None:
    """A gradient about 1/K of the baseline's (nearer it than 1), pointing elsewhere; where the
    Recorder counted no zero_grad() in the window, cleared by hand, unless random numbers drawn
    at every micro-step turn it (NEFTune's embedding noise: `dropout-rng`), or the window's loss
    differs where the weights entering it agree (clearing gradients changes no forward)."""
    counts = c.merged.zero_grads_inside
    if counts is not None and counts[r.update]:
        return None  # zero_grad_counted's
    if counts is not None and draws(c):
        return None  # none seen, and random numbers drawn per micro-step turn it: dropout-rng's
    if not r.loss_ok and all(d.ok for q in c.results[: r.update] for d in q.weights):
        return None  # the window's loss differs from weights that agree: the forward computed
        # otherwise (a loss over the micro-batch, InfoNCE's), which no clearing of gradients does
    ratio, cosine, k = r.grad_ratio, r.grad_cosine, window(c)
    if ratio is None or cosine is None or k < 2:
        return None
    how = " (by hand: `p.grad = None`, `.zero_()` or `p.grad = g`; no zero_grad() was seen)"
    how = how if counts is not None else ""
    if not _cleared(ratio, cosine, k, same_direction(c, r)):
        return _cleared_part(c, r, k, counts is not None)
    return Diagnosis(
        "zero-grad-in-window",
        f"at update {r.update} the accumulated gradient is {ratio:.3g} times the baseline's "
        f"(about 1/K = {1 / k:.3g}) and points elsewhere (cosine {cosine:.4f}): only the last "
        f"micro-batch's gradient survived, the earlier ones were cleared inside the window{how}",
        {"update": r.update, "grad_ratio": finite(ratio), "grad_cosine": finite(cosine), "K": k},
        ZERO_GRAD_FIX,
    )


def _cleared(ratio: float, cosine: float, k: int, same: float) -> bool:
    """About 1/K of the baseline's (K·ratio within [0.5, 2], nearer 1/K than 1), pointing
    elsewhere: what is left of a window's gradient once all but its last micro-batches' were
    cleared."""
    return 0.5 <= ratio * k <= 2.0 and ratio < k**-0.5 and 0 < cosine < same


def _cleared_part(c: Comparison, r: UpdateResult, k: int, watched: bool) -> Diagnosis | None:
    """The tensors that fail, together, cleared (`_cleared`: about 1/K of the baseline's), each
    nearer 1/K than 1 (one micro-batch's share projects on the whole batch's noisily, a bias's
    even against it), while every other tensor passes: one part of the model's gradients was
    cleared inside the window (a second optimizer's zero_grad(), a head cleared by hand)."""
    gb, gm = grads_of(c, c.baseline, r.update), grads_of(c, c.merged, r.update)
    if gb is None or gm is None:
        return None
    failing = [d for d in r.grads if not d.ok]
    if not failing or len(failing) == len(r.grads):
        return None  # none, or the whole model's: the gradient as a whole says that
    if any(d.name not in gb or d.name not in gm for d in failing):
        return None
    bb = mm = bm = 0.0
    for d in failing:
        b, m = (np.asarray(x[d.name], dtype=np.float64).ravel() for x in (gb, gm))
        tb, tm, tbm = float(b @ b), float(m @ m), float(b @ m)
        if not (tb > 0 and tm > 0 and tbm / tb < k**-0.5):
            return None  # each cleared tensor lost most of its gradient (a kept one: about 1)
        bb, mm, bm = bb + tb, mm + tm, bm + tbm
    ratio, cosine = bm / bb, bm / float(np.sqrt(bb * mm))
    if not _cleared(ratio, cosine, k, same_direction(c, r)):
        return None
    names = [d.name for d in failing]
    how = (
        " (by a zero_grad() the Recorder did not watch, as a second optimizer's over those "
        "tensors, or by hand: `p.grad = None`, `.zero_()`)"
        if watched
        else ""
    )
    return Diagnosis(
        "zero-grad-in-window",
        f"at update {r.update} the gradients of {listed(names, 4)} are {ratio:.3g} times the "
        f"baseline's (about 1/K = {1 / k:.3g}) and point elsewhere (cosine {cosine:.4f}), "
        f"while the {len(r.grads) - len(names)} other tensors agree: only the last "
        "micro-batch's gradient of those tensors survived, they were cleared inside the "
        f"window{how}",
        {
            "update": r.update,
            "cleared_tensors": names,
            "grad_ratio": finite(ratio),
            "grad_cosine": finite(cosine),
            "K": k,
        },
        ZERO_GRAD_FIX,
    )
