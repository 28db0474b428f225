"""Name the cause of a divergence from the recorded numbers alone (never from a fault label).

Each signature reads only what both runs recorded: bookkeeping (weight digests inside a window,
optimizer step counts, learning rates), sample digests, the model's structure facts, losses and
the accumulated gradients. Bookkeeping, data and structure signatures are decisive and may
co-occur; the gradient-shape signatures (loss scale, token normalization, clipping, zero_grad)
are tried only when none of those explains the run (beside other samples, `data-order`, a wrong
scale is still read from the gradient's size). When nothing fits: "unexplained", with evidence.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

from . import signatures as sig
from .below_noise import scaled_within_tolerance
from .checks import sample_mismatches
from .coupled_steps import tensor_wide_scale
from .hints import FLOAT64_RERUN, unexplained_hints
from .passing import why_it_passes
from .results import FAIL, Comparison, Diagnosis, UpdateResult
from .signatures import distributed as ranked
from .signatures import failing, finite
from .signatures.batch_size import FOLLOWS as BATCH_SIZE_FOLLOWS
from .signatures.common import window, window_scale
from .signatures.framework_fixes import for_framework
from .stepped_choice import stepped_choice

DECISIVE: list[Callable[[Comparison], Diagnosis | None]] = [
    sig.batch_size,
    sig.unrecorded_micro_batches,  # windows short of a micro-batch, stepped once each
    sig.window_bookkeeping,
    sig.step_in_window,
    sig.step_count,  # the optimizer's own counter, step() as often
    sig.group_step_count,  # a counter a loop keeps in the param groups
    sig.step_skipped,
    sig.weights_changed_in_window,
    sig.written_between_micro_steps,  # as the baseline's forward writes: by their timing
    sig.scaler_per_micro,
    sig.clip_per_micro_unengaged,  # counted inside the windows, engaged nowhere
    sig.clip_threshold_recorded,  # the max_norms the Recorder saw, engaged or not
    sig.scaler_skips,
    sig.overflow_carried,
    sig.micro_batch_missing,
    sig.optimizer_type,  # another torch.optim class: its lr and betas differ as a consequence
    sig.lr_scaled,
    sig.lr_schedule,
    sig.trained_from_another_update,
    sig.frozen_inside_window,  # frozen at a count of micro-steps
    sig.optimizer_settings,
    sig.weights_decayed,  # after the settings: another weight_decay there is named there
    sig.scale_before_clip,  # a scale only the norms before clipping kept
    sig.replica_divergence,
    sig.card_loss,
    sig.data_order,
    sig.batch_targets,
    sig.batchnorm,
    sig.dropout_rng,
    sig.dropout_stopped,  # eval() mode left on from some update
    sig.loss_averaging,
    sig.cross_sample_loss,
]
# Causes in the model or its loss that move every gradient a little, by the batch's size alone:
# an accumulation bug in the loop shows beside them as it does alone, and is named first.
BESIDE_SHAPES = {"batchnorm", "cross-sample-loss", "dropout-rng", "loss-averaging"}
# Settings the optimizer steps with: no gradient computed from the same weights (update 0's)
# can follow from them, so a gradient that fails there is another cause, read by its shape
# (the learning rate K times the baseline's, or a scheduler stepped per micro-step, beside a
# loss not divided by K was named alone: tests/test_optimizer_order.py,
# tests/test_schedule_pace.py), else by the last resort (a running total backpropagated at
# each micro-step, retain_graph=True, whose losses then moved ReduceLROnPlateau's lr from
# update 8, was named `lr-scaled` alone: tests/test_plateau_after_gradient.py).
BEFORE_ANY_STEP = {"optimizer-settings", "lr-scaled", "lr-schedule"}
GRADIENT_SHAPE: list[Callable[[Comparison, UpdateResult], Diagnosis | None]] = [
    sig.grad_accum_dtype,
    # counted by the Recorder: before the shapes that only fit (a bfloat16 BERT clearing every
    # micro-step beside a clip and a penalty read as a penalty counted too little, zoo run 286109)
    sig.zero_grad_counted,
    sig.grad_not_cleared,
    sig.penalty_not_scaled,
    sig.clip_before_unscale,
    sig.clip_per_micro_counted,
    sig.clip_threshold,
    sig.loss_scale,
    sig.token_normalization,
    sig.loss_term_scale,  # one term of the loss scaled alone: its own tensors' ratios
    sig.clip_per_micro,  # the uncounted forms, on weaker evidence
    sig.zero_grad_in_window,
]


def diagnose(c: Comparison) -> list[Diagnosis]:
    """Causes for a failing comparison (or an explanation of a passing one)."""
    if all(check.status != FAIL for check in c.checks):
        return why_it_passes(c)
    if not c.results:  # no window could be judged: what the bookkeeping says, nothing else
        read = (sig.unrecorded_micro_batches, sig.window_bookkeeping, sig.step_in_window)
        found = [d for d in (signature(c) for signature in read) if d is not None]
        return found[:1] or [_unexplained(c)]
    diverged = sig.non_finite(c) or sig.non_finite_gradient(c)
    if diverged is not None and None not in diverged.evidence.values():
        return [diverged]  # both diverge: nothing else can be read from non-finite numbers
    found = [d for d in (signature(c) for signature in DECISIVE) if d is not None]
    found = [d for i, d in enumerate(found) if d.code not in {e.code for e in found[:i]}]
    if found and found[0].code == "batch-size":  # windows of other rows: what follows from it
        found = [d for d in found if d.code not in BATCH_SIZE_FOLLOWS]
    found = ranked.with_ranks(c, found)  # a data-parallel run's ranks (signatures/distributed)
    found = _before_other_samples(c, found) + found
    found = _beside_other_samples(c, found)
    at_start = c.results[0].grad_failed  # from the same weights
    beside = BESIDE_SHAPES | (BEFORE_ANY_STEP if at_start else set())
    if not found or {d.code for d in found} <= beside:  # the loop's own bug first
        # buffers the forward writes (spectral norm's) turn every gradient a little, as BatchNorm
        forward = sig.buffers_in_forward(c) if not found else None
        shape, later = _shape(c, bool(found) or forward is not None)
        if found and not shape:  # a scale beyond 5% of K, beside a change the loss shows
            shape = [d for d in (sig.scale_beside_unseen_change(c),) if d is not None]
        if found and not shape and at_start and _steps_only(found):
            shape = _last_resort(c)  # no setting of the step moves update 0's gradient
        if later and not found:  # the first failing update is left to the last resort
            shape += [d for d in _last_resort(c) if d.code != shape[0].code]
        elif shape and forward is not None:
            shape.append(forward)
        found = shape + [d for d in found if not _explained_draws(c, d, shape)]
    if not found:
        found = _last_resort(c)
    if diverged is not None:
        found.append(diverged)
    return for_framework(c, found) or [_unexplained(c)]


def _steps_only(found: list[Diagnosis]) -> bool:
    """Whether every cause in `found` is a setting of the optimizer's step, none naming
    tensors whose gradient it moves (a layer frozen in one run, or inside a window, is named
    `lr-schedule` with its `tensors`: signatures/frozen.py)."""
    return all(d.code in BEFORE_ANY_STEP and "tensors" not in d.evidence for d in found)


def _last_resort(c: Comparison) -> list[Diagnosis]:
    """A wrong loss scale's exact ratio that the tolerance let the gradient pass with, or what
    the forward writes, or the data-parallel hook, or a loss over the micro-batch differs,
    nothing else does: at most one."""
    last = (
        scaled_within_tolerance(c),  # a wrong loss scale's exact ratio the tolerance let pass
        *_recorded_causes(c),
        sig.scale_under_reweighting(c),
        _scale_beside_a_term(c),
        sig.scale_beside_unseen_change(c),
        sig.cross_sample_gradient(c),
    )
    return [d for d in last if d is not None][:1]


ADDED_TERM = (
    "a term added to the gradient alike in both runs and not scaled with the loss: gradient "
    "noise or a penalty added to .grad by hand once per update"
)


def _scale_beside_a_term(c: Comparison) -> Diagnosis | None:
    """A gradient K, 1/K or K+1 times the baseline's (within 5%) that nothing else names, turned
    a little: the scale, beside a term the loop adds to `.grad` once per update in both runs,
    which the scale leaves as it is (was `cross-sample-loss`). A loop's scale holds at the next
    update too; a size that stands K times the baseline's at one update alone is no scale
    (model zoo run 284117, GPT-2 under bfloat16, K=2, 300 updates: the merged run parted from
    the reference at update 15, its gradient's norm 2.002, 1.61, 2.42 and 3.26 times the
    baseline's at updates 15 to 18, and was named `loss-scale`; a float64 rerun of it tracked
    the reference exactly)."""
    r = sig.first_gradient_failure(c)
    found = sig.with_loss_scale(c, r, turned=ADDED_TERM) if r is not None else []
    scale = next((d for d in found if d.code == "loss-scale"), None)
    after = next(  # the next update whose gradients compare (a GradScaler's skip: none)
        (
            x
            for x in c.results
            if r is not None and x.update > r.update and finite(x.grad_ratio) is not None
        ),
        None,
    )
    if scale is None or after is None:
        return scale
    again = sig.with_loss_scale(c, after, turned=ADDED_TERM)
    expected = scale.evidence.get("expected_ratio")
    held = any(
        d.code == "loss-scale" and d.evidence.get("expected_ratio") == expected for d in again
    )
    return scale if held else None


def _recorded_causes(c: Comparison) -> tuple[Diagnosis | None, ...]:
    """Causes the run recorded: buffers its forward wrote, a comm hook, hooks on the
    parameters' gradients, rows from another micro-batch in its row digests."""
    return sig.buffers_in_forward(c), ranked.dp_comm_hook(c), sig.grad_hooks(c), sig.rows_differ(c)


