"""Checks that could not have failed, runs that trained nothing (`untrained_note`) and tensors
stepped but never recorded (`unrecorded_note`): the
data decide whether an absolute tolerance (loss_atol, weight_atol, whose units are the data's)
is so large that a merged run that did not train would pass. Those are said in the report and
the JSON notes; the relative tolerances that can never be meaningful are refused before any work
(`tolerances.check_tolerance`)."""

from __future__ import annotations

import math

import numpy as np

from ..runs.model import Run
from .results import UpdateResult
from .tolerances import Tolerances


def vacuous_notes(
    results: list[UpdateResult],
    tol: Tolerances,
    resolution: np.ndarray | None = None,
    window_losses: np.ndarray | None = None,
) -> list[str]:
    """A warning per check whose allowed error was, at every update, at least the quantity
    itself: the baseline loss (a merged loss of 0 passes), the distance training moved each
    weight (a merged run that never moved passes); a warning where the fixed tolerances allowed
    every gradient a quarter of its size or more (a merged run leaving micro-batches out
    passes); and a note where printed losses were known only coarsely (`resolution`: per
    update, the window losses' printed resolution, beside the baseline's `window_losses`)."""
    notes = []
    losses = [r for r in results if math.isfinite(r.base_loss) and r.base_loss != 0]
    if losses and all(r.loss_allowed >= abs(r.base_loss) for r in losses):
        widest = max(r.loss_allowed for r in losses)
        notes.append(
            f"warning: the loss check could not fail: at every update the error allowed (up to "
            f"{widest:.3g}) is at least the baseline loss itself, so a merged loss of 0 would "
            f"pass (loss_atol {tol.loss_atol:g}, loss_rtol {tol.loss_rtol:g})"
        )
    moved = [d for r in results for d in r.weights if d.moved and math.isfinite(d.moved)]
    if moved and all(d.allowed >= d.moved for d in moved):
        notes.append(
            "warning: the weight check could not fail: every weight was allowed an error at "
            "least the distance training moved it, so a merged run that did not train would "
            f"pass (weight_atol {tol.weight_atol:g}, weight_rtol {tol.weight_rtol:g})"
        )
    grads = [  # by the fixed tolerances (no reference's noise): their floor is weight_atol's
        d for r in results for d in r.grads if d.noise is None and d.norm and math.isfinite(d.norm)
    ]
    least = min((d.allowed / d.norm for d in grads), default=0.0)
    if least >= _BLIND:
        notes.append(
            "warning: the gradient check could not see a gradient a quarter off: every "
            f"gradient was allowed an error of at least {least:.2g} times its own size (the "
            f"gradients are tiny beside weight_atol {tol.weight_atol:g} per element, as where "
            "a loss is scaled far down), so a merged run that left out micro-batches would pass "
            "it, and the weights' noise-dominated elements are judged by those gradients; judge "
            "against a float64 rerun of the baseline (--reference), whose noise scales with "
            "the data"
        )
    notes += widened_blind_note(results)
    if resolution is not None and window_losses is not None:
        notes += coarse_losses_note(resolution, window_losses)
    return notes


def widened_blind_note(results: list[UpdateResult]) -> list[str]:
    """A warning where, against a reference, every gradient was allowed an error of at least
    _BLIND of its own size at every update from some update on: a noise floor that wide (a
    16-bit baseline's, widened where the drift let a weight stand far beyond its own noise:
    `noise.carry_admitted_excess`, at most the factor squared) cannot see a loop's bug of that
    size. Model zoo run 184515 (a ResNet under Adagrad, bfloat16 autocast, K=2): from update 1
    every gradient was allowed 0.89 times its size or more, and micro-batches weighted alike
    whatever their size, a gradient 39% off at update 2, passed."""
    least = []  # per update: the least allowed error over size of its noise-judged gradients
    for r in results:
        ratios = [  # a sketch estimator's bound (`slack`) is not the noise floor's width
            (d.allowed - d.slack) / d.norm
            for d in r.grads
            if d.noise is not None and d.norm and math.isfinite(d.norm) and math.isfinite(d.allowed)
        ]
        least.append((r.update, min(ratios) if ratios else None))
    known = [(u, x) for u, x in least if x is not None]
    start = None
    for u, x in reversed(known):
        if x < _BLIND:
            break
        start = u
    if start is None or len(known) < 2 or start == known[-1][0]:
        return []  # not blind, or blind at the last update alone
    share = min(x for u, x in known if u >= start)
    return [
        f"warning: from update {start} on the gradient check could not see a gradient a quarter "
        f"off: every gradient was allowed an error of at least {share:.2g} times its own size "
        "(the baseline's noise against the reference, widened where the drift let weights "
        "stand further from it than the baseline's own noise), so a bug of that size in the "
        "merged run (micro-batches weighted alike whatever their size, a micro-batch left out "
        "of K=4) would pass it unless it moves the whole model's gradient norm (the check "
        '"gradient norm", judged by the baseline\'s own); the three runs recorded at a higher '
        "precision (float32, without 16-bit autocast, for a 16-bit run) are judged more closely"
    ]


