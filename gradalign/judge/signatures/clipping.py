"""Clipping signatures: a clip applied to partial sums inside the window (by norm or by value),
a clip of the GradScaler's scaled gradients, or a clip at another threshold than the
baseline's."""

from __future__ import annotations

import math

import numpy as np

from ...runs.model import Run, Tensors
from ..checks import PRE_CLIP
from ..results import Comparison, Diagnosis, UpdateResult
from .common import exact_of, failing, finite, grad_norm, noise_share, window, window_scale

_ONCE = (
    "clip once per update: after the K-th backward() (and after unscaling with a "
    "GradScaler), just before optimizer.step()"
)


def clip_state(c: Comparison, run: Run, update: int) -> tuple[bool, float | None]:
    """Whether clipping engaged at `update` (norm before > norm of the recorded gradient), and
    the norm after clipping."""
    if run.grad_norm_pre_clip is None:
        return False, None
    after = grad_norm(c, run, update)
    if after is None:
        return False, None
    return bool(run.grad_norm_pre_clip[update] > after * (1 + 1e-4)), after


def unclipped(c: Comparison, r: UpdateResult) -> float:
    """What turns the stepped gradients' fitted ratio (merged over baseline) into their ratio
    before clipping: a clip that engaged scaled a run's whole gradient by its norm after over
    its norm before, so undoing it multiplies the ratio by (pre/post merged) / (pre/post
    baseline). 1 where neither run's clip engaged."""
    undo = []
    for run in (c.baseline, c.merged):
        clipped, after = clip_state(c, run, r.update)
        before = run.grad_norm_pre_clip[r.update] if run.grad_norm_pre_clip is not None else None
        undo.append(float(before / after) if clipped and after and before else 1.0)
    factor = undo[1] / undo[0]
    return factor if math.isfinite(factor) and factor > 0 else 1.0


def pre_clip_ratio(c: Comparison, update: int) -> float | None:
    """The merged run's norm before clipping over the baseline's, where either run's clip
    engaged (a clip hides a scale in the gradient stepped with; before it, the norms keep it)."""
    pre_b, pre_m = c.baseline.grad_norm_pre_clip, c.merged.grad_norm_pre_clip
    if pre_b is None or pre_m is None or not pre_b[update]:
        return None
    if not any(clip_state(c, run, update)[0] for run in (c.baseline, c.merged)):
        return None
    ratio = float(pre_m[update] / pre_b[update])
    return ratio if math.isfinite(ratio) else None


def _scale_of(c: Comparison, ratio: float) -> float | None:
    """K, 1/K or K+1, the one `ratio` is (within 5%), else None."""
    k = window(c)
    return next((v for v in (k, 1 / k, k + 1) if abs(ratio / v - 1) <= 0.05), None)


_SCALE_ONCE = (
    "scale each micro-batch's loss by its share of the window (1/K, or its items over "
    "the window's items), once"
)


def scale_before_clip(c: Comparison) -> Diagnosis | None:
    """Without a reference, the first failing update failed by its norms before clipping alone
    (checks.py), K, 1/K or K+1 times the baseline's: the loss the gradient comes from was scaled
    and a clip that engaged in both runs hid it from the step, the weights and the gradients."""
    r = failing(c)
    pre_b, pre_m = c.baseline.grad_norm_pre_clip, c.merged.grad_norm_pre_clip
    if r is None or pre_b is None or pre_m is None or not pre_b[r.update]:
        return None
    if not r.loss_ok or not all(d.ok for d in (*r.weights, *r.grads)):
        return None  # a gradient that fails is read by its shape (loss_scale reads it there)
    if {key for key, _ in r.problems} != {PRE_CLIP}:
        return None
    i = r.update
    ratio = float(pre_m[i] / pre_b[i])
    expected = _scale_of(c, ratio) if math.isfinite(ratio) else None
    if expected is None:
        return None
    return Diagnosis(
        "loss-scale",
        f"at update {i} the merged gradient's norm before clipping is {ratio:.4g} times the "
        f"baseline's ({window_scale(window(c), expected)}) while the losses, weights and "
        "clipped gradients agree: the loss the gradient comes from was scaled, and a clip "
        "that engaged in both runs hid it from the step; where the norm falls below the clip "
        "threshold, the merged run will step that many times too far",
        {"update": i, "pre_clip_ratio": finite(ratio), "expected_ratio": expected},
        _SCALE_ONCE,
    )


