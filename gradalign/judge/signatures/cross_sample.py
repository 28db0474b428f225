"""`cross-sample-loss`: from identical weights over the same samples, update 0 already differs
and nothing that names itself does (BatchNorm, dropout, other samples, losses recorded scaled,
unequal micro-batches): part of the loss is computed over each micro-batch as a whole, so a
micro-batch of B/K is not its share of B (a mixture of experts' load-balancing loss, an
in-batch contrastive loss)."""

from __future__ import annotations

import math

import numpy as np

from ..checks import row_mismatches, sample_mismatches
from ..clip_norms import PRE_CLIP
from ..results import PASS, Comparison, Diagnosis, UpdateResult
from .buffers import buffers_in_forward
from .common import dropout_ran, finite, losses_given, normalized_by_window, window
from .decisive import draws, same_start_shown, update0_gap
from .items import batch_targets


def cross_sample_loss(c: Comparison) -> Diagnosis | None:
    """The merged forward differs already at update 0, from identical weights over the same
    samples (their digests agree), with no BatchNorm or dropout to explain it and the losses not
    recorded scaled: a micro-batch's loss is not its share of the batch's, so part of the loss
    is computed over the micro-batch as a whole (a mixture of experts' load-balancing loss, an
    in-batch contrastive loss); without item counts, a loss normalized per micro-batch by its
    own tokens reads the same way."""
    first, k = _cross_sample_start(c)
    if first is None or first.loss_ok or _tensors_agree(c):
        return None
    q = first.merged_loss / first.base_loss if first.base_loss else math.nan
    world = c.merged.world_size
    scales = {s for s in (k, 1 / k, world, 1 / world) if s != 1}
    if not math.isfinite(q) or any(abs(q / s - 1) <= 0.05 for s in scales):
        return None  # recorded K (or W) times too large or small: loss-averaging's
    return _cross_sample(
        c,
        f"the merged window's loss is {first.merged_loss:.8g} and the baseline's "
        f"{first.base_loss:.8g} ({first.loss_diff:.3g} apart, "
        f"{first.loss_diff / first.loss_allowed:.3g} times what noise allows)",
    )


def cross_sample_gradient(c: Comparison) -> Diagnosis | None:
    """`cross_sample_loss` read from the gradient alone, where the loss term is too small to
    show in the loss at update 0 (a load-balancing loss weighted 0.01 at K=2): the last resort,
    when no accumulation bug's gradient shape fits, and only against a reference or in float32
    and float64, whose fixed tolerances stand a thousand times above an update-0 gradient's
    rounding (a 16-bit computation's do not: attention's key bias under bfloat16 autocast
    fails them at update 0). Not against a golden file: the shapes that name an accumulation
    bug read the baseline's gradient values, which a golden does not keep, so that none fits
    says nothing there (a sum kept in bfloat16, a penalty added at each micro-step: model zoo
    runs 285300 were named so, `unexplained` now)."""
    if c.baseline.kind == "golden":
        return None
    calibrated = c.reference is not None or c.dtype in ("float32", "float64")
    first, _ = _cross_sample_start(c) if calibrated else (None, 0)
    failed = [d for d in first.grads if not d.ok] if first is not None else []
    if not failed:
        return None
    worst = max(failed, key=lambda d: d.ratio)
    q = first.merged_loss / first.base_loss if first.base_loss else math.nan
    loss = (  # a loss that differs otherwise is cross_sample_loss's
        "the loss agrees but the gradient does not"
        if first.loss_ok
        else f"the window's loss is {q:.4g} times the baseline's (recorded K or W times too "
        "large or small: the losses logged are not the ones backpropagated, a matter of the "
        "log), and the gradient differs"
    )
    clipped = c.merged.clip_value is not None and bool(np.isfinite(c.merged.clip_value).any())
    unseen = _left_out(first.grad_ratio, first.grad_cosine, window(c)) + (
        "a term of the loss the gradient comes from, not the one recorded, was scaled "
        "otherwise at some micro-steps (a penalty added in full at each of the K, a second loss "
        "backpropagated at only some, noise added per micro-step rather than per window, a "
        "running total backpropagated again at each micro-step with retain_graph=True, which "
        "counts micro-batch j K−j times)"
        "; or each micro-batch's gradient was changed after its backward by what the Recorder "
        "does not see (a hook on an activation's gradient such as register_hook(lambda g: "
        "g.clamp(..)): the Recorder lists those on parameters only; a clip "
        "outside torch.nn.utils, or one imported by name before the Recorder opened: pass its "
        "norm with Recorder.grads(pre_clip_norm=...); the accumulated gradient reduced or "
        "rescaled by hand at some micro-steps, such as an all-reduce at each and the division "
        "by W at the last only)"
        + (
            ", or the loss was scaled wrongly and clip_grad_value_ clipped the scale away in "
            "the largest elements"
            if clipped
            else ""
        )
        + (
            "; or one rank scaled its loss otherwise than the others (not divided by K, or "
            "by W, on that rank alone: DDP averages the ranks' gradients, so the sum turns)"
            if c.merged.world_size > 1
            else ""
        )
    )
    return _cross_sample(
        c,
        f"{loss} (of {worst.name}, {worst.ratio:.3g} times what noise allows), and no "
        "accumulation bug's shape fits it",
        unseen,
    )


