"""A gradient scaled by the wrong factor beside, or behind, something else: read its size every
way it can be read (the fitted ratio, the norm, the norms before clipping), divide it out, and
read what remains (`with_loss_scale`)."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from ..results import Comparison, Diagnosis, UpdateResult
from .clipping import SCALE_ONCE, pre_clip_ratio, unclipped
from .common import failing, finite, noise_share, own_k, scaled_error, window, window_scale
from .decisive import same_start_shown
from .gradient import short_window, window_micro_steps
from .norms import apart, norm_before_clip, norm_ratio, stepped_norm_ratio
from .reweighting import token_normalization
from .zero_grad import ZERO_GRAD_FIX


def with_loss_scale(c: Comparison, r: UpdateResult, turned: bool | str = False) -> list[Diagnosis]:
    """Two causes at once: a gradient K, 1/K or K+1 times too large (within 5%) whose direction
    is off too. The size is read by the fitted ratio, by the norm (the fit shrinks with the
    cosine, the norm does not) and, where a clip engaged, by the fit with the recorded clip
    undone and by the norms before clipping (a clip hides the scale in the gradient stepped
    with). Divide the fitted ratio out and read the rest again: `loss-scale` and the signature
    that explains the remainder (e.g. token normalization), `loss-scale` alone where the
    remainder is within the gradient's noise (a clip hid the scale), or nothing. Where no size
    is within 5%, a reweighting of the micro-batches may have moved it (`_reweighted`).
    `turned`: a cause named beside it turns every gradient a little (BatchNorm, a loss over the
    micro-batch), which explains any remainder; a text: the cause, which nothing names."""
    ratio, k = r.grad_ratio, own_k(c)
    if ratio is None or not math.isfinite(ratio):
        return []
    short = short_window(c, r.update)  # a short window's likelier
    scales = tuple(dict.fromkeys([*([short[0]] if short else []), k, 1 / k, k + 1]))
    stepped = stepped_norm_ratio(c, r)
    norm = norm_before_clip(c, r, stepped)
    found = _near(_sizes(c, r, stepped), scales, norm)
    moved, also = False, None
    if found is not None:
        rest = token_normalization(c, r, scale=ratio)
        alone = rest is None and _remainder_within_noise(c, r, ratio)
        if rest is None and not alone and not turned:
            return []
    else:
        found, rest, also = _reweighted(c, r, scales, norm)
        alone, moved = False, True
        if found is None or rest is None:
            return []
    value, what, expected = found
    beside = (
        "with nothing beyond the gradient's noise left once that is divided out"
        if alone
        else "beside a second cause that turns its direction"
        + (
            (f" ({turned})" if isinstance(turned, str) else " (named with it)")
            if rest is None
            else ""
        )
    )
    evidence = {
        "update": r.update,
        "grad_ratio": finite(ratio),
        "size_ratio": finite(value),
        "expected_ratio": expected,
    }
    near = window_scale(k, expected, window_micro_steps(c, r.update))
    if moved:
        near += ", as near as the reweighting of the micro-batches named beside it lets it come"
    if also is not None:
        evidence["also_near"] = also
        near += f"; {window_scale(k, also, window_micro_steps(c, r.update))} reads about as near"
    losses = _loss_ratio(c, r.update)
    seen = ""
    if losses is not None and abs(losses / expected - 1) <= 0.05:
        evidence["window_loss_ratio"] = losses
        seen = f"; the window losses are {losses:.4g} times the baseline's"
    how, fix = "the loss is scaled by the wrong factor", SCALE_ONCE
    if short is not None and expected == short[0]:
        how, fix = f"the micro-batch losses were {short[1]}", short[2]
    scaled = Diagnosis(
        "loss-scale",
        f"the accumulated gradient{what} is {value:.4g} times the baseline's at update "
        f"{r.update} ({near}), {beside}{seen}: {how}",
        evidence,
        fix,
    )
    return [scaled] if rest is None else [scaled, rest]


_UNDONE = " before clipping (fitted, the recorded clip undone)"


def _reweighted(
    c: Comparison, r: UpdateResult, scales: tuple[float, ...], norm: float | None
) -> tuple[tuple[float, str, float] | None, Diagnosis | None, float | None]:
    """A scale that reweighted micro-batches (each its own mean over unequal item counts) moved
    beyond 5%: merged = s·(g + d), d the reweighting's error. d shifts the fitted size, s·(1 +
    d's share along g), and the norm's, s·||g + d|| / ||g||, in ways of their own: a d turned
    half away from g shrinks the fit towards 0 (a mean over K read as 1/K) and grows the norm.
    Taken where the fitted size (before clipping) is nearer that scale than 1, and either the
    window losses are that scale apart (within 5%), or the norm's size is not nearer 1 and
    either the fit is off by no more than the gradient is turned across (d's share along g
    within its share across, tan of the angle) or the fit and the norm are both nearest that
    scale (d lying along g); of those, the nearest by the size and the losses' ratio together (of
    two about as near, the commoner bug, the other returned as well); and token normalization
    explains what dividing that very scale out leaves. `norm`: `norm_before_clip`'s."""
    cosine, undo = r.grad_cosine, unclipped(c, r)
    if r.grad_ratio is None or cosine is None or not 0 < cosine < 1:
        return None, None, None
    size = r.grad_ratio * undo
    if not size > 0 or not math.isfinite(size):
        return None, None, None
    losses = _loss_ratio(c, r.update)
    across = math.tan(math.acos(cosine))
    if losses is not None and not any(apart(losses, v) < apart(losses, 1) for v in scales):
        losses = None  # nearer no scale: recorded before the loss was scaled, or otherwise

    def nearest_to(x: float, v: float) -> bool:
        """x is nearer v than 1 and than any other scale."""
        return all(apart(x, v) < apart(x, w) for w in (1, *scales) if w != v)

    def fits(v: float) -> bool:
        if apart(size, v) >= apart(size, 1):
            return False  # nearer no scale at all
        if losses is not None and abs(losses / v - 1) <= 0.05:
            return True
        if norm is not None and apart(norm, 1) <= apart(norm, v):
            return False  # the norm reads no scale: a turn shrank the fit (to near 1/K)
        turned = abs(size / v - 1) <= (size / v) * across  # d along g within d across
        return turned or (norm is not None and nearest_to(size, v) and nearest_to(norm, v))

    def distance(v: float) -> float:  # the gradient's size and the losses' ratio together
        return apart(size, v) + (apart(losses, v) if losses is not None else 0.0)

    fitting = sorted((v for v in scales if fits(v)), key=distance)
    if not fitting:
        return None, None, None
    nearest, also = fitting[0], None
    if len(fitting) > 1 and distance(fitting[1]) <= 1.25 * distance(nearest):
        # about as near: the earlier scale is the commoner bug (K before 1/K before K+1)
        nearest, also = sorted(fitting[:2], key=scales.index)
    rest = token_normalization(c, r, scale=nearest / undo)
    if rest is None:
        return None, None, None
    return (size, _UNDONE if undo != 1.0 else "", nearest), rest, also


