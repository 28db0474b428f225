"""Decisive signatures: bookkeeping (steps, learning rates), data and model structure. Each reads
facts that name a cause by themselves, so several may fire together."""

from __future__ import annotations

import numpy as np

from ...runs.model import Run
from ..bookkeeping import bad_alike
from ..checks import fingerprint_mismatches, sample_mismatches
from ..choices import CHOICE_COSINE
from ..kinks import whole_model_moved
from ..results import Comparison, Diagnosis, UpdateResult
from ..window_sizes import CARRIED, CARRIED_FIX, UPDATE_FIRST_FIX, problems, update_first
from .common import dropout_ran, finite
from .skips import skips_apart, steps_skipped
from .step_count import counter_only
from .window_steps import inner_steps, not_the_optimizer

CARD_RATIO_MATCH = 1e-4  # relative: a float32 mean of cards' means against the baseline's mean


def step_in_window(c: Comparison) -> Diagnosis | None:
    windows = [r for r in c.results if any(k == "window" for k, _ in r.problems)]
    steps = [
        r for r in c.results if any(k in ("optimizer_steps", "state_step") for k, _ in r.problems)
    ]
    if not windows and not steps:
        return None
    if not steps and not_the_optimizer(c):
        return None  # no step inside any window: weights-changed-in-window says what it was
    if not windows and counter_only(c):
        return None  # step() as often as the baseline's: step-count says what it was
    if not windows and steps_skipped(c):
        return None  # fewer steps, never inside a window: step-skipped's
    apart = skips_apart(c)
    if apart and not windows and not inner_steps(c.merged) and steps[0].update >= apart[0]:
        return None  # the GradScalers skipped other updates: scaler-skips says so
    evidence: dict = {"windows_with_weight_changes": len(windows)}
    parts = []
    if windows:
        first = windows[0]
        text = next(t for k, t in first.problems if k == "window")
        evidence["first_window"] = first.update
        parts.append(f"at update {first.update} {text.rsplit(': ', 1)[0]}")
    if c.merged.optimizer_steps is not None and c.baseline.optimizer_steps is not None:
        per_update = int(c.merged.optimizer_steps.max())
        evidence["optimizer_steps_per_update"] = {
            "merged": per_update,
            "baseline": int(c.baseline.optimizer_steps.max()),
        }
        if per_update != int(c.baseline.optimizer_steps.max()):
            parts.append(f"the merged run called optimizer.step() {per_update} times per update")
            if steps and windows and steps[0].update < windows[0].update:
                evidence["first_update_with_extra_steps"] = steps[0].update
                parts[-1] += (
                    f" from update {steps[0].update}, whose extra steps left the weights as they "
                    "were (a learning rate of 0 there, as at a warmup's first step)"
                )
    if not parts and steps:  # only the optimizer's own counter: stepped, or counted, more
        text = next(t for k, t in steps[0].problems if k in ("optimizer_steps", "state_step"))
        parts.append(
            f"at update {steps[0].update} the {text}: it stepped more often, or its step counter "
            "advanced at every micro-step (its step() calls per update, `update/optimizer_steps`, "
            "tell the two apart)"
        )
    if _ended_by_inner_steps(c):
        merged = c.merged
        evidence["merged_updates"], evidence["unclosed_micro_steps"] = (
            merged.updates,
            merged.unclosed_micro_steps,
        )
        parts.append(
            f"it ended after {merged.updates} update(s) against the baseline's "
            f"{c.baseline.updates}, {merged.unclosed_micro_steps} micro-step(s) after its last "
            "update(): a run that stops at a count of optimizer steps (max_steps) ends early "
            "when it steps inside its windows"
        )
    return Diagnosis(
        "step-in-window",
        "the optimizer stepped before the accumulation window ended: " + "; ".join(parts),
        evidence,
        "call optimizer.step() and optimizer.zero_grad() only after the K-th micro-batch of "
        "each window, e.g. `if (micro + 1) % K == 0:`",
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
        earlier = _earlier_batches(c, bad)
        if earlier:
            evidence["batches_of_earlier_updates"] = earlier
            i, j = next(iter(earlier.items()))
            message += (
                f"; each holds an earlier baseline batch's samples again (update {i} the batch "
                f"of update {j}): the sampler repeated an epoch's order, as a DistributedSampler "
                "does without set_epoch(epoch) at each epoch"
            )
    else:
        first = c.results[0]
        facts = {**c.baseline.model_facts, **c.merged.model_facts}
        if first.loss_ok or facts.get("batchnorm") or dropout_ran(c) or draws(c):
            return None
        if not same_start_shown(c):
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
        "same sampler and seed, same shuffling (set_epoch(epoch) on a DistributedSampler at "
        "every epoch, in both runs), same drop_last; record `batch=` in "
        "Recorder.micro() to check it; a collator that draws random numbers per batch "
        "(masked-LM masking, random crops) gives a sample other draws in a batch of B than in "
        "one of B/K: draw them per sample from a seed, or before batching",
    )


