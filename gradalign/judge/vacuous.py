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


def vacuous_notes(results: list[UpdateResult], tol: Tolerances) -> list[str]:
    """A warning per check whose allowed error was, at every update, at least the quantity
    itself: the baseline loss (a merged loss of 0 passes), or the distance training moved each
    weight (a merged run that never moved passes)."""
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
    return notes


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