def _loss_ratio(c: Comparison, update: int) -> float | None:
    """The merged window loss over the baseline's at the update, where both have one sign."""
    mine, base = c.merged.window_losses(), c.baseline.window_losses()
    if update >= min(len(mine), len(base)) or not base[update]:
        return None
    ratio = finite(float(mine[update] / base[update]))
    return ratio if ratio is not None and ratio > 0 else None  # a ratio of sizes, or none


def _remainder_within_noise(c: Comparison, r: UpdateResult, scale: float) -> bool:
    """The merged gradient divided by `scale` stands within its noise (`noise_share`)."""
    error = scaled_error(c, r, scale)
    return error is not None and error <= noise_share(c, r)


def _near(
    sizes: list[tuple[float, str]], expected: tuple[float, ...], norm: float | None = None
) -> tuple[float, str, float] | None:
    """The first size within 5% of an expected ratio: (size, its words, that ratio); none
    where the gradient's `norm` over the baseline's (before clipping) is nearer 1 than that
    ratio: the fit of a gradient turned far from the baseline's shrinks towards 0, the norm
    does not (each micro-batch's mean over K=3, micro-batches of 1, 12 and 35 samples, fitted
    0.32 times the baseline's at cosine 0.27, nearly 1/3, its norm 1.19 times)."""
    for value, what in sizes:
        for v in expected:
            if abs(value / v - 1) <= 0.05 and not (norm and apart(norm, 1) <= apart(norm, v)):
                return value, what, v
    return None