def _earlier_batches(c: Comparison, bad: np.ndarray) -> dict[int, int]:
    """For each window that saw other samples, the earlier baseline batch it holds exactly
    (by the window's sum of sample digests), where every such window holds one; else {}."""
    base, merged = c.baseline, c.merged
    if base.micro_data is None or merged.micro_data is None:
        return {}
    mine, theirs = base.window_sums(base.micro_data), merged.window_sums(merged.micro_data)
    found = {}
    for i in map(int, bad):
        same = np.flatnonzero(mine[:i] == theirs[i])
        if not same.size:
            return {}
        found[i] = int(same[0])
    return found


_STEPPED = ("window", "optimizer_steps", "state_step", "replicas")


def same_start_shown(c: Comparison) -> bool:
    """Whether the runs provably computed update 0 from identical weights: both recorded their
    initial weights (compared before judging) and nothing stepped inside window 0, as the
    merged run's weights at each micro-step or its steps show (a run without them may have). A
    log shows neither, so a loss gap at update 0 says nothing about its samples."""
    return (
        _same_start(c.baseline, c.merged)
        and steps_seen(c)
        and not any(key in _STEPPED for key, _ in c.results[0].problems)
    )


def forward_parted(c: Comparison, r: UpdateResult) -> bool:
    """Whether the window losses parted where the weights they were computed from did not: at
    update 0 from the same initial weights (`same_start_shown`), or at update `r`, with its
    weights or gradients, while every check of the update before it passed, its weights among
    them (a log's losses alone say nothing of the weights). A reweighting of the micro-batches
    moves the gradients of the update it starts at and the loss only from the next (each loss
    is computed with the weights of the update before); a forward that chose otherwise from
    the same weights moves both at once, the model's gradient as a whole scaled and turned no
    further than a choice turns it (`choices.CHOICE_COSINE`). Model zoo run 294484 (gpt-oss
    under transformers' Adafactor, K=6 over micro-batches of 1 to 16 samples): at update 15
    the loss stood 25 times its allowed error off and every gradient failed (its cosine to the
    reference's 0.99983), update 14 within noise, and was named `token-normalization`; each
    micro-batch's mean divided by K from update 15 on turns it to 0.82 there, and is named."""
    if not c.results:
        return False
    if not c.results[0].loss_ok and same_start_shown(c):
        return True
    before = next((p for p in c.results if p.update == r.update - 1), None)
    if r.loss_ok or r.tensors_ok or before is None or not before.weights or not before.ok:
        return False
    return not whole_model_moved(r, CHOICE_COSINE)  # as far as a choice moves it, no further


def _same_start(base: Run, merged: Run) -> bool:
    """Whether both runs recorded their initial weights (compared value by value before
    judging), or, against a golden file, the same bit fingerprints of them in one dtype
    (`checks.fingerprint_mismatches`; the judge refused others)."""
    if base.load_init_weights is not None and merged.load_init_weights is not None:
        return True
    differ = fingerprint_mismatches(base, merged)
    return differ is not None and not differ.size


