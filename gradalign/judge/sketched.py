"""Judging weights and gradients from sketches, when a run was recorded with `--record sketch`.

Tensors kept whole (at most the sketch width, and 1-D ones such as biases and norms' scales up
to the manifest's `whole_1d`) are judged exactly
as from full runs, the noise-dominated drift included (drift.Drift), against the reference or,
without one, against the merged run where its gradients passed. Larger tensors are judged
from estimates: ||m − ref|| and ||b − ref|| are estimated by the norms of sketch differences
(runs/sketches.estimate), and the estimator's bound is folded into what is allowed, in the
direction that never fails what the exact judgement passes:

    error = E(m − ref)
    allowed = factor·E⁺(b − ref) + floor·||ref|| + (E − E⁻)(m − ref)

(E⁺, E⁻: the upper and lower bounds; the part of `allowed` that is the estimator's bound is
the judgement's `slack`: a tensor that passes only by it is no evidence of a pass). Such a
tensor's judgement is marked `sketched`; its max abs and max rel diffs are unknown (NaN), and
its drift allowance (the drift needs element values) is what judge/sketch_drift.py measured at
the updates with full files and estimated between them: against the reference, or without one
against the merged run, where the tensor's error then counts only beyond it. The reference is
refused only when the lower bound of the baseline's distance from it exceeds the upper bound
of what is allowed (its noise estimated from the sketches between snapshots:
judge/sketch_drift.py); the refusal says the estimate was a sketch's and names the full rerun
that reads each element's drift (model zoo run 217002, an encoder under Rprop, K=4, 20 updates:
the baseline 2.6% of the distance training moved from the float64 reference at update 3,
sketched, where Rprop's steps, decided by signs rounding noise chose, part elements; recorded in
full, that drift is read element by element and the run passes).
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np

from ..errors import BadInput
from ..runs.model import Run
from ..runs.sketches import Estimate, estimate
from .apart import passes
from .compatible import check_reference_weights, stray
from .distributed import listed
from .drift import Drift, beyond_drift, widened
from .grad_norm import model_norm
from .inputs import Inputs
from .metrics import TensorDiff, calibrate, diff, fit_ratio, fixed_allowed
from .results import UpdateResult
from .rounding import floors, marked, rounding_in_both
from .sketch_drift import SketchDrift
from .step_rules import stored_bits
from .views import Kept, Sketching, full_rerun, summaries
from .weight_term import Sums, coefficient, failing, netted


def _exact(kept: dict[str, Kept] | None, shapes: dict) -> dict[str, np.ndarray] | None:
    if kept is None:
        return None
    return {n: k.vector.reshape(shapes[n]) for n, k in kept.items() if k.exact}


class SketchJudge:
    """`compare._Judge.tensors` when any run kept sketches."""

    def __init__(self, inputs: Inputs, width: Sketching) -> None:
        self.base, self.merged, self.ref, self.tol, self.floor, self.bound = inputs.unpack()
        self.width = width
        self.dtype = inputs.dtype
        self.shapes = {t.name: t.shape for t in self.base.tensors}
        self.sizes = {t.name: math.prod(t.shape) for t in self.base.tensors}
        self.start = summaries(self.base, "weights", None, width) or {}
        starts = _exact(self.start, self.shapes) or {}
        self.starts = starts
        # the tensors kept whole at every update (at most the width): against the reference,
        # or else the merged run where its gradients passed (drift.Drift)
        self.drift = Drift(starts, stored_bits(self.base), self.ref is None)
        # the sketched tensors' drift, from the full files of the snapshot updates: against
        # the reference, or else the merged run where its gradients passed
        other = self.ref if self.ref is not None else self.merged
        stored = self.base.store is not None and other.store is not None
        self.sketch_drift = SketchDrift(self.base, other, self.ref is None) if stored else None
        self.previous: tuple[dict[str, Kept], dict[str, Kept]] | None = None  # wb, wr
        self.entered: tuple[dict[str, Kept], dict[str, Kept]] | None = None  # wb, wm before

    def close(self) -> None:
        if self.sketch_drift is not None:
            self.sketch_drift.close()

    def _get(self, run: Run | None, kind: str, i: int) -> dict[str, Kept] | None:
        return None if run is None else summaries(run, kind, i, self.width)

    def __call__(self, result: UpdateResult) -> None:
        i, tol = result.update, self.tol
        apart = result.entered_apart
        gb, gm, gr = (self._get(r, "grads", i) for r in (self.base, self.merged, self.ref))
        wb, wm, wr = (self._get(r, "weights", i) for r in (self.base, self.merged, self.ref))
        ex = {
            key: _exact(v, self.shapes)
            for key, v in (("gb", gb), ("gm", gm), ("gr", gr), ("wb", wb), ("wm", wm), ("wr", wr))
        }
        grads = []
        both = gb is not None and gm is not None  # a skipped update holds no gradient
        names = [t.name for t in self.base.tensors if both and t.name in gb and t.name in gm]
        if names:
            atol, floor16 = tol.weight_atol, 0.0
            if self.ref is None:  # the fixed tolerance, with the rounding floor (exact norms)
                sumsq = sum(gb[n].norm ** 2 for n in names)
                elements = sum(self.sizes[n] for n in names)
                atol, floor16 = floors(tol, self.dtype, sumsq, elements)
            judged = (self._judge(n, gb, gm, gr, tol.grad_rtol, False, atol) for n in names)
            grads = [rounding_in_both(marked(d, tol.weight_atol, atol), floor16) for d in judged]
            result.grad_ratio, result.grad_cosine = fit_ratio(
                [gb[n].vector for n in names], [gm[n].vector for n in names]
            )
            if gr is not None and all(n in gr for n in names):
                norms = (model_norm(g[n].norm ** 2 for n in names) for g in (gb, gm, gr))
                result.grad_norms = tuple(norms)
        if self.ref is None and i > 0 and failing(grads) and self.entered is not None:
            grads = self._net_of_weights(grads, gb, gm)  # type: ignore[arg-type]
        self.entered = (wb, wm) if wb is not None and wm is not None else None
        walked = None
        if ex["wb"] is not None and ex["wr"] is not None:
            self.drift.advance(ex["gb"], ex["gr"], ex["wb"], ex["wr"], first=i == 0)
            walked = self.drift.strayed
            if self.sketch_drift is not None:
                self._sketch_drift(i, (gb, gr), (wb, wr))  # type: ignore[arg-type]
        elif self.ref is None and ex["wb"] is not None and ex["wm"] is not None:
            passed = {d.name for d in grads if passes(d, tol, apart)}
            self.drift.advance(ex["gb"], ex["gm"], ex["wb"], ex["wm"], passed=passed)
            if self.sketch_drift is not None:  # a gradient that passed by the bound alone
                clearly = {d.name for d in grads if passes(d, tol, apart, clearly=True)}
                self._sketch_drift(i, (gb, gm), (wb, wm), clearly)  # type: ignore[arg-type]
        if wb is not None and wr is not None and self.bound is not None:
            check_reference_weights(i, ex["wb"], ex["wr"], self.starts, self.bound, walked)
            self._check_sketched_reference(i, wb, wr)
        unclear = {d.name for d in grads if not passes(d, tol, apart, clearly=True)}
        if wb is not None and wm is not None:
            for info in self.base.tensors:
                d = self._judge(info.name, wb, wm, wr, tol.weight_rtol, start=True)
                if wb[info.name].exact:
                    d = self.drift.judged(
                        d, wb[info.name].vector, wm[info.name].vector, tol.noise_factor
                    )
                elif self.sketch_drift is not None and wr is not None:
                    d = widened(d, self.sketch_drift.allowance(info.name), tol.noise_factor)
                elif self.sketch_drift is not None and info.name not in unclear:
                    # the drift lives in some elements and a bug may in others: a tensor
                    # whose gradient did not clearly pass here is judged without it
                    drift = self.sketch_drift.allowance(info.name)
                    d = beyond_drift(d, max(0.0, d.error - drift), drift)
                result.weights.append(d)
        result.grads.extend(grads)

    def _net_of_weights(
        self, grads: list[TensorDiff], gb: dict[str, Kept], gm: dict[str, Kept]
    ) -> list[TensorDiff]:
        """The failing gradients judged again net of c·Δw (judge/weight_term.py), c fitted over
        the tensors kept whole exactly and the sketched ones from their sketches (which
        subtract, and whose inner products estimate the tensors' without bias); a sketched
        residual is estimated with its own bound."""
        assert self.entered is not None
        pb, pm = self.entered
        wide = lambda k: np.asarray(k.vector, dtype=np.float64)  # noqa: E731
        deltas = {
            d.name: (wide(gm[d.name]) - wide(gb[d.name]), wide(pm[d.name]) - wide(pb[d.name]))
            for d in grads
            if d.name in pb and d.name in pm and pb[d.name].exact == gb[d.name].exact
        }
        sums = {n: Sums.of(g, w) for n, (g, w) in deltas.items()}
        c = coefficient(sums.values())
        judged = []
        for d in grads:
            if d.ok or d.name not in deltas or not c:
                judged.append(d)
                continue
            if not d.sketched:
                judged.append(netted(d, sums[d.name].residual(c), c))
                continue
            g, w = deltas[d.name]
            gap = estimate(g - c * w, False, self.sizes[d.name])
            slack = gap.value - gap.low
            net = dataclasses.replace(d, allowed=d.allowed - d.slack + slack, slack=slack)
            net = netted(net, gap.value, c)
            judged.append(net if net.ok else d)
        return judged

    def _sketch_drift(
        self, i: int, grads: tuple, weights: tuple, passed: set[str] | None = None
    ) -> None:
        """The sketched tensors' drift (against the merged run: those whose gradients
        `passed`): measured where full files allow, else estimated."""
        assert self.sketch_drift is not None
        wb, wr = weights
        names = [
            n for n, k in wb.items() if not k.exact and n in wr and (passed is None or n in passed)
        ]
        before = self.previous or (self.start, self.start)
        measured = self.sketch_drift.advance(i, names)
        if not measured and all(g is not None for g in grads):
            self.sketch_drift.estimate(names, grads, weights, before)
        self.previous = weights

    def _judge(
        self,
        name: str,
        b: dict,
        m: dict,
        r: dict | None,
        rtol: float,
        start: bool,
        atol: float | None = None,
    ):
        kb, km, kr = b[name], m[name], None if r is None else r.get(name)
        ks = self.start.get(name) if start else None
        tol = self.tol
        atol = tol.weight_atol if atol is None else atol
        floor = self.floor if start else 0.0  # a weight's rounding (metrics.fixed_allowed)
        if kb.exact:
            shape = self.shapes[name]
            s = ks.vector.reshape(shape) if ks is not None else None
            d = diff(name, kb.vector, km.vector, rtol=rtol, atol=atol, start=s, floor=floor)
            if kr is None:
                return d
            return calibrate(
                d,
                kb.vector,
                km.vector,
                kr.vector,
                factor=tol.noise_factor,
                floor=self.floor,
                start=s,
            )
        return self._sketched(name, kb, km, kr, ks, rtol, floor, atol)

    def _sketched(
        self,
        name: str,
        kb: Kept,
        km: Kept,
        kr: Kept | None,
        ks: Kept | None,
        rtol: float,
        floor: float,
        atol: float,
    ) -> TensorDiff:
        tol, nan, n = self.tol, math.nan, self.sizes[name]
        held = _held_alike(ks, kb, km, kr)
        if held is False or not (math.isfinite(kb.norm) and math.isfinite(km.norm)):
            norm = kb.norm if held is not False and math.isfinite(kb.norm) else None
            return TensorDiff(
                name, nan, nan, nan, nan, math.inf, 0.0, None, sketched=True, norm=norm
            )
        gap = estimate(km.vector - kb.vector, False, n)
        moved = estimate(kb.vector - ks.vector, False) if ks is not None else None
        scale = moved.high if moved is not None else kb.norm
        d = TensorDiff(
            name,
            nan,
            nan,
            gap.value / kb.norm if kb.norm > 0 else (0.0 if gap.value == 0 else math.inf),
            _cosine(kb.norm, km.norm, gap),
            gap.value,
            fixed_allowed(rtol, scale, atol, self.sizes[name], floor, kb.norm)
            + gap.value
            - gap.low,
            None if moved is None else moved.value,
            sketched=True,
            norm=kb.norm,
            size=n,
            slack=gap.value - gap.low,
        )
        if kr is None:
            return d
        if not math.isfinite(kr.norm):
            return dataclasses.replace(d, error=math.inf, allowed=0.0, noise=nan)
        error = estimate(km.vector - kr.vector, False, n)
        noise = estimate(kb.vector - kr.vector, False)
        slack = tol.noise_factor * (noise.high - noise.value) + error.value - error.low
        allowed = tol.noise_factor * noise.value + self.floor * kr.norm + slack
        return dataclasses.replace(
            d,
            error=error.value,
            allowed=allowed,
            noise=noise.value,
            rounding=self.floor * kr.norm,
            slack=slack,
            sizes=(km.norm, kr.norm),
        )

    def _check_sketched_reference(self, i: int, wb: dict, wr: dict) -> None:
        bound = self.bound
        assert bound is not None
        for name, kb in wb.items():
            kr, ks = wr.get(name), self.start.get(name)
            if kb.exact or kr is None or not math.isfinite(kb.norm):
                continue
            far = estimate(kb.vector - kr.vector, False, self.sizes[name])
            moved = estimate(kr.vector - ks.vector, False).high if ks is not None else kr.norm
            allowed = fixed_allowed(bound.rtol, moved, bound.atol, self.sizes[name])
            if self.sketch_drift is not None:
                allowed += self.sketch_drift.strayed(name)
            if not far.low <= allowed + bound.rounding(name, i) * kr.norm:
                raise BadInput(
                    f"{stray(bound, i, name, far.value)}; estimated from the sketches of an "
                    "update without full files, where no element's drift is read (an optimizer "
                    "that steps by the gradient's sign, as Rprop, parts the elements whose sign "
                    "rounding noise chose further than the sketches tell); full weights would "
                    f"tell: {full_rerun(i)}"
                )


def _held_alike(start: Kept | None, *runs: Kept | None) -> bool | None:
    """Whether the infinities a sketched tensor holds apart (runs/sketches.py) are the very
    ones it started with, in every run: None where no run holds any; True where the start and
    every run hold the same (the tensor is then judged by its finite elements, as a full run's
    by `metrics.agreed_non_finite`); False otherwise (an infinity that training made never
    passes, nor one a run lost)."""
    kept = [k for k in runs if k is not None]
    if all(k.held is None for k in (start, *kept) if k is not None):
        return None
    if start is None or start.held is None:
        return False
    return all(k.held is not None and np.array_equal(k.held, start.held) for k in kept)


def _cosine(norm_b: float, norm_m: float, gap: Estimate) -> float:
    """cos(b, m) from both norms and the estimated ||m − b||."""
    if not (norm_b and norm_m):
        return float(gap.value == 0)
    value = (norm_b**2 + norm_m**2 - gap.value**2) / (2 * norm_b * norm_m)
    return max(-1.0, min(1.0, value))


def sketch_note(results: list[UpdateResult]) -> list[str]:
    """Which checks were sketched, said once in the report's notes."""
    names = sorted({d.name for r in results for d in (*r.weights, *r.grads) if d.sketched})
    if not names:
        return []
    shown = listed(names, 4)
    return [
        f"sketched: the weights and gradients of {shown} were judged from sketches (the runs "
        "were recorded with --record sketch): their errors and noise are estimates, whose bound "
        "is added to what is allowed; their max abs and max rel diffs need element values, "
        "kept only at the snapshot updates, and are not judged; a kink crossed in one run is "
        "told from a bug by the gradients' row and column sums (each unit's error estimated); "
        "their noise-dominated drift is measured where the baseline and the reference (without "
        "one, the merged run) kept full files at an update and the one before it (the first "
        "update, at least), and grows elsewhere by the share of both runs' steps it took "
        "there; what their gradient noise explains of the baseline's distance from the "
        "reference is estimated from the sketches elsewhere; tensors kept whole (at most the "
        "sketch width, or 1-D up to the runs' whole_1d) are judged exactly"
    ]