def _shape(c: Comparison, beside: bool) -> tuple[list[Diagnosis], bool]:
    """The accumulation bug a failing gradient's shape names, read at the first failing update,
    else at the first whose gradient fails ten times as far (err/allowed): a bug that starts at
    update 1, such as gradients never cleared, beside a cause that moves every gradient a little
    from update 0 (BatchNorm, a loss over the micro-batch: `beside`, named already). Whether it
    was read at the later one."""
    failing = [r for r in c.results if r.grad_failed]
    if not failing:
        return [], False
    found = _gradient_shape(c, failing[0], beside)
    if found:
        return found, False
    first = _grad_excess(failing[0])
    jump = next((r for r in failing[1:] if _grad_excess(r) > 10 * first), None)
    found = _gradient_shape(c, jump, beside)
    return found, bool(found)


def _before_other_samples(c: Comparison, found: list[Diagnosis]) -> list[Diagnosis]:
    """The gradient's shape at the first failing update, where `data-order` names other samples
    only from a later window: the windows before it held their baseline batches, so what broke
    there is another bug (a loss not divided by K beside a sampler without set_epoch)."""
    later = next((d for d in found if d.code == "data-order"), None)
    if later is None or "first_update" not in later.evidence:
        return []
    r = sig.first_gradient_failure(c)
    if r is None or r.update >= later.evidence["first_update"]:
        return []
    return _gradient_shape(c, r, beside=False)