def _left_out(ratio: float | None, cosine: float | None, k: int) -> str:
    """Where the gradient's fitted ratio stands within half a micro-batch's share of some m/K
    (0 < m < K) and its direction turned: K−m micro-batches' gradients may be missing from the
    window's (each one's projection on the batch's gradient is about its share, 1/K, give or
    take its own noise), first in the list (their losses recorded, their backward never
    reaching the accumulated gradient, which the Recorder counts only where it is `.grad`)."""
    if ratio is None or cosine is None or not math.isfinite(ratio) or cosine > 0.999 or k < 2:
        return ""
    m = round(ratio * k)
    if not 0 < m < k or abs(ratio * k - m) > 0.5:
        return ""
    return (
        f"{k - m} of the K={k} micro-batches' gradients left out of the window's (the fitted "
        f"ratio {ratio:.3g} is about {m}/K): a micro-batch whose loss was computed and recorded "
        "but whose backward never reached the accumulated gradient, or reached it weighted 0 "
        "(a weight or mask of 0 on its loss), as where a loop adds its own buffers of "
        "torch.autograd.grad and sets .grad once per window; or "
    )


def _cross_sample_start(c: Comparison) -> tuple[UpdateResult | None, int]:
    """Update 0's result where the runs provably computed it alike (identical weights, the
    same samples by their digests, nothing stepped inside, no BatchNorm, dropout or buffer the
    forward writes and the runs then hold apart) and its micro-batches hold as many items
    (else samples) each, so that a mean per micro-batch averages to the batch's: else None
    (token-normalization's, where they do not), unless the loop gave each micro-batch's own
    loss with its items (`losses_given`: the window's loss is weighted by them, so its gap at
    update 0 is the forward's) or the framework divided each by the window's item count
    (`normalized_by_window`); and K. On W ranks each forward sees B/(W·K) rows, so K=1
    counts too."""
    first, k = c.results[0] if c.results else None, window(c)
    facts = {**c.baseline.model_facts, **c.merged.model_facts}
    pieces = k * c.merged.world_size  # forwards per update
    if first is None or _other_problems(first) or pieces < 2 or not same_start_shown(c):
        return None, k
    if facts.get("batchnorm") or dropout_ran(c) or draws(c):
        return None, k  # other random numbers in the merged run: dropout-rng's
    if buffers_in_forward(c) is not None:  # state the forward wrote (spectral norm's vectors)
        return None, k  # made each micro-step's forward another function: buffers-in-forward's
    other = sample_mismatches(c.baseline, c.merged)
    if other is None or other.size:  # unknown samples, or other ones: data-order's
        return None, k
    rows = row_mismatches(c.baseline, c.merged)
    if rows is not None and rows.size:  # the same values in other rows: rows_differ's
        return None, k
    if batch_targets(c) is not None:  # other targets for the same samples
        return None, k
    counts = c.merged.micro_items if c.merged.micro_items is not None else c.merged.micro_samples
    if c.merged.micro_items is not None and losses_given(c.merged):
        counts = None  # item-weighted losses the loop gave: a gap at update 0 is the forward's
    if normalized_by_window(c.merged):
        counts = None  # each micro-batch's loss divided by the window's items, not its own
    window0 = c.merged.window(0)
    if counts is not None and np.ptp(counts[window0.start : window0.stop]) > 0:
        return None, k  # unequal micro-batches: a per-micro-batch mean reweights them (tokens)
    return first, k


def _tensors_agree(c: Comparison) -> bool:
    """Whether the runs recorded weights and gradients and both agree within noise: the
    training is the same, and a gap in the losses is in what was recorded (loss-averaging's)."""
    status = {check.name: check.status for check in c.checks}
    return all(status.get(n) == PASS for n in ("weights", "gradients"))


def _other_problems(first: UpdateResult) -> bool:
    """Whether update 0 failed by more than its forward: a norm before clipping that differs
    where a gradient does too follows from that gradient (without a reference the norms are
    judged apart); where every gradient agrees, it is a scale a clip hid (clipping's)."""
    gradient_failed = any(not d.ok for d in first.grads)
    return any(key != PRE_CLIP or not gradient_failed for key, _ in first.problems)


