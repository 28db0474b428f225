"""Tensors trained from another update in each run: a freeze schedule (`requires_grad` set back
to True after some steps) counted in micro-steps in one run and in updates in the other. Their
gradient is exactly zero in one run and not in the other at the first failing update, while
both runs held it at zero before; the other tensors' gradients were computed from weights that
still agree, so nothing else fails there but those tensors' own weights, which one run moved."""

from __future__ import annotations

import math

import numpy as np

from ..metrics import TensorDiff
from ..results import Comparison, Diagnosis
from .common import failing, window

_SHOWN = 3


def _zero(d: TensorDiff) -> tuple[bool, bool] | None:
    """Whether the baseline's and the merged gradient are exactly zero (None: not known, as
    for a diff from sketches or printed values, which keeps no baseline norm, or from a golden
    file's summaries, which keep no elementwise difference)."""
    if d.norm is None or d.sketched or math.isnan(d.max_abs):
        return None
    if d.norm == 0:
        return True, d.max_abs == 0
    return False, d.rel_l2 == 1.0 and d.cosine == 0.0  # m − b = −b: m is zero


def _trained_from(c: Comparison, name: str, run: int) -> int | None:
    """The first update at which run `run` (0 baseline, 1 merged) held a non-zero gradient for
    `name` (None: none did)."""
    for r in c.results:
        for d in r.grads:
            if d.name == name and (zero := _zero(d)) is not None and not zero[run]:
                return r.update
    return None


def _from(update: int | None) -> str:
    return "never" if update is None else f"from update {update}"


def trained_from_another_update(c: Comparison) -> Diagnosis | None:
    r = failing(c)
    if r is None or not r.loss_ok:
        return None
    apart = [d for d in r.grads if not d.ok and (z := _zero(d)) is not None and z[0] != z[1]]
    names = [d.name for d in apart]
    if not apart or any(not d.ok and d.name not in names for d in (*r.grads, *r.weights)):
        return None  # the step moved only them: every other tensor still agrees
    if all(d.name in names for d in r.grads):
        return None  # no other tensor to agree: a whole gradient zero (cleared before the step)
    earlier = {d.name: _zero(d) for e in c.results[: r.update] for d in e.grads if d.name in names}
    if any(zero != (True, True) for zero in earlier.values()) or len(earlier) < len(names) * (
        r.update > 0
    ):
        return None  # trained before in either run: not a tensor unfrozen here
    base_from = _trained_from(c, names[0], 0)
    merged_from = _trained_from(c, names[0], 1)
    more = f" and {len(names) - _SHOWN} more" if len(names) > _SHOWN else ""
    evidence = {
        "first_update": r.update,
        "tensors": names,
        "baseline_from": base_from,
        "merged_from": merged_from,
    }
    got = (
        f"{', '.join(names[:_SHOWN])}{more} get a gradient {_from(merged_from)} in the merged "
        f"run and {_from(base_from)} in the baseline"
    )
    if not r.update and None in (base_from, merged_from):  # one run never trains them
        return Diagnosis(
            "lr-schedule",
            f"{got}: one run trains them and the other never does, every other tensor "
            "agreeing: they are frozen (requires_grad_(False), or no loss term reaches them) in "
            "one run only",
            evidence,
            "freeze the same tensors in both runs (requires_grad, param groups), with the same "
            "loss terms",
        )
    return Diagnosis(
        "lr-schedule",
        f"{got}{', zero in both before' if r.update else ''}: they were unfrozen "
        "(requires_grad) at another point of the training, as at a count of micro-steps instead "
        "of updates",
        evidence,
        "unfreeze them (or add their param group) at the same update in both runs: count "
        "optimizer steps, not micro-batches",
    )


def _written(column: np.ndarray, m: int) -> bool:
    """Whether a parameter's `.grad` was written at micro-step m (`micro/grad_writes`: its
    counter moved, and it holds a gradient)."""
    return bool(column[m] != 0 and (m == 0 or column[m] != column[m - 1]))


def frozen_inside_window(c: Comparison) -> Diagnosis | None:
    """Tensors frozen inside a window: at the first failing update only they fail, and in the
    merged run their `.grad` was last written at a micro-step before the window's last and
    never after (`micro/grad_writes`), while every other parameter's was written at the
    window's last micro-step: `requires_grad_(False)` at a count of micro-steps. A tensor that
    only some micro-batches reach (an expert no token chose) is written again later."""
    r, run = failing(c), c.merged
    states = run.micro_grad_writes
    if r is None or states is None or window(c) < 2 or not r.loss_ok:
        return None
    columns = {t.name: p for p, t in enumerate(run.tensors) if t.kind == "param"}
    names = [d.name for d in r.grads if not d.ok and d.name in columns]
    if not names or {d.name for d in (*r.grads, *r.weights) if not d.ok} - set(names):
        return None  # the step moved only them: every other tensor still agrees
    w = run.window(r.update)
    last = {}
    for name in names:
        column = states[:, columns[name]]
        written = [m for m in w if _written(column, m)]
        later = any(_written(column, m) for m in range(w.stop, len(column)))
        if not written or written[-1] == w.stop - 1 or later:
            return None
        last[name] = written[-1] - w.start
    others = [p for name, p in columns.items() if name not in last]
    if not others or not all(_written(states[:, p], w.stop - 1) for p in others):
        return None  # the window's last micro-batch reached nothing: micro-batch-missing's
    k, position = window(c), max(last.values())
    more = f" and {len(names) - _SHOWN} more" if len(names) > _SHOWN else ""
    return Diagnosis(
        "lr-schedule",
        f"{', '.join(names[:_SHOWN])}{more} stopped getting gradients inside window "
        f"{r.update} of the merged run: their .grad was last written at micro-step {position} "
        f"(of {k}, from 0) and never after, while the baseline's were computed at update "
        f"{r.update}: they were frozen (requires_grad_(False)) inside the window, as at a count "
        "of micro-steps instead of updates, and the window stepped with part of their gradient",
        {
            "first_update": r.update,
            "tensors": names,
            "last_written_micro_step": position,
        },
        "freeze them (or drop their param group) between two windows, at the same update in "
        "both runs: count optimizer steps, not micro-batches",
    )