def _sizes(c: Comparison, r: UpdateResult, stepped: float | None) -> list[tuple[float, str]]:
    """The merged gradient's size over the baseline's, each way it can be read, with words;
    `stepped`: `stepped_norm_ratio`'s. Where either run's clip engaged, only the readings
    before it: the gradients stepped with are the clip's (one run clipped to max_norm and the
    other not stand max_norm over the other's norm apart, whatever the bug's size; model zoo
    run 299935, each micro-batch's mean over K=2 with micro-batches of 47 and 1 samples, read
    its merged run's clipped norm 3.05 times the baseline's as K+1 while its fit before the
    clip stood 1.06 times)."""
    i = r.update
    fit = float(r.grad_ratio) if r.grad_ratio is not None else None
    undo = unclipped(c, r)
    before = pre_clip_ratio(c, i)
    if undo != 1.0 or before is not None:  # a clip engaged: the sizes before it
        sizes = [] if fit is None else [(fit * undo, _UNDONE if undo != 1.0 else "")]
    else:
        sizes = [] if fit is None else [(fit, "")]
        if stepped is not None:
            sizes.append((stepped, "'s norm"))
    if before is not None:
        sizes.append((before, "'s norm before clipping"))
    return [(x, what) for x, what in sizes if math.isfinite(x) and abs(x - 1) > 0.05]


def scale_under_reweighting(c: Comparison) -> Diagnosis | None:
    """The last resort's reading of a wrong scale turned by what no signature names: the window
    losses K, 1/K or K+1 times the baseline's at update 0 (identical weights) and at the first
    failing update (within 5%; the runs part after it), and that gradient as near that size
    (`with_loss_scale`, turned). Each micro-batch's own weighted mean (class weights, or tokens
    not counted) both keeps the scale and turns it."""
    r = failing(c)
    if r is None or not c.results:
        return None
    ratios = [_loss_ratio(c, c.results[0].update), _loss_ratio(c, r.update)]
    if any(q is None for q in ratios):
        return None
    k = window(c)
    if not any(all(abs(q / s - 1) <= 0.05 for q in ratios) for s in (k, 1 / k, k + 1)):
        return None
    found = with_loss_scale(
        c,
        r,
        turned="each micro-batch's own weighted mean, such as class weights or tokens not "
        "counted, reweights the micro-batches",
    )
    return found[0] if found and found[0].code == "loss-scale" else None