def _cross_sample(c: Comparison, seen: str, unseen: str = "") -> Diagnosis:
    """`cross-sample-loss`, `seen` saying what differs at update 0; `unseen`: other causes
    that leave the same trace (read from the gradient alone)."""
    evidence, _ = update0_gap(c)
    first, k, world = c.results[0], window(c), c.merged.world_size
    evidence.update(baseline_loss=finite(first.base_loss), merged_loss=finite(first.merged_loss))
    evidence.update(K=k, **({"W": world} if world > 1 else {}))
    cosine = evidence.get("update_0_grad_cosine")
    turned = f"; the gradient's cosine {cosine:.8f}" if cosine is not None else ""
    tokens = (
        ""
        if c.merged.micro_items is not None
        else "; or each micro-batch's loss is a mean over its own count of tokens, which these "
        "runs did not record (give the Recorder items=, and token-normalization is told apart)"
    )
    rows = "B/K samples" if world == 1 else f"B/(W·K) samples (W={world} ranks, K={k})"
    ranks = " and all-reduce them over the ranks" if world > 1 else ""
    counted = c.merged.model_facts.get("grad_by_frequency") or []
    if counted:
        evidence["grad_by_frequency"] = counted
    return Diagnosis(
        "cross-sample-loss",
        f"at update 0, from identical weights over the same samples, {seen}{turned}: "
        + _by_frequency(counted)
        + (
            f"the gradients of the forwards' {rows} do not add up to the gradient of B: "
            f"{unseen}; or part of the loss is computed over the micro-batch as a whole"
            if unseen
            else f"the loss of a forward's {rows} is not its share of the loss of B. Part of "
            "it is computed over the micro-batch as a whole"
        )
        + ": an auxiliary loss over batch statistics (a mixture of experts' load-balancing "
        "loss), an in-batch contrastive loss, a normalization or penalty over the batch, a "
        "class-weighted loss under reduction='mean' (divided by each micro-batch's own sum of "
        "weights: divide the summed loss by the window's, and give Recorder.micro that sum as "
        "items=), a weight computed from the batch (BCE's pos_weight from its labels), a loss "
        "weight stepped per micro-batch (a KL or distillation coefficient counted in "
        "micro-steps), random numbers drawn per micro-batch from a torch.Generator of the "
        "loop's own, which the Recorder does not watch (B/K draws are not B's); or a forward "
        "that couples its rows (an expert capacity counted per micro-batch drops other "
        "tokens, a recurrent state carried from one batch to the next meets other rows), or a "
        "gradient hook on a parameter that clips or rescales each micro-batch's share" + tokens,
        evidence,
        ("set scale_grad_by_freq=False on those embeddings; otherwise: " if counted else "")
        + (
            "a term the loop adds itself: give it its share of the window (1/K) at every "
            "micro-step, or add it once per window; a term over the micro-batch as a whole: "
            if unseen
            else ""
        )
        + "compute such a term over the whole window: accumulate its statistics over the K "
        f"micro-steps{ranks} (the experts' token counts and router probabilities) and add it "
        "once per window, or make it a sum of per-sample terms; an in-batch contrastive loss "
        "needs the whole batch's embeddings (cache them across micro-batches, as GradCache does)",
    )


def _by_frequency(layers: list[str]) -> str:
    """The embeddings that divide each row's gradient by its index's count in the batch: a
    micro-batch counts its own indices, so its gradient is not its share of the batch's."""
    if not layers:
        return ""
    return (
        f"the model has embeddings with scale_grad_by_freq=True ({', '.join(layers)}): each "
        "row's gradient is divided by how often its index occurs in the batch, a micro-batch "
        "counts only its own, so the forwards' gradients cannot add up to the batch's. Or: "
    )


def rows_differ(c: Comparison) -> Diagnosis | None:
    """The last resort's first reading: the windows hold the baseline batches' values, but not
    in the same rows (`micro/pairs`), and the runs differ from update 0."""
    rows = row_mismatches(c.baseline, c.merged)
    same = sample_mismatches(c.baseline, c.merged)
    if rows is None or not rows.size or same is None or same.size or not c.results:
        return None
    first = c.results[0]
    if first.loss_ok and all(d.ok for d in first.grads):
        return None
    return Diagnosis(
        "data-order",
        f"{rows.size} of {c.updates} windows hold their baseline batch's values but not its "
        f"samples (first: update {int(rows[0])}): each sample's tensors were put together "
        "otherwise, as inputs paired with another micro-batch's targets (two loaders zipped, or "
        "one shuffled apart) or rows split or joined (a sequence cut along time into two rows)",
        {"windows_with_other_rows": int(rows.size), "first_update": int(rows[0])},
        "give each micro-batch whole samples of its window's batch: inputs and targets from one "
        "loader, and B/K rows at full length (cut the batch, not its sequences)",
    )