def coarse_losses_note(resolution: np.ndarray, losses: np.ndarray) -> list[str]:
    """A note where a log printed its losses so coarsely that the loss check saw only their
    printed digits: about 1e-5 of the loss or more (float32 rounds at 6e-8). A pass then says
    the losses agree to that, not to float32's rounding."""
    known = np.isfinite(resolution) & np.isfinite(losses) & (losses != 0)
    if not known.any():
        return []
    q = float(np.median(resolution[known]))
    if q < _COARSE * float(np.median(np.abs(losses[known]))):
        return []
    return [
        "the logs print their losses coarsely: the two runs' window losses may differ by up to "
        f"about {q:.2g} by their printed digits alone, so the losses were judged only to that "
        "and a smaller difference could not be seen; print more digits (`{loss:.8g}`, or repr) "
        "to judge them to float32's rounding"
    ]


_BLIND = 0.25  # the least allowed error over a gradient's size that could not see K=4's share
_COARSE = 1e-5  # a window's printed resolution over its loss from which the note is given


def unmoved_note(results: list[UpdateResult]) -> list[str]:
    """A warning where no recorded weight of the baseline moved at any update, though its
    optimizer stepped (no floating-point weight, weights written as integers, an lr of 0)."""
    weights = [d for r in results for d in r.weights if d.moved is not None]  # known: recorded
    if not weights or any(d.moved for d in weights):
        return []
    return [
        "warning: no weight of the baseline moved at any update (none is a floating-point "
        "number that training changed): nothing was trained, so this comparison cannot show "
        "that the merged run trains like its baseline; check the weights the run records"
    ]


def untrained_note(base: Run, merged: Run) -> list[str]:
    """A warning where neither run's optimizer stepped at any update (a GradScaler that skipped
    every one, a learning loop that never reached step()): both runs stand where they began, so
    a pass shows only that they skipped alike, not that they train alike."""
    steps = [r.optimizer_steps for r in (base, merged)]
    if any(s is None or np.size(s) == 0 for s in steps) or any(np.any(s) for s in steps):
        return []
    return [
        "warning: neither run's optimizer stepped at any update (a loss scaler skips every "
        "update whose scaled gradient overflows): nothing was trained, so this comparison "
        "cannot show that the merged run trains like its baseline; start the scaler lower or "
        "record more updates"
    ]


def unrecorded_note(base: Run, merged: Run) -> list[str]:
    """Tensors the optimizer stepped outside the model given to the Recorder (manifest `model`
    facts): never recorded, so never judged."""
    outside = {
        role: facts
        for role, run in (("baseline", base), ("merged run", merged))
        if isinstance(facts := run.model_facts.get("optimizer_outside_model"), dict)
    }
    if outside:
        facts = next(iter(outside.values()))
        whose = "both runs'" if len(outside) == 2 else f"the {next(iter(outside))}'s"
        return [
            f"{whose} optimizer also stepped {facts.get('tensors')} tensor(s) "
            f"({facts.get('elements')} elements) outside the model given to the Recorder (a "
            "loss's learnable weights kept apart): they were not recorded, so a bug that shows "
            "only in them goes unseen; give the Recorder a module that holds them too, such as "
            "nn.ModuleDict({'model': model, 'loss': loss_module})"
        ]
    return []