def scale_beside_unseen_change(c: Comparison) -> Diagnosis | None:
    """The last resort's reading of a wrong scale beside a second change of the gradient: at
    update 0, from identical weights, the gradient's fitted size nearer K, 1/K or K+1 than any
    other and than 1 (within 2x of it) where no signature read it within 5%, and either the
    window losses stand that scale apart (within 5%: the loss backpropagated, recorded so) or
    they agree within 5% and the gradient kept its direction (cosine >= 0.99: the losses were
    recorded before the scale). A loss term dropped or weighted otherwise (label smoothing,
    which near a uniform prediction scales the gradient and barely moves the loss) moved the
    gradient by the rest."""
    r, k = c.results[0] if c.results else None, window(c)
    if r is None or r.update != 0 or all(d.ok for d in r.grads) or not same_start_shown(c):
        return None
    q, size = _loss_ratio(c, 0), (r.grad_ratio or 0.0) * unclipped(c, r)
    if q is None or not size > 0 or not math.isfinite(size):
        return None
    scales = (k, 1 / k, k + 1)
    scale = min((*scales, 1.0), key=lambda v: apart(size, v))
    if scale == 1.0 or apart(size, scale) > math.log(2):
        return None
    kept = r.grad_cosine is not None and r.grad_cosine >= 0.99
    if abs(q / scale - 1) <= 0.05:
        losses = f"the window losses are {q:.4g} times the baseline's, as the loss backpropagated"
    elif abs(q - 1) <= 0.05 and kept:
        losses = (
            f"its direction kept (cosine {r.grad_cosine:.6g}) while the window losses stand "
            f"{q:.4g} times apart, recorded before the scale"
        )
    else:
        return None
    return Diagnosis(
        "loss-scale",
        f"at update 0, from identical weights, the accumulated gradient is {size:.4g} times the "
        f"baseline's, nearer {window_scale(k, scale)} than any other scale, and {losses}: the "
        "loss is scaled by the wrong factor, and a second change moved the gradient "
        f"{size / scale:.4g}x further (a term of the loss dropped or weighted otherwise, such as "
        "label smoothing: near a uniform prediction it scales the gradient and barely moves "
        "the loss)",
        {"update": 0, "grad_ratio": finite(size), "window_loss_ratio": q, "expected_ratio": scale},
        SCALE_ONCE + ", and compute the same loss in both runs (its terms and their weights); "
        "then compare again: what remains is the second change",
    )


OTHER_SAMPLES_WINDOWS = 3  # windows with other samples a scale is read over, at least
OTHER_SAMPLES_SIZE = math.log(1.25)  # how far the gradients' median size may stand from it


@dataclass(frozen=True)
class SizeBesideOtherSamples:
    """The merged gradient's size over the baseline's where other samples turned it: the median
    over `windows` windows from window `first`, their range, the scale (K, 1/K or K+1) it is
    near, and the window losses' median ratio over the first OTHER_SAMPLES_WINDOWS windows,
    where it is within 10% of that scale too (else None: the runs' losses part later, as a wrong
    scale steps them apart)."""

    size: float
    low: float
    high: float
    windows: int
    first: int  # the first window with other samples
    scale: float
    losses: float | None


def size_beside_other_samples(c: Comparison, windows: list[int]) -> SizeBesideOtherSamples | None:
    """Over at least OTHER_SAMPLES_WINDOWS windows with other samples (`data-order`): the merged
    gradient's norm over the baseline's (before clipping, where both runs recorded it), where its
    median stands within 25% of K, 1/K or K+1 and every window's is nearer that scale than 1:
    the scale the window losses say (their median ratio over the first OTHER_SAMPLES_WINDOWS
    windows within 10% of it: the loss recorded is the one backpropagated), else the nearest.
    Other samples turn the gradient, so its fit says nothing, but samples of the same kind
    leave its size about as it was: at the right scale they moved a window's size by up to 31%
    (the selftest's data-order fault, the loops of tests/test_data_order_scale.py, masks drawn
    per batch under the Trainer). The size alone cannot tell a wrong scale from samples of
    another scale: inputs 2.5 times as large at K=2 gave 1.83 times, their losses 1.03 times
    (`scale_beside_other_samples` names a scale only where the losses say it too)."""
    k = window(c)
    sizes = [s for s in (norm_ratio(c, i) for i in windows) if s is not None and s > 0]
    if k < 2 or len(sizes) < OTHER_SAMPLES_WINDOWS:
        return None
    size, scales = float(np.median(sizes)), (k, 1 / k, k + 1)
    losses = [q for q in (_loss_ratio(c, i) for i in windows[:OTHER_SAMPLES_WINDOWS]) if q]
    loss = float(np.median(losses)) if losses else math.nan
    carried = next((v for v in scales if abs(loss / v - 1) <= 0.10), None)
    scale = carried if carried is not None else min(scales, key=lambda v: apart(size, v))
    if apart(size, scale) > OTHER_SAMPLES_SIZE:
        return None
    if any(apart(s, scale) >= apart(s, 1) for s in sizes):
        return None
    return SizeBesideOtherSamples(
        size,
        min(sizes),
        max(sizes),
        len(sizes),
        int(windows[0]),
        scale,
        loss if carried is not None else None,
    )