def scale_behind_clip(c: Comparison, loss_ratio: float) -> Diagnosis | None:
    """The losses disagree and the stepped gradients agree, but the norms before clipping are
    K, 1/K or K+1 apart where a clip engaged: the loss the gradient comes from was scaled, and
    the clip hid it from the step. Once the norm falls below the clip threshold it will not."""
    seen = (
        f"the merged window losses are {loss_ratio:.4g} times the baseline's while the weights "
        "and gradients agree"
    )
    return hidden_scale(c, seen, {"window_loss_ratio": finite(loss_ratio)})


def hidden_scale(c: Comparison, seen: str, evidence: dict) -> Diagnosis | None:
    """`loss-scale`, where the first norms before clipping (with a clip engaged) stand K, 1/K
    or K+1 apart: `seen` says what failed meanwhile (the losses; a GradScaler's overflow)."""
    for i in range(c.merged.updates):
        ratio = pre_clip_ratio(c, i)
        if ratio is None:
            continue
        expected = _scale_of(c, ratio)
        if expected is None:
            return None
        return Diagnosis(
            "loss-scale",
            f"{seen}, because a clip hid the scale: at update {i} the merged gradient's norm "
            f"before clipping is {ratio:.4g} times the baseline's "
            f"({window_scale(window(c), expected)}); where the norm falls below the clip "
            "threshold, the merged run will step that many times too far",
            {"update": i, "pre_clip_ratio": finite(ratio), "expected_ratio": expected, **evidence},
            _SCALE_ONCE,
        )
    return None


def clip_before_unscale(c: Comparison, r: UpdateResult) -> Diagnosis | None:
    """The Recorder saw the merged run clip before its GradScaler's unscale_() in a window up to
    the failing update, the baseline did not: the clip measured the scaled gradient's norm.
    A window clipped more often than the baseline's is left to clip-per-micro."""
    counts = c.merged.clips_before_unscale
    base = c.baseline.clips_before_unscale
    i = r.update
    if counts is None or not counts[: i + 1].any() or (base is not None and base[i]):
        return None
    calls, once = c.merged.clip_calls, c.baseline.clip_calls
    if calls is not None and int(calls[i]) > max(1, 0 if once is None else int(once[i])):
        return None  # clipped inside the window too: clip-per-micro, whatever the scale
    first = int(np.flatnonzero(counts[: i + 1])[0])
    windows = int(np.count_nonzero(counts))
    evidence: dict = {"update": i, "first_window": first, "windows": windows}
    norms = ""
    mb, bb = c.merged.grad_norm_pre_clip, c.baseline.grad_norm_pre_clip
    if mb is not None and bb is not None and bb[first] > 0:
        ratio = float(mb[first] / bb[first])
        evidence.update(pre_clip_norms=[finite(float(mb[first])), finite(float(bb[first]))])
        norms = (
            f"; its norm before clipping was {mb[first]:.4g} against the baseline's "
            f"{bb[first]:.4g} ({ratio:.4g} times: the loss scale it still carried)"
        )
    return Diagnosis(
        "clip-before-unscale",
        f"the merged run clipped before its GradScaler's unscale_() in {windows} window(s) "
        f"(first window {first}): the clip saw the scaled gradients, so it cut them to "
        f"max_norm / scale{norms}; the gradients differ first at update {i}",
        evidence,
        "unscale first: after the window's last backward, call scaler.unscale_(optimizer), "
        "then clip_grad_norm_ (or clip_grad_value_), then scaler.step(optimizer) and "
        "scaler.update()",
    )


def clip_per_micro_counted(c: Comparison, r: UpdateResult) -> Diagnosis | None:
    """The merged run clipped more often in the failing update's window than the baseline did
    per update, and the clip engaged there: partial sums were clipped (by norm or by value)."""
    counts = c.merged.clip_calls
    if counts is None:
        return None
    i = r.update
    once = 1 if c.baseline.clip_calls is None else int(c.baseline.clip_calls[i])
    if int(counts[i]) <= max(once, 1):
        return None
    found = _clip_per_micro(c, r) or _clip_value_per_micro(c, r)
    if found is not None:
        found.evidence["clip_calls"] = {"merged": int(counts[i]), "baseline": once}
        called = "clip_grad_value_" if "clip_value" in found.evidence else "clip_grad_norm_"
        found.message += f" ({called} called {int(counts[i])} times in window {i})"
    return found


def _at_value(grads: Tensors, value: float) -> int:
    """Elements of a gradient that sit at ±the clip value."""
    at = 0
    for g in grads.values():
        g = np.asarray(g)
        at += int(np.count_nonzero(np.abs(g) >= np.asarray(value, dtype=g.dtype)))
    return at


