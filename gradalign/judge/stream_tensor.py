"""One tensor's judgement at one update, for the streamed judge (judge/stream.py): its gradient
from the sweep of its gradient files, then one pass over its weights that carries its drift
(judge/drift.py, judge/drift_files.py) and sums what the report gives (judge/fused.py)."""

from __future__ import annotations

import math
from dataclasses import dataclass

from ..runs.sketches import dot
from .apart import passes
from .drift import beyond_drift, graded, noise_steps, shared_rms, shared_steps, widened
from .followers import largest
from .fused import Pair, widen64
from .metrics import TensorDiff, fixed_allowed
from .rounding import marked, rounding_in_both
from .update_files import CHUNK, Sweep, UpdateFiles
from .weight_term import Sums, netted


@dataclass
class Outcome:
    weight: TensorDiff | None = None
    grad: TensorDiff | None = None
    # Σb², Σm², Σbm of the gradient, and Σr² of the reference's (NaN without one)
    fit: tuple[float, float, float, float] = (0.0, 0.0, 0.0, 0.0)
    strays: float | None = None  # the baseline's distance from a refused reference


class TensorSide:
    """StreamJudge's judgement of one tensor (it uses its state: tolerances, floors, drift)."""

    def _tensor(
        self,
        name: str,
        f: UpdateFiles,
        grads: set[str],
        follow: list[str] | None = None,
        netting: tuple[float, Sums] | None = None,
    ) -> Outcome:
        """One tensor's judgement at this update; `follow`: the tensors whose drift it may
        share, having none of its own (`_follow`); `netting`: the c and sums its gradient is
        judged net of (`_net_of_weights`)."""
        out = Outcome()
        tol = self.tol
        has = lambda c: c is not None and name in c.file.entries  # noqa: E731
        referenced = self.ref is not None
        widen, swept = gradient_files(f, name, grads, referenced)
        gpair = None
        if swept is not None:
            gpair = f.swept(name, swept)
            if name in grads:
                d = gpair.diff(name, tol.grad_rtol, self.grad_atol, start=False)
                d = rounding_in_both(marked(d, tol.weight_atol, self.grad_atol), self.floor16)
                if has(f.gr):
                    d = gpair.calibrate(d, tol.noise_factor, self.floor)
                if netting is not None:
                    d = netted(d, netting[1].residual(netting[0]), netting[0])
                rr = gpair.rr if has(f.gr) else math.nan  # no reference's gradient: no norm
                out.grad, out.fit = d, (gpair.bb, gpair.mm, gpair.bm, rr)
        if not referenced:  # the merged run's steps count where its gradients passed
            widen = widen and out.grad is not None and passes(out.grad, tol, self.apart)
        if f.wb is None:
            return out
        if widen and gpair:  # a tensor that never had a gradient drifts by none of its steps
            other = gpair.rr if referenced else gpair.mm
            widen = graded(self.drift.graded, name, gpair.bb > 0 or other > 0)
        spread = (gpair.br if referenced else gpair.dd) if widen and gpair else math.nan
        if widen and gpair and not referenced and math.isfinite(spread):
            norms = (math.sqrt(v) for v in (gpair.dd, gpair.bb, gpair.mm))
            rms = shared_rms(*norms, gpair.n, self.drift.noisy, name)
        else:
            rms = math.sqrt(spread / gpair.n) if widen and gpair and gpair.n else 0.0
        noise_ok = widen and math.isfinite(spread)
        pair = self._weights(name, f, widen, rms, follow=follow)
        drift = self.drift
        finite = pair.finite_b and (pair.finite_r if referenced else pair.finite_m)
        if widen and not (noise_ok and finite):
            self._weights(name, f, widen, rms, undo=True)
        elif widen and referenced:
            drift.explain(name, pair.extra["explained"], pair.extra["largest"])
        allowance = drift.allowance(name)
        strayed = drift.strayed(name)
        if follow:
            allowance = strayed = math.sqrt(pair.extra.get("followed", 0.0))
        if f.wm is not None:
            start = f.start is not None
            d = pair.diff(name, tol.weight_rtol, tol.weight_atol, start, self.floor)
            if f.wr is not None:
                d = pair.calibrate(d, tol.noise_factor, self.floor)
            if referenced:
                d = widened(d, allowance, tol.noise_factor)
            elif allowance > 0:  # no reference: each element's own
                d = beyond_drift(d, math.sqrt(pair.beyond), allowance)
            out.weight = d
        if f.wr is not None and self.bound is not None and pair.finite_b:
            out.strays = self._strays(name, pair, strayed, f.update)
        return out

    def _weights(
        self,
        name: str,
        f: UpdateFiles,
        widen: bool,
        rms: float,
        undo: bool = False,
        follow: list[str] | None = None,
    ) -> Pair:
        """One pass over the weights (and, for the drift, the gradients and previous weights:
        the reference's, or else the merged run's); `follow`: the drift is theirs."""
        pair = Pair()
        ins = [f.wb, f.wm, f.wr, f.start]
        referenced = self.ref is not None
        # read again, so checked already: the gradients by `_sweep` now, the previous weights
        # as the weights of the update before (or as the start, in this pass)
        again = [f.gb, f.gr, f.pb, f.pr] if referenced else [f.gb, f.gm, f.pb, f.pm]
        streams = [c.stream(name) if c is not None else None for c in ins]
        streams += (
            [c.stream(name, checked=True) if c is not None else None for c in again]
            if widen
            else []
        )
        first, count = 0, streams[0].count
        while first < count or (first == 0 and count == 0):
            parts = [widen64(s.read(CHUNK)) if s is not None else None for s in streams]
            b, m, r, s = parts[:4]
            drifted = None  # this slice's drift after this update (no reference)
            if widen and referenced:
                gb, gr, pb, pr = parts[4:]
                bits = self.bits.get(name)
                carried = self.drift.slice(name, first, b.size)
                idle = self.drift.stepped.get(name, 0.0)
                steps, explained, top = noise_steps(
                    gb, gr, rms, b, pb, r, pr, bits, carried, idle, f.first
                )
                self.drift.add(name, first, -steps if undo else steps, carried)
                pair.extra["explained"] = pair.extra.get("explained", 0.0) + explained
                pair.extra["largest"] = max(pair.extra.get("largest", 0.0), top)
            elif widen:
                gb, gm, pb, pm = parts[4:]
                steps = shared_steps(gb, gm, rms, b, pb, m, pm)
                drifted = self.drift.add(name, first, -steps if undo else steps)
            if follow:
                drifted = largest([self.drift.slice(o, first, b.size) for o in follow])
                if drifted is not None:
                    pair.extra["followed"] = pair.extra.get("followed", 0.0) + dot(drifted, drifted)
            elif not referenced and drifted is None:
                drifted = self.drift.slice(name, first, b.size)
            if not undo:
                pair.add(b, m, r, s, None if referenced else drifted)
            first += b.size
            if count == 0:
                break
        for stream in streams:
            if stream is not None:
                stream.finish()
        return pair

    def _strays(self, name: str, pair: Pair, allowance: float, update: int) -> float | None:
        """`check_reference_weights` from the sums: the error when the reference is refused."""
        bound = self.bound
        assert bound is not None
        if pair.finite_r:
            error = math.sqrt(pair.br)
            allowed = fixed_allowed(bound.rtol, math.sqrt(pair.rs), bound.atol, pair.n)
        else:
            error, allowed = math.inf, 0.0
        rounding = bound.rounding(name, update) * math.sqrt(pair.rr)
        return None if error <= allowed + rounding + allowance else error


def gradient_files(
    f: UpdateFiles, name: str, grads: set[str], referenced: bool
) -> tuple[bool, Sweep | None]:
    """Whether a tensor's drift may widen at this update (the gradients that tell are there,
    and the drift's other run: the reference, or else the merged run, drift.Drift), and the
    gradient files its sweep reads (None: none is read)."""
    has = lambda c: c is not None and name in c.file.entries  # noqa: E731
    other = f.wr if referenced else f.wm
    drifts = f.wb is not None and other is not None
    widen = drifts and has(f.gb) and (has(f.gr) if referenced else name in grads)
    if name not in grads and not widen:
        return widen, None
    return widen, [f.gb, f.gm if name in grads else None, f.gr if has(f.gr) else None]