def scale_beside_other_samples(c: Comparison, seen: SizeBesideOtherSamples) -> Diagnosis | None:
    """`loss-scale` beside other samples, where the gradient's size and the window losses both
    say the scale: the loss recorded is the one backpropagated (as the integrations read it), so
    a wrong scale shows in both, while samples of the same kind left the losses within 7% and
    samples of another scale that moved the size near K left them within 5% (the tests named
    below). A masked-LM collator draws its masks per batch beside a Trainer whose model ignored
    num_items_in_batch (K=4): norms before clipping 3.3 to 5.7 times the baseline's, the losses
    3.93 to 4.08 times (tests/test_integration_transformers.py, tests/test_data_order_scale.py).
    Where the losses do not carry it, the size is said in `data-order`'s message only
    (diagnose.py)."""
    if seen.losses is None:
        return None
    k = window(c)
    return Diagnosis(
        "loss-scale",
        f"beside the other samples, the accumulated gradient's norm is {seen.size:.4g} times the "
        f"baseline's ({window_scale(k, seen.scale)}; the median over the {seen.windows} windows "
        f"that saw other samples, each {seen.low:.3g} to {seen.high:.3g}) and the window losses "
        f"{seen.losses:.4g} times (the median of the first {OTHER_SAMPLES_WINDOWS}), where samples "
        "of the same kind leave both about as they were: the loss is scaled by the wrong factor "
        "too",
        {
            "update": seen.first,
            "size_ratio": seen.size,
            "expected_ratio": seen.scale,
            "windows": seen.windows,
            "window_loss_ratio": seen.losses,
        },
        SCALE_ONCE,
    )


CLEARED_SIZE = 0.75  # the median size, at most, of gradients cleared inside their windows


def zero_grad_beside_other_samples(c: Comparison, windows: list[int]) -> Diagnosis | None:
    """`zero-grad-in-window` beside other samples: the Recorder counted zero_grad() calls inside
    at least OTHER_SAMPLES_WINDOWS windows that saw other samples, and the merged gradient is
    smaller than the baseline's in every one of them, its median at most CLEARED_SIZE, as
    clearing leaves only the last micro-batches' share. Other samples alone left a window's size
    0.63 to 1.53 times the baseline's, never below 1 in every window; cleared beside them, 0.23
    to 0.98 (a throw-away probe, K=2 and 4, 3 seeds each: medians 0.46 to 0.78, named in 5 of
    6) and 0.37 to 0.69 at K=4 in tests/test_data_order_scale.py, where K=2 left 0.45 to 0.93
    (median 0.84, not named: clearing half a window of noisy micro-batches moves the size no
    further than other samples do). A loop that keeps each micro-batch's gradient before
    clearing and adds it back (its own accumulation) leaves the size as other samples do, and is
    not named."""
    counts = c.merged.zero_grads_inside
    if counts is None or window(c) < 2:
        return None
    called = [i for i in windows if i < len(counts) and counts[i]]
    sizes = [s for s in (norm_ratio(c, i) for i in called) if s is not None]
    if len(sizes) < OTHER_SAMPLES_WINDOWS or len(sizes) < len(called):
        return None
    size = float(np.median(sizes))
    if size > CLEARED_SIZE or max(sizes) >= 1:
        return None
    first, calls = called[0], int(sum(counts[i] for i in called))
    return Diagnosis(
        "zero-grad-in-window",
        f"zero_grad() was called {calls} time(s) inside {len(called)} windows that saw other "
        f"samples, between their micro-steps (first: window {first}), and the accumulated "
        f"gradient is smaller than the baseline's in every one ({size:.3g} times, the median; "
        f"each {min(sizes):.3g} to {max(sizes):.3g}), where other samples leave its size about "
        "as it was: what was cleared inside the window is lost",
        {
            "update": first,
            "zero_grad_calls_inside_windows": calls,
            "windows_with_calls": len(called),
            "size_ratio": size,
        },
        ZERO_GRAD_FIX,
    )
