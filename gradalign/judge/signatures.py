"""The signatures of known accumulation bugs, each read from the recorded numbers of a comparison.

Every function returns a Diagnosis when its signature fits and None otherwise.
"""

from __future__ import annotations

import math

import numpy as np

from ..runs.model import Run
from .checks import sample_mismatches
from .results import Comparison, Diagnosis, UpdateResult

COSINE_SAME_DIRECTION = 1 - 1e-6  # a pure rescaling keeps the direction to rounding error
RATIO_MATCH = 1e-3  # relative distance to K, 1/K or K+1 that names the loss-scale variant


def finite(value: float | None) -> float | None:
    return float(value) if value is not None and math.isfinite(value) else None


def window(c: Comparison) -> int:
    """K of the merged run relative to the baseline's."""
    return max(1, c.merged.accum_steps // max(1, c.baseline.accum_steps))


def failing(c: Comparison) -> UpdateResult | None:
    return next((r for r in c.results if not r.ok), None)


def first_gradient_failure(c: Comparison) -> UpdateResult | None:
    return next((r for r in c.results if any(not d.ok for d in r.grads)), None)


# -- decisive signatures ------------------------------------------------------------------------


def step_in_window(c: Comparison) -> Diagnosis | None:
    windows = [r for r in c.results if any(k == "window" for k, _ in r.problems)]
    steps = [
        r for r in c.results if any(k in ("optimizer_steps", "state_step") for k, _ in r.problems)
    ]
    if not windows and not steps:
        return None
    evidence: dict = {"windows_with_weight_changes": len(windows)}
    parts = []
    if windows:
        first = windows[0]
        text = next(t for k, t in first.problems if k == "window")
        evidence["first_window"] = first.update
        parts.append(f"at update {first.update} the {text.split(':')[0]}")
    if c.merged.optimizer_steps is not None and c.baseline.optimizer_steps is not None:
        per_update = int(c.merged.optimizer_steps.max())
        evidence["optimizer_steps_per_update"] = {
            "merged": per_update,
            "baseline": int(c.baseline.optimizer_steps.max()),
        }
        if per_update != int(c.baseline.optimizer_steps.max()):
            parts.append(f"the merged run called optimizer.step() {per_update} times per update")
    return Diagnosis(
        "step-in-window",
        "the optimizer stepped before the accumulation window ended: " + "; ".join(parts),
        evidence,
        "call optimizer.step() and optimizer.zero_grad() only after the K-th micro-batch of "
        "each window, e.g. `if (micro + 1) % K == 0:`",
    )


def _schedule_advance(base_lr: np.ndarray, merged_lr: np.ndarray) -> int | None:
    """The m with merged lr[t] == baseline lr[m*t] wherever the baseline reaches m*t."""
    n = len(base_lr)
    for m in range(2, n):
        ts = [t for t in range(n) if m * t < n]
        if len(ts) >= 2 and all(
            math.isclose(merged_lr[t], base_lr[m * t], rel_tol=1e-9, abs_tol=1e-15) for t in ts
        ):
            return m
    return None


def lr_schedule(c: Comparison) -> Diagnosis | None:
    bad = [r for r in c.results if any(k == "lr" for k, _ in r.problems)]
    if not bad:
        return None
    i = bad[0].update
    base_lr, merged_lr = c.baseline.lr, c.merged.lr
    evidence = {
        "first_update": i,
        "merged_lr": finite(merged_lr[i]),
        "baseline_lr": finite(base_lr[i]),
        "updates_differing": len(bad),
    }
    advance = _schedule_advance(base_lr, merged_lr)
    if advance is not None:
        evidence["schedule_steps_per_update"] = advance
        message = (
            f"the learning-rate schedule advanced {advance} steps per update: merged lr at "
            f"update t equals the baseline's at update {advance}·t (update {i}: "
            f"{merged_lr[i]:.6g} vs {base_lr[i]:.6g})"
        )
        if advance == window(c):
            message += ", i.e. once per micro-step"
    else:
        message = (
            f"the learning rates differ from update {i} on ({merged_lr[i]:.6g} in merged, "
            f"{base_lr[i]:.6g} in baseline)"
        )
    return Diagnosis(
        "lr-schedule",
        message,
        evidence,
        "step the scheduler once per optimizer step (once per window of K micro-batches), "
        "and give both runs the same schedule in updates, not in micro-steps",
    )


def data_order(c: Comparison) -> Diagnosis | None:
    bad = sample_mismatches(c.baseline, c.merged)
    if bad is not None:
        if not bad.size:
            return None
        evidence = {"windows_with_other_samples": int(bad.size), "first_update": int(bad[0])}
        message = (
            f"the merged run saw other samples than the baseline: {bad.size} of {c.updates} "
            f"windows hold samples other than their baseline batch (first: update {int(bad[0])})"
        )
    else:
        first = c.results[0]
        facts = {**c.baseline.model_facts, **c.merged.model_facts}
        if first.loss_ok or facts.get("batchnorm") or facts.get("dropout"):
            return None
        evidence = {
            "update_0_loss_diff": finite(first.loss_diff),
            "update_0_loss_allowed": finite(first.loss_allowed),
            "sample_digests": "not recorded",
        }
        message = (
            "the losses differ already at update 0, computed from identical initial weights, "
            f"by {first.loss_diff:.3g} (allowed {first.loss_allowed:.3g}): the merged run "
            "most likely saw other samples (no batch digests were recorded to confirm it)"
        )
    return Diagnosis(
        "data-order",
        message,
        evidence,
        "give window i exactly the rows of baseline batch i, split into K consecutive slices: "
        "same sampler and seed, same shuffling, same drop_last; record `batch=` in "
        "Recorder.micro() to check it",
    )


def _update0_gap(c: Comparison) -> tuple[dict, bool]:
    """Loss and gradient differences at update 0: what a forward/backward-level cause shows."""
    first = c.results[0]
    evidence = {
        "update_0_loss_diff": finite(first.loss_diff),
        "update_0_loss_allowed": finite(first.loss_allowed),
    }
    grads_differ = any(not d.ok for d in first.grads)
    if first.grads:
        evidence["update_0_grad_cosine"] = finite(first.grad_cosine)
        evidence["update_0_grad_ratio"] = finite(first.grad_ratio)
        worst = max(first.grads, key=lambda d: d.rel_l2)
        evidence["update_0_grad_rel_l2"] = {"parameter": worst.name, "value": finite(worst.rel_l2)}
    return evidence, (not first.loss_ok) or grads_differ


def batchnorm(c: Comparison) -> Diagnosis | None:
    layers = c.baseline.model_facts.get("batchnorm") or c.merged.model_facts.get("batchnorm")
    if not layers:
        return None
    evidence, differs = _update0_gap(c)
    buffers = [d for d in c.results[0].weights if d.name.endswith("num_batches_tracked")]
    w0b, w0m = c.baseline.weights(0), c.merged.weights(0)
    if buffers and w0b is not None and w0m is not None:
        name = buffers[0].name
        evidence["num_batches_tracked_after_update_0"] = {
            "merged": int(np.asarray(w0m[name]).ravel()[0]),
            "baseline": int(np.asarray(w0b[name]).ravel()[0]),
        }
    stats = [d for d in c.results[0].weights if d.name.endswith("running_mean") and not d.ok]
    if not differs and not stats:
        return None
    evidence["batchnorm_layers"] = list(layers)
    return Diagnosis(
        "batchnorm",
        f"the model has BatchNorm ({', '.join(layers)}): each micro-batch of B/K is normalized "
        "with its own statistics, so the forward pass already differs from the batch of B "
        "(loss at update 0 differs by "
        f"{c.results[0].loss_diff:.3g}) and the running statistics are updated K times per update",
        evidence,
        "use GroupNorm or LayerNorm (no batch statistics), or keep BatchNorm in eval mode with "
        "fixed statistics, or accumulate the statistics over the whole window (SyncBatchNorm-"
        "style) before normalizing",
    )


def dropout_rng(c: Comparison) -> Diagnosis | None:
    layers = c.baseline.model_facts.get("dropout") or c.merged.model_facts.get("dropout")
    if not layers:
        return None
    evidence, differs = _update0_gap(c)
    if not differs:
        return None
    evidence["dropout_layers"] = list(layers)
    cosine = evidence.get("update_0_grad_cosine")
    shape = f", gradient cosine {cosine:.4f} at update 0" if cosine is not None else ""
    return Diagnosis(
        "dropout-rng",
        f"the model has dropout ({', '.join(layers)}) and the runs differ from update 0, with "
        f"identical weights and samples (loss differs by {c.results[0].loss_diff:.3g}{shape}): "
        "the two runs drew different random masks",
        evidence,
        "draw the same masks in both runs: do not reseed or consume the generator per "
        "micro-step; with several random ops per forward, use batch-invariant randomness (a "
        "mask seeded by sample, layer and update); or verify with dropout disabled to isolate it",
    )


# -- gradient-shape signatures ------------------------------------------------------------------


def loss_scale(c: Comparison, r: UpdateResult) -> Diagnosis | None:
    ratio, cosine = r.grad_ratio, r.grad_cosine
    if ratio is None or cosine is None or not cosine >= COSINE_SAME_DIRECTION:
        return None
    if not abs(ratio - 1) > RATIO_MATCH:
        return None
    k = window(c)
    variants = [
        (k, f"not divided by K={k}", "divide each micro-batch's loss by K before backward()"),
        (1 / k, f"divided by K={k} twice", "divide each micro-batch's loss by K once"),
        (
            k + 1,
            "accumulated as `loss += loss / K` (K+1 times the right gradient)",
            "backpropagate `loss / K` alone; do not add it to the unscaled loss",
        ),
    ]
    evidence = {"update": r.update, "grad_ratio": finite(ratio), "grad_cosine": finite(cosine)}
    for expected, how, fix in variants:
        if abs(ratio / expected - 1) <= RATIO_MATCH:
            evidence["expected_ratio"] = expected
            return Diagnosis(
                "loss-scale",
                f"the micro-batch losses were {how}: at update {r.update} the accumulated "
                f"gradient is {ratio:.6g} times the baseline's with cosine {cosine:.8f}",
                evidence,
                fix,
            )
    return Diagnosis(
        "loss-scale",
        f"the accumulated gradient is {ratio:.6g} times the baseline's at update {r.update} in "
        f"the same direction (cosine {cosine:.8f}): the loss is scaled by the wrong factor",
        evidence,
        "scale each micro-batch's loss by 1/K (or by its share of the window's items)",
    )


def _representable_share(grads: dict[str, np.ndarray], narrow: str) -> float:
    """The share of nonzero gradient values that `narrow` (float16 or bfloat16) holds exactly."""
    total = exact = 0
    for g in grads.values():
        values = np.asarray(g, dtype=np.float32).ravel()
        values = values[values != 0]
        if narrow == "float16":
            kept = values.astype(np.float16).astype(np.float32)
        else:  # bfloat16: the float32 with its low 16 bits cleared
            kept = (values.view(np.uint32) & np.uint32(0xFFFF0000)).view(np.float32)
        exact += int(np.count_nonzero(kept == values))
        total += values.size
    return exact / total if total else 0.0


def grad_accum_dtype(c: Comparison, r: UpdateResult) -> Diagnosis | None:
    """Gradients accumulated in a 16-bit buffer: every merged gradient value fits that format
    exactly (its last mantissa bits are zero) while the baseline's do not."""
    gb, gm = c.baseline.grads(r.update), c.merged.grads(r.update)
    if gb is None or gm is None:
        return None
    for name in ("float16", "bfloat16"):
        merged_share = _representable_share(gm, name)
        base_share = _representable_share(gb, name)
        if merged_share == 1.0 and base_share < 0.5:
            error = _relative_error(gb, gm)
            return Diagnosis(
                "grad-accum-dtype",
                f"at update {r.update} every merged gradient value is exactly a {name} number "
                f"(baseline: {base_share:.1%} of them), and the gradient is {error:.3g} off "
                f"(relative L2): the micro-batch gradients were accumulated in {name}",
                {
                    "update": r.update,
                    "accumulation_dtype": name,
                    "merged_share_exact": merged_share,
                    "baseline_share_exact": base_share,
                    "grad_rel_l2": finite(error),
                    "recorded_grad_dtype": {
                        "merged": c.merged.grad_dtype,
                        "baseline": c.baseline.grad_dtype,
                    },
                },
                "accumulate gradients in float32 (keep .grad, or a float32 master copy, in "
                "float32 under mixed precision) and cast only the weights to 16 bits",
            )
    return None


def _norm(tensors: dict[str, np.ndarray]) -> float:
    """The L2 norm of all tensors together, in float64."""
    return math.sqrt(sum(float(np.sum(np.square(t, dtype=np.float64))) for t in tensors.values()))


def _relative_error(base: dict[str, np.ndarray], merged: dict[str, np.ndarray]) -> float | None:
    """||merged - base|| / ||base|| over all tensors together."""
    size = _norm(base)
    gap = _norm({n: merged[n].astype(np.float64) - base[n] for n in base})
    return gap / size if size > 0 else None


def token_normalization(c: Comparison, r: UpdateResult) -> Diagnosis | None:
    """Each micro-batch's mean divided by K, with unequal item counts: a reweighting of the
    micro-batches by N / (K n_j), so the gradient error is bounded by the imbalance."""
    items, k = c.merged.micro_items, c.merged.accum_steps
    if items is None or k < 2:
        return None
    counts = items[r.update * k : (r.update + 1) * k]
    if counts.min() == counts.max() or counts.min() <= 0:
        return None
    weights = counts.sum() / (k * counts)  # what mean-per-micro-batch / K gives each micro-batch
    imbalance = float(np.abs(weights - 1).max())
    gb, gm = c.baseline.grads(r.update), c.merged.grads(r.update)
    error = None if gb is None or gm is None else _relative_error(gb, gm)
    if error is None or not 0 < error <= 2 * imbalance:
        return None
    return Diagnosis(
        "token-normalization",
        f"at update {r.update} the micro-batches hold {', '.join(str(int(n)) for n in counts)} "
        f"items, yet each was weighted equally (its mean divided by K): items are weighted up to "
        f"{imbalance:.1%} wrong, and the gradient is {error:.3g} off (relative L2, cosine "
        f"{r.grad_cosine:.6f})",
        {
            "update": r.update,
            "items_per_micro_batch": [int(n) for n in counts],
            "max_weight_error": imbalance,
            "grad_rel_l2": error,
            "grad_cosine": finite(r.grad_cosine),
        },
        "normalize by the window's item count: count the items of all K micro-batches first, "
        "then backpropagate each micro-batch's summed loss divided by that total "
        "(loss_norm: items; the fix of transformers PR #34191)",
    )


def _clipped(run: Run, update: int) -> tuple[bool, float | None]:
    """Whether clipping engaged at `update` (norm before > norm of the recorded gradient), and
    the norm after clipping."""
    grads = run.grads(update)
    if grads is None or run.grad_norm_pre_clip is None:
        return False, None
    after = _norm(grads)
    return bool(run.grad_norm_pre_clip[update] > after * (1 + 1e-4)), after


def clip_per_micro(c: Comparison, r: UpdateResult) -> Diagnosis | None:
    pre_b, pre_m = c.baseline.grad_norm_pre_clip, c.merged.grad_norm_pre_clip
    if pre_b is None:
        return None
    i = r.update
    clipped, post_b = _clipped(c.baseline, i)
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
        if math.isclose(pre_m[i], pre_b[i], rel_tol=1e-4):
            return None  # the merged run saw the same norm before its clip: clipping is fine
    unclipped = [u for u in range(i) if not _clipped(c.baseline, u)[0]]
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
        "clip once per update: after the K-th backward() (and after unscaling with a "
        "GradScaler), just before optimizer.step()",
    )


def zero_grad_in_window(c: Comparison, r: UpdateResult) -> Diagnosis | None:
    ratio, cosine, k = r.grad_ratio, r.grad_cosine, window(c)
    if ratio is None or cosine is None or k < 2:
        return None
    if not (0.5 <= ratio * k <= 2.0 and 0 < cosine < COSINE_SAME_DIRECTION):
        return None
    return Diagnosis(
        "zero-grad-in-window",
        f"at update {r.update} the accumulated gradient is {ratio:.3g} times the baseline's "
        f"(about 1/K = {1 / k:.3g}) and points elsewhere (cosine {cosine:.4f}): only the last "
        "micro-batch's gradient survived, the earlier ones were cleared inside the window",
        {"update": r.update, "grad_ratio": finite(ratio), "grad_cosine": finite(cosine), "K": k},
        "call optimizer.zero_grad() once per update, after optimizer.step(), never inside the "
        "micro-batch loop",
    )