def _beside_other_samples(c: Comparison, found: list[Diagnosis]) -> list[Diagnosis]:
    """`found`, where `data-order` names other samples (their turn hides a bug from the
    gradient's shape): with `zero-grad-in-window` beside it where the Recorder counted
    zero_grad() calls inside those windows and the gradient is smaller in every one; else,
    where no scale is named, with `loss-scale` beside it where the gradient's size and the
    window losses both say one (signatures/paired.py); where the size alone does, with
    `data-order` saying it, for a second look once the samples agree."""
    order = next((i for i, d in enumerate(found) if d.code == "data-order"), None)
    if order is None:
        return found
    bad = sample_mismatches(c.baseline, c.merged)
    windows = [int(i) for i in bad] if bad is not None else [r.update for r in c.results]
    codes = {d.code for d in found}
    cleared = sig.zero_grad_beside_other_samples(c, windows)
    if cleared is not None and cleared.code not in codes:
        return [*found, cleared]  # a size cleared to the last micro-batches' share, no scale
    if "loss-scale" in codes:
        return found
    seen = sig.size_beside_other_samples(c, windows)
    if seen is None:
        return found
    scaled = sig.scale_beside_other_samples(c, seen)
    if scaled is not None:
        return [*found, scaled]
    d, near = found[order], window_scale(window(c), seen.scale)
    said = dataclasses.replace(
        d,
        message=d.message
        + f"; over those windows the gradient's norm is {seen.size:.4g} times the baseline's "
        f"(the median, each {seen.low:.3g} to {seen.high:.3g}), near {near}"
        ", where samples of the same kind leave it about as large: once the samples agree, see "
        "whether the loss is scaled by the wrong factor too (samples of another scale move it "
        "as well)",
        evidence={**d.evidence, "gradient_size_ratio": seen.size, "near_ratio": seen.scale},
    )
    return [*found[:order], said, *found[order + 1 :]]


