"""Judge a merged run against its baseline, update by update, from the recorded data alone.

Without a reference the dtype's fixed tolerances apply. With a more precise reference run (a
float64 rerun of the baseline) each error is judged against the baseline's own error, so the
verdict is calibrated by the run's floating-point noise (see tolerances.Tolerances).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable

import numpy as np

from ..runs.model import Run, Tensors
from .apart import entered_apart, judge_apart, passes
from .backprop import backprop_check, unbackpropagated
from .below_noise import shape_below_noise
from .bookkeeping import bookkeeping_judge, unjudged_losses
from .checks import build_checks
from .clip_norms import rank_norms_check
from .compatible import (
    ReferenceBound,
    check_compatible,
    check_reference,
    check_reference_weights,
    check_same_precision,
)
from .diagnose import diagnose
from .distributed import check_baseline_ranks, rank_check, rank_facts, rank_problems
from .drift import Drift
from .grad_norm import norms_of
from .honest import honest_differences
from .inputs import Inputs
from .loss_steps import window_step
from .metrics import calibrate, diff, fit_of, fit_sums, noise_allowed, quiet
from .noise import nearby_loss_noise, pooled_loss_noise
from .replicas import replica_disagreements
from .results import FAIL, NOT_CHECKED, PASS, Check, Comparison, UpdateResult
from .rounding import marked, rounding_floors, rounding_in_both, rounding_notes
from .run_notes import run_notes, written_note
from .sketched import SketchJudge, sketch_note
from .skipped_steps import excuse_skipped_gradients
from .step_rules import stored_bits
from .stream import StreamJudge, streamable
from .tolerances import Tolerances, eps, for_dtype, least_precise, loss_rounding
from .undeclared import undeclared_note
from .unstable import unstable_note
from .vacuous import unmoved_note, unrecorded_note, untrained_note, vacuous_notes
from .views import sketch_width
from .weight_term import failing, net_of_weights, netted_notes
from .window_sizes import judged_updates
from .windows import inside_window_changes, written_in_forward

__all__ = ["FAIL", "NOT_CHECKED", "PASS", "Check", "Comparison", "UpdateResult", "compare"]
# Judges the tensors of one update into its result; made from the tolerances and the noise floor
# (floor·eps). The default reads both runs' tensors; a golden file judges from its summaries.
TensorJudge = Callable[[UpdateResult], None]
TensorJudgeFactory = Callable[[Tolerances, float], TensorJudge]


@quiet
def compare(
    base: Run,
    merged: Run,
    overrides: dict | None = None,
    reference: Run | None = None,
    on_update: Callable[[int], None] | None = None,
    tensors: TensorJudgeFactory | None = None,
    streaming: bool | None = None,
) -> Comparison:
    """Judge `merged` against `base` (and `reference`). Raises BadInput for incomparable runs.

    `on_update(i)` is called after each update is judged (progress for long runs); `tensors`
    replaces the judging of weights and gradients (a golden file's summaries). `streaming`:
    False reads whole tensors even from run directories (the reference implementation the
    streamed judge is tested against); by default run directories are streamed."""
    starts = check_compatible(base, merged)
    check_same_precision(base, merged)
    check_baseline_ranks(base)
    bound = check_reference(base, merged, reference) if reference is not None else None
    dtype = least_precise([base.compute_dtype, merged.compute_dtype])
    tol = for_dtype(dtype, overrides)
    # The floor is rounding of the stored values: the parameters' dtype, not autocast's.
    storage = least_precise([base.dtype, merged.dtype])
    width = sketch_width(base, merged, reference) if tensors is None else None
    plain = tensors is None and width is None  # whole tensors, streamed where they can be
    streaming = plain and streaming is not False and streamable(base, merged, reference)
    whole = plain and not streaming
    judge = _Judge(base, merged, reference, tol, eps(storage), starts, bound, whole, eps(dtype))
    inputs = Inputs(base, merged, reference, tol, judge.floor, bound, dtype)
    stream = StreamJudge(inputs) if streaming else None
    judge_tensors: TensorJudge
    if tensors is not None:
        judge_tensors = tensors(tol, judge.floor)
    elif width is not None:
        judge_tensors = SketchJudge(inputs, width)
    else:
        judge_tensors = stream or judge.tensors
    try:
        return _judge(base, merged, reference, tol, dtype, judge, judge_tensors, on_update)
    finally:
        if isinstance(judge_tensors, (StreamJudge, SketchJudge)):
            judge_tensors.close()


def _judge(
    base: Run,
    merged: Run,
    reference: Run | None,
    tol: Tolerances,
    dtype: str,
    judge: _Judge,
    judge_tensors: TensorJudge,
    on_update: Callable[[int], None] | None,
) -> Comparison:
    """Every update's losses, tensors and bookkeeping; then the checks and the diagnosis."""
    written = written_in_forward(base)
    changes = inside_window_changes(merged, written)
    silent = unbackpropagated(merged)
    disagreements = replica_disagreements(merged)
    ranks = rank_facts(merged)  # a data-parallel run's ranks must be replicas, bit for bit
    rank_disagreements = rank_problems(merged, ranks)
    bookkeeping = bookkeeping_judge(base, merged)
    results = []
    for i in range(judged_updates(base, merged)):
        result = judge.loss(i)
        if reference is None:  # the tensors' judges widen the drift by it (apart.passes)
            result.entered_apart = entered_apart(results[-1] if results else None, i, base, merged)
        judge_tensors(result)
        bookkeeping(result)
        result.problems.extend(("window", text) for text in changes.get(i, []))
        result.problems.extend(("backward", text) for text in silent.get(i, []))
        result.problems.extend(("replicas", text) for text in disagreements.get(i, []))
        result.problems.extend(("ranks", text) for text in rank_disagreements.get(i, []))
        results.append(result)
        if on_update is not None:
            on_update(i)
    jumps = judge_apart(results, tol) if reference is None else []
    jumps += rounding_notes(results) + netted_notes(results)
    seen = judge_tensors.width if isinstance(judge_tensors, SketchJudge) else None
    jumps += excuse_skipped_gradients(results, base, merged)  # before: they read the failures
    jumps += honest_differences(results, base, merged, reference, tol.noise_factor, seen)
    calibrated = reference is not None
    checks = build_checks(base, merged, results, changes, calibrated, disagreements, tol.grad_rtol)
    checks += backprop_check(silent)
    if ranks is not None:
        checks.insert(1, rank_check(merged, ranks))
        clipped = rank_norms_check(base, merged, ranks.agree)
        checks += [clipped] if clipped is not None else []
    comparison = Comparison(
        base,
        merged,
        tol,
        dtype,
        results,
        checks,
        [
            *base.notes,
            *merged.notes,
            *run_notes(base, merged, judge.merged_loss),
            *written_note(written, base),
            *jumps,
            *sketch_note(results),
            *vacuous_notes(results, tol, judge.resolution, judge.base_loss),
            *(untrained_note(base, merged) or unmoved_note(results)),
            *unrecorded_note(base, merged),
            *undeclared_note(base, merged),
            *unstable_note(results, calibrated),
        ],
        _first_divergence(results),
        reference,
        ranks=ranks,
    )
    hidden = shape_below_noise(comparison)  # a bug's shape the noise floor let pass
    if hidden is not None:
        comparison.checks.append(hidden[0])
        comparison.diagnosis, comparison.first_divergence = [hidden[1]], hidden[2]
    else:
        comparison.diagnosis = diagnose(comparison)
    return comparison


# printed weights: the roundings two trainings summing in other orders take apart, a random walk
# of about one spacing per update at most, allowed twice over (units of eps times the weight);
# Adam's noise-dominated elements may walk further (1 of 30 hunted Adam pairs, 1.08x at update
# 84), which only gradients tell (recorded runs: judge/drift.py)
WALK = 2.0


class _Judge:
    """Per-update loss and tensor judgements, with or without a reference."""

    def __init__(
        self,
        base: Run,
        merged: Run,
        ref: Run | None,
        tol: Tolerances,
        epsilon: float,
        starts: Tensors | None,
        bound: ReferenceBound | None = None,
        whole: bool = True,
        loss_epsilon: float | None = None,
    ) -> None:
        """`whole`: this judge reads whole tensors (else a `StreamJudge` does, for run
        directories, and this one judges the losses alone). `loss_epsilon`: the epsilon a loss
        was rounded to where it was computed (autocast's dtype; default `epsilon`)."""
        self.base, self.merged, self.ref, self.tol = base, merged, ref, tol
        self.bound = bound
        self.floor, self.epsilon = tol.noise_floor * epsilon, epsilon
        self.starts = starts
        self.first_printed: Tensors = {}  # the baseline's first printed weights, per tensor
        # elements line up (no printed arrays): drift, and the net of a penalty's term
        self.full = base.full_weights and merged.full_weights
        drifts = whole and starts is not None and (ref is not None or self.full)
        self.drift = Drift(starts, stored_bits(base), ref is None) if drifts else None
        n = judged_updates(base, merged)  # runs whose windows stop lining up are cut there
        self.base_loss, self.merged_loss = base.window_losses()[:n], merged.window_losses()[:n]
        self.resolution = base.window_loss_quantum()[:n] + merged.window_loss_quantum()[:n]
        self.unjudged = unjudged_losses(base, merged, n)  # skipped by both, a loss unprinted
        compute = least_precise([base.compute_dtype, merged.compute_dtype])
        self.dtype = compute
        # without a reference: a loss computed in a 16-bit dtype is known to its rounding there
        self.loss_rounding = loss_rounding(
            [base.micro_loss, merged.micro_loss], compute
        ) or window_step(merged, compute)
        self.loss_noise: np.ndarray | None = None
        if ref is not None:
            self.ref_loss = ref.window_losses()[:n]
            own = np.abs(self.base_loss - self.ref_loss)
            # One scalar's error is heavy-tailed; pool it over the run as a lower bound.
            pooled = pooled_loss_noise(own[~self.unjudged])  # skipped by both: none there
            pooled = np.maximum(pooled, nearby_loss_noise(own, ~self.unjudged))  # as they part
            # and a recorded loss is known to one rounding of its own value at best: a window
            # mean of K losses, each rounded where it was computed (under autocast, perhaps in
            # its dtype: a bfloat16 loss of 21 is a multiple of 0.125), errs by a few of those
            quantum = (loss_epsilon or epsilon) * np.abs(self.ref_loss)
            self.loss_noise = np.maximum(np.maximum(own, pooled), quantum)

    def loss(self, i: int) -> UpdateResult:
        if self.unjudged[i]:
            return UpdateResult(i, math.nan, math.nan, 0.0, 0.0, 0.0, loss_judged=False)
        b, m = self.base_loss[i], self.merged_loss[i]
        gap = abs(m - b)
        gap = float(gap) if math.isfinite(gap) else math.inf
        if self.loss_noise is None:
            rtol = self.tol.loss_rtol + self.tol.noise_factor * self.loss_rounding
            allowed = self.tol.loss_atol + rtol * abs(b) + self.resolution[i]
            return UpdateResult(i, float(b), float(m), gap, gap, float(allowed))
        r, noise = self.ref_loss[i], float(self.loss_noise[i])
        error = abs(m - r)
        error = float(error) if math.isfinite(error) else math.inf
        allowed = (
            noise_allowed(self.tol.noise_factor, noise, self.floor, abs(r)) + self.resolution[i]
        )
        return UpdateResult(i, float(b), float(m), gap, error, float(allowed), noise)

    def tensors(self, result: UpdateResult) -> None:
        i = result.update
        gb, gm = self.base.grads(i), self.merged.grads(i)
        gr = self.ref.grads(i) if self.ref is not None else None
        wb, wm = self.base.weights(i), self.merged.weights(i)
        wr = self.ref.weights(i) if self.ref is not None else None
        grads = []
        if gb is not None and gm is not None:
            names = [t.name for t in self.base.tensors if t.name in gb and t.name in gm]
            atol, floor16 = rounding_floors(self.tol, self.dtype, gb, names, self.ref is None)
            for name in names:
                d = diff(name, gb[name], gm[name], rtol=self.tol.grad_rtol, atol=atol)
                d = rounding_in_both(marked(d, self.tol.weight_atol, atol), floor16)
                grads.append(self._calibrated(d, gb, gm, gr))
            bb, mm, bm = fit_sums([gb[n] for n in names], [gm[n] for n in names])
            result.grad_ratio, result.grad_cosine = fit_of(bb, mm, bm)
            if gr is not None and all(n in gr for n in names):
                ref = norms_of(gr[n] for n in names)
                result.grad_norms = (math.sqrt(bb), math.sqrt(mm), ref)
        if self.ref is None and i > 0 and failing(grads) and self.full:
            entered = self.base.weights(i - 1), self.merged.weights(i - 1)
            grads = net_of_weights(grads, gb, gm, *entered)  # judge/weight_term.py
        if self.drift is not None and wb is not None:
            if wr is not None:
                self.drift.advance(gb, gr, wb, wr, first=i == 0)
            elif wm is not None:  # no reference: the merged run, where its gradients passed
                passed = {d.name for d in grads if passes(d, self.tol, result.entered_apart)}
                self.drift.advance(gb, gm, wb, wm, passed=passed)
        walked = self.drift.strayed if self.drift is not None else None
        if wb is not None and wr is not None and self.bound is not None:
            check_reference_weights(i, wb, wr, self.starts, self.bound, walked)
        if wb is not None and wm is not None:
            self._weights(result, wb, wm, wr)
        result.grads.extend(grads)

    def _weights(self, result: UpdateResult, wb: Tensors, wm: Tensors, wr: Tensors | None):
        i, tol = result.update, self.tol
        qm = self.merged.weight_quantum(i)
        qr = self.ref.weight_quantum(i) if self.ref is not None else None
        slack = _print_slack(self.base.weight_quantum(i), qm)
        rounding = _print_slack(qm, qr)
        printed = not self.base.full_weights
        for info in self.base.tensors:
            start = self.starts.get(info.name) if self.starts is not None else None
            first = self.first_printed.setdefault(info.name, wb[info.name]) if printed else None
            d = diff(
                info.name,
                wb[info.name],
                wm[info.name],
                rtol=tol.weight_rtol,
                atol=tol.weight_atol,
                start=start,
                elementwise=printed,
                slack=slack.get(info.name),
                floor=self.floor,
                printed_start=first,
                walk=WALK * math.sqrt(i + 1) * self.epsilon if printed else 0.0,
            )
            d = self._calibrated(d, wb, wm, wr, start)
            if d.noise is not None and info.name in rounding:  # printed: rounding allowed
                extra = float(np.linalg.norm(rounding[info.name]))
                d = dataclasses.replace(d, allowed=d.allowed + extra)
            if self.drift is not None:
                d = self.drift.judged(d, wb[info.name], wm[info.name], tol.noise_factor)
            result.weights.append(d)

    def _calibrated(self, d, base: Tensors, merged: Tensors, ref: Tensors | None, start=None):
        if ref is None or d.name not in ref:
            return d
        return calibrate(
            d,
            base[d.name],
            merged[d.name],
            ref[d.name],
            factor=self.tol.noise_factor,
            floor=self.floor,
            start=start,
        )


def _print_slack(*quanta: Tensors | None) -> dict[str, np.ndarray]:
    """Per tensor, the sum of the given print resolutions (empty when no run was printed)."""
    known = [q for q in quanta if q is not None]
    if not known:
        return {}
    return {name: sum(q[name] for q in known if name in q) for name in known[0]}


def _first_divergence(results: list[UpdateResult]) -> dict | None:
    """The first failing update; inside it, the first failing parameter in model order, and
    whether the divergence already shows in the gradient or only after the optimizer update."""
    for r in results:
        if r.ok:
            continue
        bad_w = next((d.name for d in r.weights if not d.ok), None)
        bad_g = next((d.name for d in r.grads if not d.ok), None)
        where = (
            "gradient"
            if bad_g or r.grad_failed
            else "optimizer update"
            if bad_w
            else "loss"
            if not r.loss_ok
            else "bookkeeping"
        )
        return {"update": r.update, "parameter": bad_g or bad_w, "in": where}
    return None
