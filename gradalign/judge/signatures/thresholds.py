"""Clipping at another threshold than the baseline's: another max_norm or clip_value, no clip
at all, or a clip by a norm other than the gradient's own."""

from __future__ import annotations

import math

from ..results import Comparison, Diagnosis, UpdateResult
from .clipping import at_value, clip_calls, clip_state
from .common import exact_of, finite, grad_norm, noise_share, scaling_rules, window

_SAME_MAX_NORM = (
    "clip the accumulated gradient once per update with the baseline's max_norm: it is the same "
    "sum at any K, so max_norm must not be scaled with K"
)


def clip_threshold(c: Comparison, r: UpdateResult) -> Diagnosis | None:
    """Both runs had the same norm before clipping, yet stepped with gradients of other norms:
    the merged run clipped at another max_norm (one scaled with K), or did not clip at all.
    Or both clipped by value, at values recorded apart."""
    by_value = _clip_value_differs(c, r) or _value_clip_in_one_run(c, r)
    if by_value is not None:
        return by_value
    pre_b, pre_m = c.baseline.grad_norm_pre_clip, c.merged.grad_norm_pre_clip
    if pre_b is not None and pre_m is None:
        return _not_clipped(c, r)
    if pre_b is None and pre_m is not None:
        return _clipped_only_merged(c, r)
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
        return _clip_by_another_norm(c, r, tol, (clipped_b, post_b), (clipped_m, post_m))
    if math.isclose(post_m, post_b, rel_tol=tol) or (not clipped_b and _scaled_after(c)):
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
        _SAME_MAX_NORM,
    )


def _scaled_after(c: Comparison) -> bool:
    """Whether the merged run's gradient shrank after its clip by one factor at every update,
    to norms that vary: a scale after the clip (a hook dividing by K), where a clip that
    engaged would have brought each to its one max_norm."""
    pre = c.merged.grad_norm_pre_clip
    shrunk = []
    for r in c.results:
        clipped, after = clip_state(c, c.merged, r.update)
        if clipped and after and pre is not None and pre[r.update] > 0:
            shrunk.append((after / float(pre[r.update]), after))
    if len(shrunk) < 2:
        return False
    factor, norm = shrunk[0]
    one_factor = all(math.isclose(f, factor, rel_tol=1e-3) for f, _ in shrunk)
    return one_factor and not all(math.isclose(n, norm, rel_tol=1e-2) for _, n in shrunk)


def _not_clipped(c: Comparison, r: UpdateResult) -> Diagnosis | None:
    """The baseline clipped and the merged run recorded no clip: its stepped gradient has the
    norm the baseline's had before clipping (to the gradient's noise), so it did not clip."""
    i = r.update
    clipped_b, post_b = clip_state(c, c.baseline, i)
    merged = grad_norm(c, c.merged, i)
    before = float(c.baseline.grad_norm_pre_clip[i])
    tol = max(1e-4, noise_share(c, r))
    if not clipped_b or not merged or not math.isclose(merged, before, rel_tol=tol):
        return None
    return Diagnosis(
        "clip-threshold",
        f"at update {i} the baseline clipped its accumulated gradient from norm {before:.4g} to "
        f"{post_b:.4g}; the merged run stepped with norm {merged:.4g}, the baseline's before "
        "clipping, and recorded no clip: the merged run did not clip (or clipped where the "
        "Recorder does not see it, with no effect)",
        {
            "update": i,
            "norm_before_clip": {"baseline": finite(before)},
            "norm_after_clip": {"merged": finite(merged), "baseline": finite(post_b)},
        },
        "clip the merged run's accumulated gradient once per update, after its last "
        "micro-batch, with the baseline's max_norm (torch.nn.utils.clip_grad_norm_, or the "
        "framework's gradient_clip_val / max_grad_norm)",
    )


def _clipped_only_merged(c: Comparison, r: UpdateResult) -> Diagnosis | None:
    """The merged run clipped and the baseline, whose Recorder saw no clip call in that window,
    did not: the merged clip engaged, and either its norm before clipping is the baseline's
    stepped norm (to the gradient's noise: one clip of the same gradient), or it clipped more
    than once in the window (partial sums) to a norm the baseline's stepped gradient does not
    have (a clip the Recorder did not see would have brought it there). A plain loop clipping at
    0.05 in the merged run only, once per window or at every micro-step, was `loss-scale`
    (0.094 times) or `cross-sample-loss` (tests/test_clip_api.py)."""
    i = r.update
    calls_b, calls_m = clip_calls(c.baseline), c.merged.clip_calls
    if calls_b is None or calls_m is None or int(calls_b[i]) != 0 or int(calls_m[i]) < 1:
        return None
    clipped_m, post_m = clip_state(c, c.merged, i)
    base = grad_norm(c, c.baseline, i)
    if not clipped_m or not post_m or not base:
        return None
    tol = max(1e-4, noise_share(c, r))
    before = float(c.merged.grad_norm_pre_clip[i])
    calls = int(calls_m[i])
    if math.isclose(before, base, rel_tol=tol):
        how = f"from norm {before:.4g}, the baseline's unclipped norm, to {post_m:.4g}"
    elif calls > 1 and not math.isclose(post_m, base, rel_tol=tol):
        how = (
            f"{calls} times inside the window, partial sums (the first from norm "
            f"{before:.4g}), and stepped with norm {post_m:.4g}, where the baseline stepped "
            f"with norm {base:.4g}"
        )
    else:
        return None
    return Diagnosis(
        "clip-threshold",
        f"at update {i} the merged run clipped its gradient {how}, and the baseline did not clip "
        "(its Recorder saw no clip call in that window): the runs clip differently",
        {
            "update": i,
            "clip_calls": {"merged": calls, "baseline": 0},
            "norm_before_clip": {"merged": finite(before)},
            "norm_after_clip": {"merged": finite(post_m), "baseline": finite(base)},
        },
        "clip both runs alike, or neither: once per update, after the window's last "
        "micro-batch, with the same max_norm (a clip the baseline makes by a function imported "
        "by name before its Recorder opened is not seen: pass its norm to "
        "grads(pre_clip_norm=...))",
    )