def _clip_value_per_micro(c: Comparison, r: UpdateResult) -> Diagnosis | None:
    """The merged run clipped by value more than once in the window. Where the gradients'
    elements are known, some must sit at the clip value (in either run): a clip that never
    engaged changed nothing."""
    values = c.merged.clip_value
    i = r.update
    if values is None or not math.isfinite(values[i]):
        return None
    value = float(values[i])
    # element values are known for every tensor of a full run, for small ones of a sketched run
    known = {run: exact_of(c, getattr(c, run), "grads", i) or {} for run in ("baseline", "merged")}
    at = {run: _at_value(grads, value) if grads else None for run, grads in known.items()}
    params = sum(t.kind == "param" for t in c.merged.tensors)
    complete = all(len(grads) == params for grads in known.values())
    if complete and not any(at.values()):
        return None
    shown = at["baseline"]
    seen = f"; {shown} elements of the baseline's gradient sit at ±{value:.4g}" if shown else ""
    return Diagnosis(
        "clip-per-micro",
        f"the gradients differ first at update {i}, in a window where the merged run clipped "
        f"by value (clip_value {value:.4g}) more often than the baseline{seen}: clipping was "
        "applied to partial sums inside the window, not once to the merged gradient",
        {
            "update": i,
            "clip_value": value,
            "elements_at_clip_value": at,
            "grad_ratio": finite(r.grad_ratio),
            "grad_cosine": finite(r.grad_cosine),
        },
        _ONCE,
    )


def clip_per_micro(c: Comparison, r: UpdateResult) -> Diagnosis | None:
    """Without clip counts (other writers, older runs): the baseline clipped at the failing
    update and the merged norm before its last clip differs. Tried after the other shapes,
    which that weaker evidence does not rule out."""
    if c.merged.clip_calls is not None:
        return None  # counted: clip_per_micro_counted has decided
    pre_b, pre_m = c.baseline.grad_norm_pre_clip, c.merged.grad_norm_pre_clip
    i = r.update
    if pre_b is not None and pre_m is not None and math.isclose(pre_m[i], pre_b[i], rel_tol=1e-4):
        return None  # the merged run saw the same norm before its clip: clipping is fine
    return _clip_per_micro(c, r)


def _clip_per_micro(c: Comparison, r: UpdateResult) -> Diagnosis | None:
    pre_b, pre_m = c.baseline.grad_norm_pre_clip, c.merged.grad_norm_pre_clip
    if pre_b is None:
        return None
    i = r.update
    clipped, post_b = clip_state(c, c.baseline, i)
    if not clipped or post_b is None:
        return None  # the baseline did not clip here: clipping cannot be the cause
    evidence = {
        "update": i,
        "clip_norm": finite(post_b),
        "baseline_norm_before_clip": finite(pre_b[i]),
        "grad_ratio": finite(r.grad_ratio),
        "grad_cosine": finite(r.grad_cosine),
    }
    if pre_m is not None:
        evidence["merged_norm_before_clip"] = finite(pre_m[i])
    unclipped = [u for u in range(i) if not clip_state(c, c.baseline, u)[0]]
    evidence["earlier_unclipped_updates_that_agree"] = len(unclipped)
    seen = (
        f"; the merged run's norm before its final clip was {pre_m[i]:.4g}"
        if pre_m is not None
        else ""
    )
    return Diagnosis(
        "clip-per-micro",
        f"the gradients differ first at update {i}, where clipping engaged (baseline norm "
        f"{pre_b[i]:.4g} clipped to {post_b:.4g}){seen}: clipping was applied to partial sums "
        "inside the window, not once to the merged gradient",
        evidence,
        _ONCE,
    )


def clip_threshold(c: Comparison, r: UpdateResult) -> Diagnosis | None:
    """Both runs had the same norm before clipping, yet stepped with gradients of other norms:
    the merged run clipped at another max_norm (one scaled with K), or did not clip at all.
    Or both clipped by value, at values recorded apart."""
    by_value = _clip_value_differs(c, r)
    if by_value is not None:
        return by_value
    pre_b, pre_m = c.baseline.grad_norm_pre_clip, c.merged.grad_norm_pre_clip
    if pre_b is None or pre_m is None:
        return None
    i = r.update
    (clipped_b, post_b), (clipped_m, post_m) = (
        clip_state(c, run, i) for run in (c.baseline, c.merged)
    )
    if post_b is None or post_m is None or not (clipped_b or clipped_m):
        return None
    # honest runs' norms differ by the gradient's noise at most (bfloat16: 1.8e-4 seen)
    tol = max(1e-4, noise_share(c, r))
    same_before = math.isclose(pre_m[i], pre_b[i], rel_tol=tol)
    if not same_before:
        return _clip_by_another_norm(c, r, tol)
    if math.isclose(post_m, post_b, rel_tol=tol):
        return None
    evidence = {
        "update": i,
        "norm_before_clip": {"merged": finite(pre_m[i]), "baseline": finite(pre_b[i])},
        "norm_after_clip": {"merged": finite(post_m), "baseline": finite(post_b)},
        "ratio": finite(post_m / post_b) if post_b else None,
    }
    k = window(c)
    scaled = (
        f" ({post_m / post_b:.4g} times, about 1/K = {1 / k:.4g})"
        if post_b and math.isclose(post_m * k, post_b, rel_tol=1e-3)
        else ""
    )
    return Diagnosis(
        "clip-threshold",
        f"at update {i} both runs' accumulated gradients had norm {pre_b[i]:.4g} before clipping; "
        f"{_clip_phrase('baseline', clipped_b, post_b)}, "
        f"{_clip_phrase('merged run', clipped_m, post_m)}"
        f"{scaled}: the merged run clips at another max_norm",
        evidence,
        "clip the accumulated gradient once per update with the baseline's max_norm: it is the "
        "same sum at any K, so max_norm must not be scaled with K",
    )


