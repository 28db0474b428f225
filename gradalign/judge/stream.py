"""The tensors of run directories judged streamed: per update, each tensor is read in slices from
every file that holds it (baseline, merged, reference, starting weights, previous update), and
its judgement computed in one pass (judge/fused.py); tensors are judged in parallel threads
(numpy releases the GIL inside each slice's arithmetic), and the next update's gradient sweeps
start behind this update's tensors (judge/update_files.py). Memory is a few slices per thread, the
noise-dominated drift is kept in a scratch file per tensor (judge/drift.py), and every number
equals what `compare._Judge.tensors` computes from whole tensors, up to the order of float64
additions (tests/test_streaming.py).
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..runs.layout import grads_file, weights_file
from ..runs.model import Run
from ..runs.sketches import dot
from ..runs.store import CheckedFile
from .compatible import stray
from .drift import (
    beyond_drift,
    graded,
    noise_steps,
    shared_rms,
    shared_steps,
    stored_bits,
    widened,
)
from .drift_files import DriftFiles
from .followers import largest, sources
from .fused import Pair, widen64
from .inputs import Inputs
from .metrics import TensorDiff, _safe_div, fixed_allowed, quiet
from .results import UpdateResult
from .rounding import floors, marked, rounding_in_both
from .update_files import CHUNK, Sweep, UpdateFiles, entered, settled, stop
from .weight_term import Sums, coefficient, failing, netted
from .window_sizes import judged_updates


def workers() -> int:
    """Threads for judging tensors: GRADALIGN_THREADS, else the CPUs (at most 4)."""
    value = os.environ.get("GRADALIGN_THREADS", "")
    if value.isdigit() and int(value) > 0:
        return int(value)
    return max(1, min(4, os.cpu_count() or 1))


def streamable(*runs: Run | None) -> bool:
    """Whether every given run is a full run directory the streaming judge can read (and reads
    as its loaders would: a Run given other loaders is judged through them)."""
    return all(r is None or _own_files(r) for r in runs)


def _own_files(run: Run) -> bool:
    if run.store is None or not run.full_weights or run.record != "full":
        return False
    return run.store.loaders == (run.load_init_weights, run.load_weights, run.load_grads)


@dataclass
class _Outcome:
    weight: TensorDiff | None = None
    grad: TensorDiff | None = None
    fit: tuple[float, float, float] = (0.0, 0.0, 0.0)  # Σb², Σm², Σbm of the gradient
    strays: float | None = None  # the baseline's distance from a refused reference


class StreamJudge:
    """`compare._Judge.tensors` for run directories, streamed."""

    def __init__(self, inputs: Inputs) -> None:
        self.base, self.merged, self.ref, self.tol, self.floor, self.bound = inputs.unpack()
        self.drift = DriftFiles()  # against the reference, or else the merged run (drift.Drift)
        self.shapes = {t.name: t.shape for t in self.base.tensors}
        self.params = {t.name: t.shape for t in self.base.tensors if t.kind == "param"}
        self.bits = stored_bits(self.base)
        self.dtype = inputs.dtype
        self.grad_atol = self.tol.weight_atol  # with the rounding floor, without a reference
        self.floor16 = 0.0  # 16-bit rounding in both runs (rounding.rounding_in_both)
        self.pool = ThreadPoolExecutor(workers(), thread_name_prefix="gradalign-judge")
        self.names = [t.name for t in self.base.tensors]
        self.next: UpdateFiles | None = None  # the next update's files, its sweeps started
        self.updates = judged_updates(self.base, self.merged)  # compare._judge's
        self._ahead(0)  # while the losses and the bookkeeping are judged

    def close(self) -> None:
        self.pool.shutdown(cancel_futures=True)  # sweeps started ahead of an update never judged
        self.drift.close()
        if self.next is not None:
            self.next.close()

    def __call__(self, result: UpdateResult) -> None:
        i = result.update
        files = self._take(i)
        judged: list[Future] = []
        try:
            names = self.names
            grads = _graded(files, names)
            judged_grads = set(grads)  # looked up per tensor: a list made it quadratic
            self.grad_atol, self.floor16 = self.tol.weight_atol, 0.0
            if self.ref is None and grads:
                self.grad_atol, self.floor16 = self._rounding_floors(files.gb, grads)
            judged = self._submit(lambda n: self._tensor(n, files, judged_grads), names)
            self._ahead(i + 1)  # queued behind this update's tensors
            found = dict(zip(names, settled(judged), strict=True))
            self._net_of_weights(found, files, grads)
            self._follow(found, files, judged_grads)
            order = files.wb.file.names() if files.wb is not None else []
        finally:
            stop(judged)  # none reads the files any more (a Ctrl-C while the next opened)
            files.close()
        for name in order:  # the reference is refused at its first stray, in file order
            if name in found and found[name].strays is not None and self.bound is not None:
                raise stray(self.bound, i, name, found[name].strays)
        result.weights.extend(o.weight for o in found.values() if o.weight is not None)
        result.grads.extend(found[n].grad for n in grads if found[n].grad is not None)
        if grads:
            bb, mm, bm = (math.fsum(found[n].fit[k] for n in grads) for k in range(3))
            cosine = _safe_div(bm, math.sqrt(bb * mm)) if bb and mm else float(bb == mm)
            result.grad_ratio, result.grad_cosine = _safe_div(bm, bb), cosine

    def _net_of_weights(self, found: dict[str, _Outcome], files: UpdateFiles, grads: list[str]):
        """Without a reference: the failing gradients judged again net of c·Δw, and the tensors
        whose gradient passes so judged again with it (their drift counts where it passed;
        judge/weight_term.py)."""
        pb, pm = files.pb, files.pm
        if self.ref is not None or files.first or pb is None or pm is None:
            return
        if not failing(found[n].grad for n in grads if found[n].grad is not None):
            return
        names = [n for n in grads if n in pb.file.entries and n in pm.file.entries]
        read = settled(self._submit(lambda n: entered(files, n), names))
        sums = dict(zip(names, read, strict=True))
        c = coefficient(sums.values())
        for name, s in sums.items():
            d = found[name].grad
            if d is not None and not d.ok and netted(d, s.residual(c), c).ok:
                found[name] = self._tensor(name, files, set(grads), netting=(c, s))

    def _follow(self, found: dict[str, _Outcome], files: UpdateFiles, grads: set[str]) -> None:
        """Judge again the tensors without a gradient of their own, with the drift of the
        tensors they follow (judge/followers.py), once every graded tensor's is known."""
        drift = self.drift
        follows = sources(self.shapes, drift.graded, lambda o: drift.allowance(o) > 0)
        for name, follow in follows.items():
            if name in found:
                found[name] = self._tensor(name, files, grads, follow)

    def _rounding_floors(self, gb: CheckedFile, names: list[str]) -> tuple[float, float]:
        """The gradients' per-element tolerance with the rounding floor of this update, and the
        16-bit one (one more pass over the baseline's gradients, without a reference only)."""
        sumsq, elements = 0.0, 0
        for name in names:
            stream = gb.stream(name, checked=True)
            while (part := stream.read(CHUNK)).size:
                part = widen64(part)
                sumsq += dot(part, part)
                elements += part.size
            stream.finish()
        return floors(self.tol, self.dtype, sumsq, elements)

    def _submit(self, task: Callable[[str], Any], names: list[str]) -> list[Future]:
        """`task(name)` for each name, on the pool."""
        return [self.pool.submit(quiet(task), n) for n in names]

    def _take(self, i: int) -> UpdateFiles:
        """Update i's files: those opened ahead, or opened now."""
        ahead, self.next = self.next, None
        if ahead is not None and ahead.update == i:
            return ahead
        if ahead is not None:
            ahead.close()
        return self._open(i)

    def _ahead(self, i: int) -> None:
        """Open update i's files and start its gradients' sweeps on the pool. Where that fails,
        nothing is started: update i opens them again in its turn, and is refused there."""
        if i >= self.updates:
            return
        try:
            files = self._open(i)
        except Exception:
            return
        referenced, grads = self.ref is not None, set(_graded(files, self.names))
        wanted = {n: _gradients(files, n, grads, referenced)[1] for n in self.names}
        files.ahead(self.pool, {n: w for n, w in wanted.items() if w is not None})
        self.next = files

    def _open(self, i: int) -> UpdateFiles:
        files = UpdateFiles(first=i == 0, update=i)

        def get(run: Run | None, relpath: str, shapes: dict) -> CheckedFile | None:
            if run is None or relpath not in run.store.checksums:
                return None
            opened = run.store.checked(relpath, shapes)
            files.opened.append(opened)
            return opened

        try:
            files.wb = get(self.base, weights_file(i), self.shapes)
            files.wm = get(self.merged, weights_file(i), self.shapes)
            files.wr = get(self.ref, weights_file(i), self.shapes)
            if self.base.has_grads:
                files.gb = get(self.base, grads_file(i), self.params)
            if self.merged.has_grads:
                files.gm = get(self.merged, grads_file(i), self.params)
            if self.ref is not None and self.ref.has_grads:
                files.gr = get(self.ref, grads_file(i), self.params)
            files.start = get(self.base, weights_file(None), self.shapes)
            previous = None if i == 0 else i - 1
            files.pb = get(self.base, weights_file(previous), self.shapes)
            if self.ref is not None:
                files.pr = get(self.ref if i else self.base, weights_file(previous), self.shapes)
            elif self.merged.has_grads:
                files.pm = get(self.merged if i else self.base, weights_file(previous), self.shapes)
        except BaseException:
            files.close()
            raise
        return files

    def _tensor(
        self,
        name: str,
        f: UpdateFiles,
        grads: set[str],
        follow: list[str] | None = None,
        netting: tuple[float, Sums] | None = None,
    ) -> _Outcome:
        """One tensor's judgement at this update; `follow`: the tensors whose drift it may
        share, having none of its own (`_follow`); `netting`: the c and sums its gradient is
        judged net of (`_net_of_weights`)."""
        out = _Outcome()
        tol = self.tol
        has = lambda c: c is not None and name in c.file.entries  # noqa: E731
        referenced = self.ref is not None
        widen, swept = _gradients(f, name, grads, referenced)
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
                out.grad, out.fit = d, (gpair.bb, gpair.mm, gpair.bm)
        if not referenced:  # the merged run's steps count where its gradients passed
            widen = widen and out.grad is not None and out.grad.ok
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
            drift.explain(name, pair.extra["explained"])
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
                bits = self.bits.get(name) if f.first else None
                carried = self.drift.slice(name, first, b.size)
                steps, explained = noise_steps(gb, gr, rms, b, pb, r, pr, bits, carried)
                self.drift.add(name, first, -steps if undo else steps, carried)
                pair.extra["explained"] = pair.extra.get("explained", 0.0) + explained
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


def _graded(files: UpdateFiles, names: list[str]) -> list[str]:
    """The tensors whose gradients both runs recorded at this update."""
    if files.gb is None or files.gm is None:
        return []
    return [n for n in names if n in files.gb.file.entries and n in files.gm.file.entries]


def _gradients(
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


__all__ = ["StreamJudge", "np", "streamable"]