def _clip_by_another_norm(
    c: Comparison,
    r: UpdateResult,
    tol: float,
    base: tuple[bool, float | None],
    merged: tuple[bool, float | None],
) -> Diagnosis | None:
    """Both clips engaged, the merged run's by a norm ρ times the baseline's, yet it stepped
    with 1/ρ times the baseline's clipped gradient: its clip scaled the same gradient by
    max_norm / (its norm), a norm that was not its gradient's (a clip that saw ρ times the
    gradient would have brought it to max_norm, as the baseline's did). `base`, `merged`: each
    run's `clip_state` at the update."""
    i = r.update
    pre_b, pre_m = c.baseline.grad_norm_pre_clip[i], c.merged.grad_norm_pre_clip[i]
    (clipped_b, post_b), (clipped_m, post_m) = base, merged
    if not (clipped_b and clipped_m and post_b and pre_b) or r.grad_cosine is None:
        return None
    rho, stepped = float(pre_m / pre_b), float(post_m / post_b)
    near = max(2 * tol, 1e-3)
    if math.isclose(rho, 1.0, rel_tol=near):  # the same norm: ρ·(1/ρ) = 1 says nothing
        return None
    if not math.isclose(rho * stepped, 1.0, rel_tol=near):
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


def _value_clip_in_one_run(c: Comparison, r: UpdateResult) -> Diagnosis | None:
    """One run clipped by value at the failing update, the other's Recorder saw no clip call
    there (it watched), and the elements say so: some of the clipping run's gradient sit at
    ±clip_value, some of the other's stand beyond it (it did not clip them). A Lightning Trainer
    that forgot `gradient_clip_val` under `gradient_clip_algorithm="value"` was
    `cross-sample-loss`; the merged run alone clipping, `zero-grad-in-window`."""
    i = r.update
    for clipping, other in (("baseline", "merged"), ("merged", "baseline")):
        values = getattr(c, clipping).clip_value
        calls = clip_calls(getattr(c, other))
        if values is None or not math.isfinite(values[i]) or calls is None or calls[i]:
            continue
        value = float(values[i])
        grads = {run: exact_of(c, getattr(c, run), "grads", i) for run in (clipping, other)}
        if not all(grads.values()):
            return None  # elements not known (sketched): not told
        at, beyond = at_value(grads[clipping], value), at_value(grads[other], value, True)
        if not (at and beyond):
            return None
        named = {"baseline": "baseline", "merged": "merged run"}
        return Diagnosis(
            "clip-threshold",
            f"at update {i} the {named[clipping]} clipped its gradient by value at {value:.4g} "
            f"({at} elements at ±{value:.4g}) and the {named[other]} did not clip (its Recorder "
            f"saw no clip call in that window; {beyond} elements of its gradient stand beyond "
            f"±{value:.4g}): the runs clip differently",
            {
                "update": i,
                "clip_value": {clipping: value},
                "clip_calls": {other: 0},
                "elements_at_clip_value": at,
                "elements_beyond_clip_value": beyond,
            },
            "clip both runs alike, or neither: once per update, after the window's last "
            "micro-batch, with the same clip_value (torch.nn.utils.clip_grad_value_, or the "
            "framework's gradient_clip_val with gradient_clip_algorithm='value')",
        )
    return None


def clip_threshold_recorded(c: Comparison) -> Diagnosis | None:
    """The Recorder saw both runs call clip_grad_norm_ at other max_norms (`update/clip_max_
    norm`): named whether or not the clip engaged in this run, as the first update whose norm
    reaches the lower threshold steps otherwise."""
    bad = [r.update for r in c.results if any(k == "clip_max_norm" for k, _ in r.problems)]
    if not bad:
        return None
    i = bad[0]
    mb, mm = float(c.baseline.clip_max_norm[i]), float(c.merged.clip_max_norm[i])
    k, ratio = window(c), mm / mb if mb else math.inf
    rule = next(
        (f" = {name}" for q, name in scaling_rules(k) if math.isclose(ratio, q, rel_tol=1e-6)), ""
    )
    runs = (c.baseline, c.merged)
    engaged = [r.update for r in c.results if any(clip_state(c, run, r.update)[0] for run in runs)]
    if engaged:
        seen = f"a clip engaged at update {engaged[0]} ({len(engaged)} update(s) clipped)"
    else:
        seen = (
            "no clip engaged in this run (every norm before clipping stayed below both "
            "thresholds), but the first update whose norm passes the lower one steps otherwise"
        )
    return Diagnosis(
        "clip-threshold",
        f"the merged run called clip_grad_norm_ at max_norm {mm:g} and the baseline at {mb:g} "
        f"({ratio:.4g} times{rule}) from update {i} ({len(bad)} update(s)); {seen}",
        {
            "first_update": i,
            "max_norm": {"merged": mm, "baseline": mb},
            "ratio": finite(ratio),
            "K": k,
            "engaged_updates": len(engaged),
        },
        _SAME_MAX_NORM,
    )
