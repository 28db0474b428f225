"""Clipping signatures: a clip applied to partial sums inside the window (by norm or by value),
a clip of the GradScaler's scaled gradients, a scale a clip hid; what a clip did to a run
(`clip_state`). A clip at another threshold than the baseline's: thresholds.py; clips the
Recorder counted inside the windows: clip_counted.py."""

from __future__ import annotations

import math

import numpy as np

from ...runs.model import Run, Tensors
from ..clip_norms import PRE_CLIP
from ..results import Comparison, Diagnosis, UpdateResult
from .common import (
    exact_of,
    failing,
    finite,
    grad_norm,
    on_ranks,
    whole_ratio,
    window,
    window_scale,
)

CLIP_ONCE = (
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
    factor = undo_clip(c, c.merged, r.update) / undo_clip(c, c.baseline, r.update)
    return factor if math.isfinite(factor) and factor > 0 else 1.0


def undo_clip(c: Comparison, run: Run, update: int) -> float:
    """What turns a run's stepped gradient at `update` back into its gradient before clipping:
    its norm before over its norm after, where its clip engaged; 1 where it did not (or where
    the norms are not finite and positive)."""
    clipped, after = clip_state(c, run, update)
    before = run.grad_norm_pre_clip[update] if run.grad_norm_pre_clip is not None else None
    if not (clipped and after and before):
        return 1.0
    factor = float(before / after)
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


def scale_of(c: Comparison, ratio: float) -> float | None:
    """K, 1/K or K+1, the one `ratio` is (within 5%), else None. A log read with -k 1 (one line
    per update) does not say K: the whole number the ratio is."""
    k = window(c)
    if k == 1 and c.merged.kind == "log" and ratio > 0:
        k = whole_ratio(ratio)
    return next((v for v in (k, 1 / k, k + 1) if abs(ratio / v - 1) <= 0.05), None)


def window_of(c: Comparison, scale: float) -> int:
    """K, or for a log read with -k 1 the K that `scale` (`scale_of`) says it was."""
    k = window(c)
    return k if k > 1 or c.merged.kind != "log" else whole_ratio(scale)


SCALE_ONCE = (
    "scale each micro-batch's loss by its share of the window (1/K, or its items over "
    "the window's items), once"
)


def failed_before_clip(c: Comparison) -> UpdateResult | None:
    """The first failing update, where it failed by its norms before clipping alone (both runs
    recorded them); None otherwise."""
    r = failing(c)
    pre_b, pre_m = c.baseline.grad_norm_pre_clip, c.merged.grad_norm_pre_clip
    if r is None or pre_b is None or pre_m is None or not pre_b[r.update]:
        return None
    if not r.loss_ok or not all(d.ok for d in (*r.weights, *r.grads)):
        return None  # a gradient that fails is read by its shape (loss_scale reads it there)
    return r if {key for key, _ in r.problems} == {PRE_CLIP} else None


def scale_before_clip(c: Comparison) -> Diagnosis | None:
    """The first failing update failed by its norms before clipping alone (clip_norms.py), K,
    1/K or K+1 times the baseline's: the loss the gradient comes from was scaled and a clip
    that engaged in both runs hid it from the step, the weights and the gradients."""
    r = failed_before_clip(c)
    if r is None:
        return None
    pre_b, pre_m = c.baseline.grad_norm_pre_clip, c.merged.grad_norm_pre_clip
    i = r.update
    ratio = float(pre_m[i] / pre_b[i])
    expected = scale_of(c, ratio) if math.isfinite(ratio) else None
    if expected is None:
        return None
    said = (
        f"at update {i} the merged gradient's norm before clipping is {ratio:.4g} times the "
        f"baseline's ({window_scale(window_of(c, expected), expected)})"
    )
    if r.weights or r.grads:
        how = (
            " while the losses, weights and clipped gradients agree: the loss the gradient "
            "comes from was scaled, and a clip that engaged in both runs hid it from the step; "
            "where the norm falls below the clip threshold, the merged run will step that many "
            "times too far"
        )
    else:  # a log: its losses alone, no tensor says whether a clip hid the scale
        later = next((u.update for u in c.results if u.update > i and not u.loss_ok), None)
        how = (
            " while that update's losses agree: the loss the gradient comes from was scaled "
            "(its print was not)"
            + (
                f"; the losses part from update {later}, as a step that many times too far "
                "(or a clip that engaged in both runs and hid it) would make them"
                if later is not None
                else "; the later losses agree too: a clip that engaged in both runs, or an "
                "optimizer that steps alike on a scaled gradient (Adam's), hid it from the step"
            )
        )
    return Diagnosis(
        "loss-scale",
        said + how,
        {"update": i, "pre_clip_ratio": finite(ratio), "expected_ratio": expected},
        SCALE_ONCE,
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
        expected = scale_of(c, ratio)
        if expected is None:
            return None
        return Diagnosis(
            "loss-scale",
            f"{seen}, because a clip hid the scale: at update {i} the merged gradient's norm "
            f"before clipping is {ratio:.4g} times the baseline's "
            f"({window_scale(window_of(c, expected), expected)}); where the norm falls below the "
            "clip threshold, the merged run will step that many times too far",
            {"update": i, "pre_clip_ratio": finite(ratio), "expected_ratio": expected, **evidence},
            SCALE_ONCE,
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
    where, ranks = on_ranks(c, "update/clips_before_unscale", first)
    evidence: dict = {"update": i, "first_window": first, "windows": windows, **ranks}
    norms = ""
    mb, bb = c.merged.grad_norm_pre_clip, c.baseline.grad_norm_pre_clip
    if 0 not in ranks.get("ranks", [0]):
        mb = None  # the norm recorded is rank 0's, whose clips saw no scale
    if mb is not None and bb is not None and bb[first] > 0:
        ratio = float(mb[first] / bb[first])
        evidence.update(pre_clip_norms=[finite(float(mb[first])), finite(float(bb[first]))])
        norms = (
            f"; its norm before clipping was {mb[first]:.4g} against the baseline's "
            f"{bb[first]:.4g} ({ratio:.4g} times: the loss scale it still carried)"
        )
    return Diagnosis(
        "clip-before-unscale",
        f"the merged run clipped{where} before its GradScaler's unscale_() in {windows} "
        f"window(s) (first window {first}): the clip saw the scaled gradients, so it cut them to "
        f"max_norm / scale{norms}; the gradients differ first at update {i}",
        evidence,
        "unscale first: after the window's last backward, call scaler.unscale_(optimizer), "
        "then clip_grad_norm_ (or clip_grad_value_), then scaler.step(optimizer) and "
        "scaler.update()",
    )


def at_value(grads: Tensors, value: float, beyond: bool = False) -> int:
    """Elements of a gradient that sit at ±the clip value (a clip by value leaves none past
    it); `beyond`: those past it, which a clip by value would have cut."""
    at = 0
    for g in grads.values():
        g = np.asarray(g)
        limit = np.asarray(value, dtype=g.dtype)
        at += int(np.count_nonzero(np.abs(g) > limit if beyond else np.abs(g) >= limit))
    return at


def clip_value_per_micro(c: Comparison, r: UpdateResult) -> Diagnosis | None:
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
    at = {run: at_value(grads, value) if grads else None for run, grads in known.items()}
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
        "applied inside the window (to partial sums, or to each micro-batch's gradient), not "
        "once to the merged gradient",
        {
            "update": i,
            "clip_value": value,
            "elements_at_clip_value": at,
            "grad_ratio": finite(r.grad_ratio),
            "grad_cosine": finite(r.grad_cosine),
        },
        CLIP_ONCE,
    )


def clip_calls(run: Run) -> np.ndarray | None:
    """A run's clip calls per window: its series, or none at all where a Recorder that watches
    clips wrote none (it writes the series once it saw a call; its `micro/grad_writes` says it
    watched); None where the writer did not say (another writer, a log)."""
    if run.clip_calls is not None:
        return run.clip_calls
    if run.micro_grad_writes is not None:
        return np.zeros(run.updates, dtype=np.int64)
    return None


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
    found = clip_per_micro_engaged(c, r)
    if found is not None and clip_calls(c.merged) is not None and pre_m is None:
        return _clipped_unseen(found, c.baseline.grad_norm_pre_clip[i])
    if found is not None and c.merged.zero_grads_inside is None:  # nothing counted either way
        found.message += (
            "; read from the norms alone (the run counted neither its clips nor its zero_grad "
            "calls): a window that dropped micro-batches' gradients (zero_grad() inside it, a "
            "backward skipped) reads alike, which the counts tell apart (series "
            "update/clip_calls and update/zero_grads_inside: the Recorder writes them; another "
            "writer, by write_run's more_series)"
        )
    return found


def _clipped_unseen(found: Diagnosis, before: float) -> Diagnosis:
    """The Recorder counts every clip function's calls and saw none in the merged run, which
    reported no norm either: whatever clipped it was written by hand, and how it differs
    (inside the window, by another norm, at another max_norm) the run cannot tell."""
    after = found.evidence["clip_norm"]
    return Diagnosis(
        "clip-threshold",
        f"the gradients differ first at update {found.evidence['update']}, where the baseline's "
        f"clip engaged (norm {before:.4g} clipped to {after:.4g}); the merged run called no "
        "clip function (the Recorder counts clip_grad_norm_ and clip_grad_value_) and reported "
        "no norm: it clipped by hand otherwise (by another norm, such as one shard's, one "
        "rank's or each tensor's own, at another max_norm, or inside the window), or not at all",
        {**found.evidence, "clip_calls": {"merged": 0}},
        "clip once per update with torch.nn.utils.clip_grad_norm_ over every parameter (under "
        "FSDP on its sharded parameters, whose norm spans the ranks), just before "
        "optimizer.step(); a clip written by hand can report its norm: "
        "Recorder.grads(pre_clip_norm=...)",
    )


def clip_per_micro_engaged(c: Comparison, r: UpdateResult) -> Diagnosis | None:
    """The merged norm is said as recorded: the first clip's in the window where a Recorder saw
    the clips (a partial sum's), the loop's own where it reported one, or the source's."""
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
    seen = ""
    if pre_m is not None:  # on W ranks, rank 0's own norm before its first clip in the window
        before = "clipping, as recorded,"
        if c.merged.world_size > 1:
            before = "clipping (rank 0's, before its first clip in the window)"
        seen = f"; the merged run's norm before {before} was {pre_m[i]:.4g}"
    return Diagnosis(
        "clip-per-micro",
        f"the gradients differ first at update {i}, where clipping engaged (baseline norm "
        f"{pre_b[i]:.4g} clipped to {post_b:.4g}){seen}: clipping was applied inside the window "
        "(to partial sums, or to each micro-batch's gradient before it was added), not once to "
        "the merged gradient",
        evidence,
        CLIP_ONCE,
    )