def _explained_draws(c: Comparison, d: Diagnosis, shape: list[Diagnosis]) -> bool:
    """A `dropout-rng` read from draws alone (no dropout layer) whose evidence the gradient's
    shape explains (a harmless draw, as LayerDrop's at layerdrop=0, which BART's layers make
    whatever its rate): a wrong loss scale the window losses show, beside the reweighting of
    the micro-batches that turns the gradient; or a wrong loss scale alone where the gradient
    at update 0 points where the baseline's does, to within the gradient tolerance (draws that
    reached the forward turn it: other masks, other noise)."""
    if d.code != "dropout-rng" or d.evidence.get("draws_each_micro_step") is not True:
        return False
    codes = [s.code for s in shape]
    if codes[:2] == ["loss-scale", "token-normalization"]:
        return "window_loss_ratio" in shape[0].evidence
    cosine = finite(c.results[0].grad_cosine)
    turned = c.tolerances.grad_rtol**2 / 2  # 1 - cos of a difference of grad_rtol, at most
    return codes == ["loss-scale"] and cosine is not None and 1 - cosine <= turned


def _grad_excess(r: UpdateResult) -> float:
    return max((d.ratio for d in r.grads), default=0.0)


def _gradient_shape(c: Comparison, r: UpdateResult | None, beside: bool) -> list[Diagnosis]:
    """The accumulation bug the shape of the gradient at update r names: at most one. `beside`:
    a cause named already turns every gradient a little, so a wrong scale may turn too."""
    # a gradient shape is read only from finite numbers: no "inf times" claims
    if r is None or finite(r.grad_ratio) is None or finite(r.grad_cosine) is None:
        return []
    order = [*ranked.GRADIENT_SHAPE, *GRADIENT_SHAPE]
    if beside:  # right after the scale read as it is, before one term's scale is tried
        order.insert(order.index(sig.loss_scale) + 1, _turned_scale)
    shapes = ((signature, signature(c, r)) for signature in order)
    first = next(((signature, d) for signature, d in shapes if d is not None), None)
    found = [first[1]] if first is not None else []
    if first is not None and first[0] is _turned_scale:  # with the reweighting it read, if any
        found = sig.with_loss_scale(c, r, turned=True)
    if first is not None and first[0] is sig.grad_accum_dtype:  # the larger error first
        found = _beside_rounding(c, r, first[1], order) + found
    # read beside a wrong scale: a reweighting, or a gradient about 1/K turned by one (a
    # per-micro-batch token mean divided by K twice), whose window losses show the scale
    if first is None or first[0] in (sig.token_normalization, sig.zero_grad_in_window):
        found = sig.with_loss_scale(c, r) or found
    if found and first is not None and first[0] is sig.zero_grad_in_window and not beside:
        # its shape alone: a cause the run recorded comes first
        found = [d for d in _recorded_causes(c) if d is not None][:1] or found
    return found


ROUNDED_FAR = 0.05  # relative L2: far beyond what 16-bit accumulation rounds (under 1%)


