"""The noise-dominated drift (judge/drift.py) of sketched tensors, from the full files a sketched
run keeps at its snapshot updates: against the reference, or without one against the merged run
(`shared_steps`, counted where the tensor's gradients passed, as `Drift` counts it).

A sketch cannot tell which elements' gradients were rounding noise, but the first update always
has full files: the baseline's and the reference's weights and gradients, and the starting
weights both stepped from. There, and at any later update whose previous update kept full files
in both runs too, each sketched tensor's drift is measured as the streamed judge measures it
(`noise_steps`, slice by slice: memory stays a few slices), and carried through the sketched
updates after it. An adaptive optimizer's first step (Adam's, RMSprop's, Adagrad's: ±lr per
element) is where a gradient of pure noise moves its element furthest.

At the other updates no element values exist. What the baseline's own gradient noise explains of
its distance from the reference (`noise_steps`' second part, Σ(TAU·ρ·step)² over the elements) is
estimated for the tensor as a whole: TAU·ρ times both runs' steps, ρ = ||gb − gr|| / ||gr|| from
the gradients' sketches, at most 1 (an element's noise explains at most its step). Under SGD a
step follows its gradient and the two agree; an adaptive optimizer steps small gradients as far
as large ones, where the elements' sum exceeds the tensor's, so the estimate is the tighter of
the two. The noise-dominated elements walk on there (a gradient that is rounding noise in one run
and far smaller in the float64 one stays noise: a weight no input reaches, a channel a norm
cancels), and Adam steps each about as far as at the first update: their drift grows by the share
of both runs' steps it took at the last measured update, ||drift steps|| / (||Δb|| + ||Δr||),
times both runs' steps estimated from the sketches (`walked`). Under SGD that share is the
gradient's relative noise, so it adds next to nothing.
"""

from __future__ import annotations

import math

import numpy as np

from ..runs.layout import grads_file, weights_file
from ..runs.model import Run
from ..runs.sketches import dot, estimate
from ..runs.store import CheckedFile
from .drift import TAU, graded, noise_steps, shared_rms, shared_steps
from .drift_files import DriftFiles
from .fused import widen64
from .step_rules import stored_bits
from .update_files import CHUNK  # the streamed judge's slices
from .views import Kept