def steps_seen(c: Comparison) -> bool:
    """Whether a step inside the merged run's windows would show: it recorded its weights at
    each micro-step, its steps between micro-steps, or both runs their steps per update."""
    base, merged = c.baseline, c.merged
    counted = base.optimizer_steps is not None and merged.optimizer_steps is not None
    return merged.micro_state is not None or merged.micro_step_counts is not None or counted


def card_loss(c: Comparison) -> Diagnosis | None:
    """Card logs combined by the wrong convention: the merged losses are the baseline's times
    the number of cards (summed per-card means) or divided by it (averaged shares)."""
    merged, cards = c.merged, len(c.merged.cards)
    if cards < 2 or merged.card_loss is None or all(r.loss_ok for r in c.results):
        return None
    other, factor = ("sum", cards) if merged.card_loss == "mean" else ("mean", 1 / cards)
    ratios = [r.merged_loss / r.base_loss for r in c.results if r.base_loss]
    if not ratios or not all(abs(q * factor - 1) <= CARD_RATIO_MATCH for q in ratios):
        return None
    worst = max(abs(q * factor - 1) for q in ratios)
    own = "its share of the global sum" if other == "sum" else "the mean over its own samples"
    return Diagnosis(
        "card-loss",
        f"the merged losses are {ratios[0]:.6g} times the baseline's (with {cards} cards): "
        f"the cards' losses were combined by their {merged.card_loss}, but each card printed "
        f"{own}; combined by their {other} they agree to {worst:.2g} (relative)",
        {
            "cards": cards,
            "card_loss": merged.card_loss,
            "loss_ratio_update_0": finite(ratios[0]),
            "other_convention": other,
            "relative_gap_with_other_convention": finite(worst),
        },
        f"judge with --card-loss {other}: the training may well be right; only the way the "
        "cards' losses add up differs",
    )


def replica_divergence(c: Comparison) -> Diagnosis | None:
    bad = [r for r in c.results if any(k == "replicas" for k, _ in r.problems)]
    if not bad:
        return None
    text = next(t for k, t in bad[0].problems if k == "replicas")
    return Diagnosis(
        "replica-divergence",
        f"the cards no longer hold the same weights: at update {bad[0].update} {text}; "
        "replicas that average their accumulated gradients step identically, so some window "
        "stepped on each card's own gradients",
        {
            "first_update": bad[0].update,
            "updates_differing": len(bad),
            "cards": len(c.merged.cards),
        },
        "all-reduce (average) the accumulated gradients across the cards once per window, "
        "before the optimizer step; with DDP keep no_sync() only around the first K-1 "
        "micro-steps (their forward included)",
    )


def update0_gap(c: Comparison) -> tuple[dict, bool]:
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


def draws(c: Comparison) -> bool:
    """Whether either run's loop drew random numbers at most micro-steps (`micro/draws`)."""
    return c.baseline.draws_each_micro_step() or c.merged.draws_each_micro_step()


def _first_non_finite(run: Run) -> int | None:
    """The first update at which a run's losses stop being finite (None: they never do)."""
    bad = run.non_finite_losses()
    if not bad.size:
        return None
    return int(np.searchsorted(run.starts, bad[0], side="right")) - 1


def _finite_again(run: Run, update: int) -> int | None:
    """The first update after `update` whose losses are all finite again (None: none is): a
    step whose loss overflowed and was skipped, not a run that diverged."""
    finite = np.isfinite(run.window_losses())
    later = np.flatnonzero(finite[update + 1 :])
    return None if not later.size else update + 1 + int(later[0])


def _went(run: Run, name: str, update: int) -> str:
    again = _finite_again(run, update)
    if again is None:
        return f"the {name}'s losses stop being finite at update {update}"
    return (
        f"the {name}'s loss is not finite at update {update} and finite again from update "
        f"{again} (an overflow a loss scaler skipped, or a bad batch)"
    )