def _beside_rounding(
    c: Comparison, r: UpdateResult, rounded: Diagnosis, order: list
) -> list[Diagnosis]:
    """A gradient in a 16-bit buffer that is also farther off than rounding takes it: the shape
    of that other bug (a loss not divided by K, zero_grad in the window), read beside it."""
    if (finite(rounded.evidence.get("grad_rel_l2")) or 0.0) <= ROUNDED_FAR:
        return []
    later = order[order.index(sig.grad_accum_dtype) + 1 :]
    other = next((d for d in (s(c, r) for s in later) if d is not None), None)
    if other is not None:
        return [other]
    return sig.with_loss_scale(c, r, turned="the 16-bit rounding named beside it")[:1]


def _turned_scale(c: Comparison, r: UpdateResult) -> Diagnosis | None:
    """A gradient K, 1/K or K+1 times too large (within 5%), turned by the cause beside it."""
    return next(iter(sig.with_loss_scale(c, r, turned=True)), None)


def _unexplained(c: Comparison) -> Diagnosis:
    r = failing(c)
    evidence: dict = {"first_divergence": c.first_divergence}
    if r is not None:
        evidence.update(
            loss_diff=finite(r.loss_diff),
            grad_ratio=finite(r.grad_ratio),
            grad_cosine=finite(r.grad_cosine),
        )
    failed = [check.name for check in c.checks if check.status == FAIL]
    message = f"no known accumulation bug fits the evidence (failed: {', '.join(failed)})"
    said, fixes = unexplained_hints(c, r)
    message += "".join(f"; {clause}" for clause in said)
    fix = "; ".join(fixes) or None
    tensors, losses = _first_failures(c)
    tensors_first = (
        bool(failed)
        and set(failed) <= {"weights", "gradients", "losses"}
        and tensors is not None
        and (losses is None or losses >= tensors)
    )  # a loss computed with weights that already part follows them, and says nothing more
    if tensors_first and "losses" in failed and losses is not None and losses > tensors:
        message += (
            f"; the losses part only from update {losses}, the weights or gradients from "
            f"update {tensors}: each loss is computed with the weights of the update before"
        )
    if tensors_first and (scaled := tensor_wide_scale(c)):
        message += f"; {scaled}"
    if tensors_first and (parted := stepped_choice(c, r)):
        message += f"; {parted}"
    if c.reference is None and tensors_first:
        message += (
            "; without a float64 reference the tensors are judged by fixed tolerances, measured "
            "on the built-in MLP, which a model's own noise can exceed: a ReLU-like kink "
            "crossed by one run and not the other changes a gradient by far more than its "
            "rounding, and an optimizer that normalizes its steps (Adam, RMSprop, Adagrad, "
            "Adafactor) moves each element whose gradient is rounding noise by about its "
            "learning rate, in a direction the noise picks (judged by the gradients alone where "
            "both runs kept their gradients and those passed)"
        )
        reduced = c.dtype in ("tf32", "float16", "bfloat16")
        if reduced:
            message += f", and {c.dtype} rounds each forward and backward far more coarsely"
        cheaper = " (or in float32 without autocast or TF32)" if reduced else ""
        fix = (fix + "; " if fix else "") + (
            "judge against a float64 rerun of the baseline, which measures that noise: "
            "`gradalign baseline` records one; for your own loop, record the baseline again "
            f"with the model and data in float64{cheaper} and pass it as --reference"
        )
    if c.reference is not None and tensors_first:
        message += (
            f"; the reference measures the baseline's {c.dtype} rounding, and the merged "
            "run's may differ from it where a computation rounds otherwise at another "
            "micro-batch size (a matrix exponential's scaling, as in orthogonal "
            "parametrizations, or a kernel chosen by shape)"
        )
        if FLOAT64_RERUN not in fixes:
            fix = (fix + "; " if fix else "") + FLOAT64_RERUN
    return Diagnosis("unexplained", message, evidence, fix)


def _first_failures(c: Comparison) -> tuple[int | None, int | None]:
    """The first update whose weights or gradients failed, and the first whose loss did."""
    tensors = next((r.update for r in c.results if not r.tensors_ok), None)
    losses = next((r.update for r in c.results if not r.loss_ok), None)
    return tensors, losses