class SketchDrift:
    """Per sketched tensor, the drift against the reference (or the merged run standing in for
    it, `against_merged`), measured where full files allow and estimated elsewhere."""

    def __init__(self, base: Run, ref: Run, against_merged: bool = False) -> None:
        self.base, self.ref, self.against_merged = base, ref, against_merged
        self.params = {t.name: t.shape for t in base.tensors if t.kind == "param"}
        self.shapes = {t.name: t.shape for t in base.tensors}
        self.bits = stored_bits(base)
        self.files = DriftFiles()
        self.shares: dict[str, float] = {}  # the drift's share of both runs' steps, measured
        self.walked: dict[str, float] = {}  # the drift estimated at updates without full files

    def close(self) -> None:
        self.files.close()

    def allowance(self, name: str) -> float:
        """||drift|| of a tensor, measured and estimated (0 where none was measured)."""
        return self.files.allowance(name) + self.walked.get(name, 0.0)

    def strayed(self, name: str) -> float:
        """How far the baseline may stray from the reference on its noise (as `Drift.strayed`)."""
        return self.files.strayed(name) + self.walked.get(name, 0.0)

    def advance(self, update: int, names: list[str]) -> bool:
        """Take `update`'s steps of the tensors `names` (against the merged run: those whose
        gradients passed), where both runs kept full weights and gradients at it and full
        weights before it (the starting weights at update 0); whether they did (False: this
        update's steps are not measured)."""
        before = None if update == 0 else update - 1
        wanted = [
            (self.base, weights_file(update), self.shapes),
            (self.ref, weights_file(update), self.shapes),
            (self.base, grads_file(update), self.params),
            (self.ref, grads_file(update), self.params),
            (self.base, weights_file(before), self.shapes),
            (self.ref if update else self.base, weights_file(before), self.shapes),
        ]
        if not all(relpath in run.store.checksums for run, relpath, _ in wanted):  # type: ignore[union-attr]
            return False
        opened: list[CheckedFile] = []
        try:
            for run, relpath, shapes in wanted:
                opened.append(run.store.checked(relpath, shapes))  # type: ignore[union-attr]
            for name in names:
                if all(name in f.file.entries for f in opened):
                    self._tensor(name, opened, update == 0)
        finally:
            for f in opened:
                f.close()
        return True

    def estimate(
        self,
        names: list[str],
        grads: tuple[dict[str, Kept], dict[str, Kept]],
        weights: tuple[dict[str, Kept], dict[str, Kept]],
        before: tuple[dict[str, Kept], dict[str, Kept]],
    ) -> None:
        """An update without element values: per tensor of `names`, both runs' steps ||Δb|| +
        ||Δr|| from the sketches of the baseline's and the reference's weights after and
        `before` the update, each norm at its upper bound; the noise-dominated elements' walk,
        their measured share of those steps; and TAU·ρ of them from the sketches of the
        gradients."""
        (gb, gr), (wb, wr), (pb, pr) = grads, weights, before
        for name in names:
            kept = [d.get(name) for d in (gb, gr, wb, wr, pb, pr)]
            if any(k is None for k in kept):
                continue
            kgb, kgr, kb, kr, kpb, kpr = kept  # type: ignore[misc]
            steps = estimate(kb.vector - kpb.vector, False).high
            steps += estimate(kr.vector - kpr.vector, False).high
            if not math.isfinite(steps):
                continue
            if self.shares.get(name):
                self.walked[name] = self.walked.get(name, 0.0) + self.shares[name] * steps
            if self.against_merged:
                continue  # what the noise explains of the distance is the reference's alone
            gap = estimate(kgb.vector - kgr.vector, False).high
            if not (math.isfinite(gap) and math.isfinite(kgr.norm)):
                continue
            rho = min(1.0, TAU * gap / kgr.norm) if kgr.norm > 0 else float(gap > 0)
            self.files.explain(name, (rho * steps) ** 2)

    def _tensor(self, name: str, files: list[CheckedFile], first: bool) -> None:
        b_file, r_file, gb_file, gr_file, pb_file, pr_file = files
        spread, sum_b, sum_r, finite = 0.0, 0.0, 0.0, True
        streams = [f.stream(name) for f in (gb_file, gr_file, b_file, r_file)]
        count = streams[0].count
        while (gb := widen64(streams[0].read(CHUNK))).size:
            gr, b, r = (widen64(s.read(CHUNK)) for s in streams[1:])
            d = gb - gr
            spread += dot(d, d)
            sum_b += dot(gb, gb)
            sum_r += dot(gr, gr)
            finite = finite and bool(np.isfinite(b).all() and np.isfinite(r).all())
        for stream in streams:
            stream.finish()
        if not (math.isfinite(spread) and finite and count):
            return  # as the whole-tensor drift: no steps counted where anything is not finite
        if not graded(self.files.graded, name, sum_b > 0 or sum_r > 0):
            return
        if self.against_merged:
            norms = (math.sqrt(v) for v in (spread, sum_b, sum_r))
            rms = shared_rms(*norms, count, self.files.noisy, name)
        else:
            rms = math.sqrt(spread / count)
        bits = self.bits.get(name)
        again = [f.stream(name, checked=True) for f in (gb_file, gr_file, b_file, r_file)]
        again += [f.stream(name) for f in (pb_file, pr_file)]
        start, explained, walked, moved_b, moved_r, largest = 0, 0.0, 0.0, 0.0, 0.0, 0.0
        while start < count:
            gb, gr, b, r, pb, pr = (widen64(s.read(CHUNK)) for s in again)
            carried = self.files.slice(name, start, b.size)
            if self.against_merged:
                steps, part = shared_steps(gb, gr, rms, b, pb, r, pr), 0.0
            else:
                idle = self.files.stepped.get(name, 0.0)
                steps, part, top = noise_steps(
                    gb, gr, rms, b, pb, r, pr, bits, carried, idle, first
                )
                largest = max(largest, top)
            self.files.add(name, start, steps, carried)
            explained += part
            walked += dot(steps, steps)
            moved_b += _moved(b, pb)
            moved_r += _moved(r, pr)
            start += b.size
        for stream in again:
            stream.finish()
        self.files.explain(name, explained, largest)
        moved = math.sqrt(moved_b) + math.sqrt(moved_r)
        self.shares[name] = min(1.0, math.sqrt(walked) / moved) if moved > 0 else 0.0


def _moved(after: np.ndarray, before: np.ndarray) -> float:
    """||after − before||² of aligned float64 slices."""
    step = np.subtract(after, before)
    return dot(step, step)