def non_finite(c: Comparison) -> Diagnosis | None:
    """A run whose losses become NaN or infinite. Both runs diverging is the training's own
    instability, not an accumulation bug: said plainly, with no ratio or cosine claims. A loss
    finite again later is said so (an overflow a loss scaler skipped), never 'diverged'."""
    base = _first_non_finite(c.baseline)
    merged = _first_non_finite(c.merged)
    alike = bad_alike(c.baseline, c.merged, len(c.results)) is not None
    if (merged is None and base is None) or alike:
        return None  # a bad batch both runs met and recovered from explains no failure
    evidence = {"merged_first_non_finite_update": merged, "baseline_first_non_finite_update": base}
    if merged is not None and base is not None:
        return Diagnosis(
            "non-finite",
            f"both runs diverge: their losses stop being finite (baseline from update {base}, "
            f"merged from update {merged}); the training itself is unstable, so the runs cannot "
            "be compared as numbers there",
            evidence,
            "make the baseline train stably first (lower the learning rate, clip, check the "
            "data and the loss scale), then verify accumulation",
        )
    if merged is None:
        return Diagnosis(
            "non-finite",
            f"{_went(c.baseline, 'baseline', base)} while the merged run's stay finite: the "
            "baseline, not the merged run, is the one that broke there",
            evidence,
            "make the baseline train stably first (lower the learning rate, clip, check the "
            "data and the loss scale), then verify accumulation",
        )
    diverged = _finite_again(c.merged, merged) is None
    return Diagnosis(
        "non-finite",
        f"{_went(c.merged, 'merged run', merged)} while the baseline's stay finite"
        + (": the merged run diverged" if diverged else ""),
        evidence,
        "look at the other causes named here; a loss or gradient scaled by K (or by a loss "
        "scaler used per micro-step) is the usual way a merged run blows up",
    )


def _ended_by_inner_steps(c: Comparison) -> bool:
    """Whether the merged run's only bookkeeping fault is an early end that its steps inside
    the windows explain: more optimizer steps per update than the baseline's, windows of K
    micro-steps, fewer updates and a last window never closed (a budget of optimizer steps, as
    Lightning's or the Trainer's max_steps, spent K times as fast)."""
    merged, base = c.merged, c.baseline
    if merged.optimizer_steps is None or base.optimizer_steps is None or not merged.updates:
        return False
    more = int(merged.optimizer_steps.max()) > int(base.optimizer_steps.max())
    clean = not problems(base, "baseline") and not merged.irregular_windows.size
    early = merged.updates < base.updates and merged.unclosed_micro_steps > 0
    return more and clean and early and not merged.unclosed_steps


def window_bookkeeping(c: Comparison) -> Diagnosis | None:
    """Windows that did not hold K micro-steps, or a last window update() never closed (not
    where steps inside the windows ended the run early: step-in-window says so)."""
    found = problems(c.baseline, "baseline") + problems(c.merged, "merged", c.baseline)
    if not found or _ended_by_inner_steps(c):
        return None
    sizes = c.merged.sizes
    stepped = [run for run in (c.baseline, c.merged) if run.unclosed_steps]
    ahead = [run for run in stepped if update_first(run)]  # update() before step()
    return Diagnosis(
        "window-bookkeeping",
        "the accumulation windows do not line up: " + "; ".join(found),
        {
            "merged_micro_steps_per_window": sorted({int(n) for n in sizes}),
            "K": c.merged.accum_steps,
            "merged_updates": c.merged.updates,
            "baseline_updates": c.baseline.updates,
            "unclosed_micro_steps": c.merged.unclosed_micro_steps,
            "unclosed_steps": c.merged.unclosed_steps,
            "updates_judged": len(c.results),
        },
        "step the optimizer (and call Recorder.update()) exactly once after every K micro-"
        "batches: count micro-steps with `(micro + 1) % K == 0`, handle a last partial window "
        "explicitly (drop it, as the baseline's drop_last does), and end every window with "
        "update()"
        + (
            "; step a last partial window only where micro-batches remain in it"
            if len(ahead) < len(stepped)
            else ""
        )
        + (CARRIED_FIX if any(CARRIED in text for text in found) else "")
        + (UPDATE_FIRST_FIX if ahead else ""),
    )