def _clip_by_another_norm(c: Comparison, r: UpdateResult, tol: float) -> Diagnosis | None:
    """Both clips engaged, the merged run's by a norm ρ times the baseline's, yet it stepped
    with 1/ρ times the baseline's clipped gradient: its clip scaled the same gradient by
    max_norm / (its norm), a norm that was not its gradient's (a clip that saw ρ times the
    gradient would have brought it to max_norm, as the baseline's did)."""
    i = r.update
    pre_b, pre_m = c.baseline.grad_norm_pre_clip[i], c.merged.grad_norm_pre_clip[i]
    (clipped_b, post_b), (clipped_m, post_m) = (
        clip_state(c, run, i) for run in (c.baseline, c.merged)
    )
    if not (clipped_b and clipped_m and post_b and pre_b) or r.grad_cosine is None:
        return None
    rho, stepped = float(pre_m / pre_b), float(post_m / post_b)
    if not math.isclose(rho * stepped, 1.0, rel_tol=max(2 * tol, 1e-3)):
        return None
    world = c.merged.world_size
    sqrt_w = (
        f" (√W = {math.sqrt(world):.4g}: the squares of gradients already averaged over the W "
        "ranks were all-reduced again)"
        if world > 1 and math.isclose(rho, math.sqrt(world), rel_tol=1e-2)
        else ""
    )
    return Diagnosis(
        "clip-threshold",
        f"at update {i} the merged run's clip divided its gradient by a norm {rho:.4g} times "
        f"the baseline's ({pre_m:.4g} against {pre_b:.4g}){sqrt_w}, yet stepped with "
        f"{stepped:.4g} times the baseline's clipped gradient: the norm its clip used was not "
        "the norm of the gradient it clipped (one computed by hand: over one shard or rank, or "
        "over the ranks more than once), so it clipped at another effective max_norm",
        {
            "update": i,
            "norm_before_clip": {"merged": finite(pre_m), "baseline": finite(pre_b)},
            "norm_after_clip": {"merged": finite(post_m), "baseline": finite(post_b)},
            "norm_ratio": finite(rho),
            "ratio": finite(stepped),
        },
        "clip by the norm of the whole accumulated gradient, once per update: "
        "torch.nn.utils.clip_grad_norm_ over every parameter (under FSDP on its sharded "
        "parameters, whose norm spans the ranks); under DDP the gradients are averaged already, "
        "so their norm needs no further all-reduce",
    )


def _clip_phrase(run: str, clipped: bool, after: float) -> str:
    return f"the {run} clipped it to {after:.4g}" if clipped else f"the {run} did not clip it"


def _clip_value_differs(c: Comparison, r: UpdateResult) -> Diagnosis | None:
    values_b, values_m = c.baseline.clip_value, c.merged.clip_value
    i = r.update
    if values_b is None or values_m is None:
        return None
    value_b, value_m = float(values_b[i]), float(values_m[i])
    if not (math.isfinite(value_b) and math.isfinite(value_m)) or value_b == value_m:
        return None
    k = window(c)
    scaled = (
        f" ({value_m / value_b:.4g} times, about 1/K = {1 / k:.4g})"
        if (math.isclose(value_m * k, value_b, rel_tol=1e-3))
        else ""
    )
    return Diagnosis(
        "clip-threshold",
        f"at update {i} the baseline clipped the gradient by value at {value_b:.4g}, the merged "
        f"run at {value_m:.4g}{scaled}: the merged run clips at another clip_value",
        {"update": i, "clip_value": {"merged": value_m, "baseline": value_b}},
        "clip the accumulated gradient once per update with the baseline's clip_value: it is "
        "the same sum at any K, so clip_value must not be scaled with K",
    )
