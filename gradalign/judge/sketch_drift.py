"""The noise-dominated drift (judge/drift.py) of sketched tensors, from the full files a sketched
run keeps at its snapshot updates.

A sketch cannot tell which elements' gradients were rounding noise, but the first update always
has full files: the baseline's and the reference's weights and gradients, and the starting
weights both stepped from. There, and at any later update whose previous update kept full files
in both runs too, each sketched tensor's drift is measured as the streamed judge measures it
(`noise_steps`, slice by slice: memory stays a few slices), and carried through the sketched
updates after it. An adaptive optimizer's first step (Adam's, RMSprop's, Adagrad's: ±lr per
element) is where a gradient of pure noise moves its element furthest.

At the other updates no element values exist, and what the baseline's own gradient noise
explains of its distance from the reference (`noise_steps`' second part, Σ(TAU·ρ·step)² over the
elements) is estimated for the tensor as a whole: TAU·ρ times both runs' steps, ρ = ||gb − gr|| /
||gr|| from the gradients' sketches, at most 1 (an element's noise explains at most its step).
Under SGD a step follows its gradient and the two agree; an adaptive optimizer steps small
gradients as far as large ones, where the elements' sum exceeds the tensor's, so the estimate is
the tighter of the two. The drift of noise-dominated elements at those updates is not estimated.
"""

from __future__ import annotations

import math

import numpy as np

from ..runs.layout import grads_file, weights_file
from ..runs.model import Run
from ..runs.sketches import dot, estimate
from ..runs.store import CheckedFile
from .drift import TAU, graded, noise_steps, stored_bits
from .drift_files import DriftFiles
from .fused import widen64
from .views import Kept

CHUNK = 1 << 17  # elements per slice, as the streamed judge's


class SketchDrift:
    """Per sketched tensor, the drift against the reference, measured where full files allow."""

    def __init__(self, base: Run, ref: Run) -> None:
        self.base, self.ref = base, ref
        self.params = {t.name: t.shape for t in base.tensors if t.kind == "param"}
        self.shapes = {t.name: t.shape for t in base.tensors}
        self.bits = stored_bits(base)
        self.files = DriftFiles()

    def close(self) -> None:
        self.files.close()

    def allowance(self, name: str) -> float:
        """||drift|| of a tensor (0 where none was measured)."""
        return self.files.allowance(name)

    def strayed(self, name: str) -> float:
        """How far the baseline may stray from the reference on its noise (as `Drift.strayed`)."""
        return self.files.strayed(name)

    def advance(self, update: int, names: list[str]) -> bool:
        """Take `update`'s steps of the tensors `names`, where both runs kept full weights and
        gradients at it and full weights before it (the starting weights at update 0); whether
        they did (False: this update's steps are not measured)."""
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
        """An update without element values: per tensor of `names`, TAU·ρ·(||Δb|| + ||Δr||)
        from the sketches of the baseline's and the reference's gradients, weights after and
        `before` the update, each norm at its upper bound."""
        (gb, gr), (wb, wr), (pb, pr) = grads, weights, before
        for name in names:
            kept = [d.get(name) for d in (gb, gr, wb, wr, pb, pr)]
            if any(k is None for k in kept):
                continue
            kgb, kgr, kb, kr, kpb, kpr = kept  # type: ignore[misc]
            gap = estimate(kgb.vector - kgr.vector, False).high
            if not (math.isfinite(gap) and math.isfinite(kgr.norm)):
                continue
            rho = min(1.0, TAU * gap / kgr.norm) if kgr.norm > 0 else float(gap > 0)
            steps = estimate(kb.vector - kpb.vector, False).high
            steps += estimate(kr.vector - kpr.vector, False).high
            if math.isfinite(steps):
                self.files.explain(name, (rho * steps) ** 2)

    def _tensor(self, name: str, files: list[CheckedFile], first: bool) -> None:
        b_file, r_file, gb_file, gr_file, pb_file, pr_file = files
        spread, graded_sums, finite = 0.0, 0.0, True
        streams = [f.stream(name) for f in (gb_file, gr_file, b_file, r_file)]
        count = streams[0].count
        while (gb := widen64(streams[0].read(CHUNK))).size:
            gr, b, r = (widen64(s.read(CHUNK)) for s in streams[1:])
            d = gb - gr
            spread += dot(d, d)
            graded_sums += dot(gb, gb) + dot(gr, gr)
            finite = finite and bool(np.isfinite(b).all() and np.isfinite(r).all())
        for stream in streams:
            stream.finish()
        if not (math.isfinite(spread) and finite and count):
            return  # as the whole-tensor drift: no steps counted where anything is not finite
        if not graded(self.files.graded, name, graded_sums > 0):
            return
        rms = math.sqrt(spread / count)
        bits = self.bits.get(name) if first else None
        again = [f.stream(name, checked=True) for f in (gb_file, gr_file, b_file, r_file)]
        again += [f.stream(name) for f in (pb_file, pr_file)]
        start, explained = 0, 0.0
        while start < count:
            gb, gr, b, r, pb, pr = (widen64(s.read(CHUNK)) for s in again)
            carried = self.files.slice(name, start, b.size)
            steps, part = noise_steps(gb, gr, rms, b, pb, r, pr, bits, carried)
            self.files.add(name, start, steps, carried)
            explained += part
            start += b.size
        for stream in again:
            stream.finish()
        self.files.explain(name, explained)
