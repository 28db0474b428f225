"""The drift of noise-dominated elements (judge/noise.py lists the noise model's effects): per
element and update, how far an element whose gradient is rounding noise may have been stepped
away from the other run, summed over the updates: `Drift` in memory for whole tensors,
judge/drift_files.py's `DriftFiles` by slice for the streamed judge.

Against a float64 reference, `noise_steps` (with judge/step_rules.py's first step's spread and
sign-decided steps) reads the baseline and the reference; the drift widens the tensor's noise
(`widened`). Without one, `shared_steps` reads both runs, and each element's weights count
beyond its drift alone.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np

from ..runs.model import Tensors
from ..runs.sketches import dot
from .followers import followed
from .metrics import TensorDiff
from .step_rules import first_step_spread, sign_decided

TAU = 2.0  # |g_ref| within TAU times the gradient noise (element's, or the tensor's RMS)


def noise_steps(
    gb: np.ndarray,
    gr: np.ndarray,
    rms: float,
    b: np.ndarray,
    pb: np.ndarray,
    r: np.ndarray,
    pr: np.ndarray,
    bits: int | None = None,
    carried: np.ndarray | None = None,
    idle_step: float = 0.0,
    first: bool = False,
) -> tuple[np.ndarray, float, float]:
    """For aligned float64 slices of the gradients (gb, gr), the weights after (b, r) and before
    (pb, pr) an update, and the tensor's RMS gradient noise: the steps |Δb| + |Δr| of the
    noise-dominated elements (`first_step_spread` elsewhere at the `first` update; the weights
    have `bits` stored mantissa bits; 0 elsewhere), Σ(TAU·ρ·step)² over the
    other elements, ρ = max(|gb − gr|, rms) / |gr| (below 1/TAU there), and the slice's largest
    |Δb| + |Δr|. The whole step where the element drifted before (`carried` > 0): its optimizer
    state stays apart (Rprop's step sizes follow the signs seen; model zoo `hf-bert` run 967:
    one flip, 3.4% off 3 updates on). `idle_step` (the tensor's largest |Δb| + |Δr| at the
    last update that stepped it) where neither run stepped a dominated element whose gradient
    is not 0: an optimizer that decides by the gradient's sign whether to step at all (Rprop
    stops an element whose sign flipped) left it where the noise chose, and another run,
    whose noise drew the other sign, stepped it (model zoo run 181005, float16: a bias
    gradient +2.6e-6 in the baseline and the reference, −1.9e-6 in the merged run, which
    stepped 1.2 times the element's last step where they stood still). After the first
    update, an element both runs stepped by the same size on gradients a share apart
    (`sign_decided`: Rprop, Lion, a sign descent) counts as dominated where its gradient is
    within SIGN_TAU times its own noise: its step is the sign's, all or nothing, and another
    run's draw of that noise may flip it (model zoo run 184813, a GRU's bias under Rprop in
    bfloat16: +5.1e-5 in the baseline, +7.9e-5 in the reference, −8.2e-6 in the merged run,
    which Rprop stopped where both stepped); so does one that drifted before, whose step size
    stays apart from then on (run 186787)."""
    spread = (
        first_step_spread(gb, gr, rms, b, pb, r, pr, bits) if first and bits is not None else None
    )
    own = np.subtract(gb, gr)  # each element's own gradient noise, |gb − gr|
    np.abs(own, out=own)
    noise = _noise_of(own, rms)  # `own` kept for `sign_decided`
    size = np.abs(gr)
    step_b = np.abs(np.subtract(b, pb))
    step_r = np.abs(np.subtract(r, pr))
    dominated = np.less_equal(size, noise)
    if not first and bits is not None:
        dominated |= sign_decided(own, size, b, step_b, r, step_r, bits, carried)
    steps = np.add(step_b, step_r)  # both runs' steps, |Δb| + |Δr|
    largest = float(steps.max()) if steps.size else 0.0
    # Branch-free: a boolean index or a `where=` over a mask as mixed as this one ran 15x as
    # slow as a whole-array operation and made this function a quarter of a streamed compare.
    with np.errstate(divide="ignore", invalid="ignore"):  # inf and 0/0 only where dominated
        np.divide(noise, size, out=noise)  # ρ·TAU, below 1 wherever not dominated
    np.fmin(noise, 1.0, out=noise)  # 1 where dominated (inf and NaN too): finite, zeroed below
    if carried is not None:  # the whole step where the element drifted before
        np.maximum(noise, np.greater(carried, 0.0), out=noise)
    noise *= steps
    noise *= ~dominated
    np.multiply(steps, dominated, out=steps)
    if idle_step > 0:  # dominated elements neither run stepped, on a gradient not 0
        idle = np.equal(steps, 0.0)
        idle &= dominated
        idle &= np.not_equal(gb, 0.0) | np.not_equal(gr, 0.0)
        steps += idle * idle_step
    if spread is not None:
        spread *= ~dominated
        steps += spread
    return steps, dot(noise, noise), largest


def shared_steps(
    gb: np.ndarray,
    gm: np.ndarray,
    rms: float,
    b: np.ndarray,
    pb: np.ndarray,
    m: np.ndarray,
    pm: np.ndarray,
) -> np.ndarray:
    """Without a reference, per element of aligned float64 slices of both runs' gradients, and
    weights after (b, m) and before (pb, pm) an update: the share of their steps |Δb| + |Δm|
    that the gradient's noise explains, min(1, TAU·ρ), ρ = max(|gb − gm|, rms) / max(|gb|,
    |gm|). All of them where the gradient is noise (an adaptive optimizer steps such an element
    where the noise points); elsewhere a gradient off by a share ρ of itself moves its step by
    at most that share (SGD's step is proportional to it; Adam's first step lr·g/(|g| + eps)
    changes by less, near its eps too). All of them where the runs stepped opposite ways on
    gradients that differ: a moment (momentum, Adam's m) that crossed zero between the runs was
    smaller than its difference, the gradients' (BERT's key bias, AdamW, one thread: −6.0e-9
    and +8.6e-9 on gradients 3.3e-13 and 2.3e-13). None where both are exactly 0 and one run
    alone stepped (a `.grad` of None skipped, a zero `.grad` stepped on momentum: noise)."""
    noise = _gradient_noise(gb, gm, rms)
    size = np.abs(gb)
    np.maximum(size, np.abs(gm), out=size)
    with np.errstate(divide="ignore", invalid="ignore"):
        share = np.divide(noise, size)
    np.fmin(share, 1.0, out=share)  # 1 where the noise reaches the size (inf, 0/0 too)
    if not size.all():
        share[(size == 0) & ((b == pb) != (m == pm))] = 0.0
    db, dm = np.subtract(b, pb), np.subtract(m, pm)
    turned = np.less(db * dm, 0.0)
    turned &= np.not_equal(gb, gm)
    np.maximum(share, turned, out=share)
    steps = np.abs(db, out=db)
    steps += np.abs(dm, out=dm)
    steps *= share
    return steps


def shared_rms(
    diff: float, base: float, merged: float, count: int, noisy: set[str], name: str
) -> float:
    """`shared_steps`' rms from a tensor's ||gb − gm||, ||gb|| and ||gm|| over `count` elements:
    the RMS of the difference, or infinity (all steps shared) where the gradients differ by more
    than 1/TAU of the larger, at this update or one before it (`noisy`): a gradient that is all
    rounding noise (an attention key bias, passing by the absolute floor alone), whose Adam steps
    carry earlier updates' noise through the moments where this update's happens to agree."""
    if not count:
        return 0.0
    if diff > 0 and TAU * diff >= max(base, merged):
        noisy.add(name)
    if name in noisy:
        return math.inf
    return diff / math.sqrt(count)


def stepped(largest_steps: dict[str, float], name: str, largest: float) -> None:
    """Keep a tensor's largest |Δb| + |Δr| of this update where it stepped at all (an update a
    GradScaler skipped, or at a learning rate of 0, keeps the one before)."""
    if largest > 0 and math.isfinite(largest):
        largest_steps[name] = largest


def graded(seen: set[str], name: str, nonzero: bool) -> bool:
    """Whether a tensor's steps may carry gradient noise: a gradient of either run was nonzero
    at this update or one before it (`seen`). One that never had any (an EMA copy, a probe
    another optimizer steps and clears, a tensor moved by hand) was not stepped by its gradient:
    its steps explain no drift, however far they go."""
    if nonzero:
        seen.add(name)
    return name in seen


def _gradient_noise(ga: np.ndarray, gb: np.ndarray, rms: float) -> np.ndarray:
    """TAU·max(|ga − gb|, rms) per element, in one array (`_noise_of`)."""
    noise = np.subtract(ga, gb)
    np.abs(noise, out=noise)
    return _noise_of(noise, rms, out=noise)


def _noise_of(own: np.ndarray, rms: float, out: np.ndarray | None = None) -> np.ndarray:
    """TAU·max(own, rms) per element (= max(TAU·x, TAU·rms) exactly), from each element's own
    gradient noise |ga − gb|; into `out` where given, else a new array."""
    noise = np.maximum(own, rms, out=out)
    noise *= TAU
    return noise


class Drift:
    """Per tensor, how far noise-dominated elements may have drifted under adaptive steps, and
    how far the baseline's noise explains that it strayed from the reference elsewhere.

    Without a reference the merged run stands in for it (`against_merged`): each element may
    drift by the share of both runs' steps its gradient's noise explains (`shared_steps`: all
    of them where neither run's gradient stands above their difference), counted only at
    updates where that tensor's gradients passed their check, so a merged gradient that is
    wrong as a whole widens nothing. An element's weights then count only beyond its own drift
    (`beyond_drift`): the allowance is the element's, never a share of the tensor's."""

    def __init__(
        self, starts: Tensors, bits: dict[str, int] | None = None, against_merged: bool = False
    ) -> None:
        """`bits`: each tensor's stored mantissa bits in the baseline (`stored_bits`)."""
        self.against_merged = against_merged
        self.bits = {} if against_merged else bits or {}
        self.prev_b = {n: np.asarray(v, dtype=np.float64) for n, v in starts.items()}
        self.prev_r = dict(self.prev_b)
        self.drift: dict[str, np.ndarray] = {}
        self.explained: dict[str, float] = {}
        self.noisy: set[str] = set()  # tensors whose gradient was noise as a whole (shared_rms)
        self.graded: set[str] = set()  # tensors with a gradient, now or before (`graded`)
        self.followed: dict[str, np.ndarray] = {}  # tensors without one (judge/followers.py)
        self.stepped: dict[str, float] = {}  # per tensor, `noise_steps`' idle_step

    def advance(
        self,
        gb: Tensors | None,
        gr: Tensors | None,
        wb: Tensors,
        wr: Tensors,
        first: bool = False,
        passed: set[str] | None = None,
    ) -> None:
        """Take update i's steps (weights after i against after i−1) and gradients (`first`:
        i is update 0). `gr`, `wr`: the reference's, or the merged run's (`against_merged`),
        whose steps count only in the tensors `passed` names (their gradients passed)."""
        for name, b in wb.items():
            if name not in wr or name not in self.prev_b:
                continue
            b64, r64 = np.asarray(b, dtype=np.float64), np.asarray(wr[name], dtype=np.float64)
            counted = passed is None or name in passed
            if counted and gb is not None and gr is not None and name in gb and name in gr:
                self._widen(name, gb[name], gr[name], b64, r64, self.bits.get(name), first)
            self.prev_b[name], self.prev_r[name] = b64, r64
        self.followed = followed(self.drift, self.graded, {n: np.shape(w) for n, w in wb.items()})

    def _widen(
        self,
        name: str,
        gb: np.ndarray,
        gr: np.ndarray,
        b: np.ndarray,
        r: np.ndarray,
        bits: int | None,
        first: bool,
    ) -> None:
        g_ref = np.asarray(gr, dtype=np.float64).ravel()
        g_base = np.asarray(gb, dtype=np.float64).ravel()
        noise = np.abs(g_base - g_ref)
        if not (np.isfinite(noise).all() and np.isfinite(b).all() and np.isfinite(r).all()):
            return
        if not graded(self.graded, name, bool(g_base.any() or g_ref.any())):
            return
        prev_b, prev_r = self.prev_b[name].ravel(), self.prev_r[name].ravel()
        if self.against_merged:
            norms = (math.sqrt(dot(v, v)) for v in (noise, g_base, g_ref))
            rms = shared_rms(*norms, noise.size, self.noisy, name)
            steps = shared_steps(g_base, g_ref, rms, b.ravel(), prev_b, r.ravel(), prev_r)
        else:
            # one element's noise is one draw: the tensor's RMS noise bounds it from below
            rms = math.sqrt(float(np.mean(noise**2))) if noise.size else 0.0
            steps, explained, largest = noise_steps(
                g_base, g_ref, rms, b.ravel(), prev_b, r.ravel(), prev_r, bits,
                self.drift.get(name), self.stepped.get(name, 0.0), first,
            )  # fmt: skip
            self.explained[name] = self.explained.get(name, 0.0) + math.sqrt(explained)
            stepped(self.stepped, name, largest)
        if not steps.any():
            return
        # the merged run may step such an element as far as either run did, the other way
        drift = self.drift.setdefault(name, np.zeros(b.size))
        drift += steps

    def allowance(self, name: str) -> float:
        """||drift|| of a tensor: what its noise-dominated elements may add to its error."""
        drift = self.drift.get(name, self.followed.get(name))
        return 0.0 if drift is None else float(np.linalg.norm(drift))

    def judged(self, d: TensorDiff, base: np.ndarray, merged: np.ndarray, factor: float):
        """A weight's judgement `d` with this tensor's drift: folded into its noise against a
        reference (`widened`), else each element judged beyond its own drift (`beyond_drift`)."""
        if not self.against_merged:
            return widened(d, self.allowance(d.name), factor)
        drift = self.drift.get(d.name, self.followed.get(d.name))
        if drift is None:
            return d
        b, m = (np.asarray(w, np.float64).ravel() for w in (base, merged))
        return beyond_drift(d, excess_over(b, m, drift), self.allowance(d.name))

    def strayed(self, name: str) -> float:
        """How far the baseline may stray from the reference on its noise: the drift, and what
        the other elements' noise explains (`noise_steps`)."""
        return self.allowance(name) + self.explained.get(name, 0.0)


def widened(d: TensorDiff, drift: float, factor: float) -> TensorDiff:
    """A weight's judgement with the drift allowance folded into its noise."""
    if drift <= 0 or d.noise is None or not math.isfinite(d.noise):
        return d
    extra = factor * (math.hypot(d.noise, drift) - d.noise)
    return dataclasses.replace(d, allowed=d.allowed + extra, drift=drift)


def beyond_drift(d: TensorDiff, excess: float, drift: float) -> TensorDiff:
    """A weight judged by the fixed tolerances (no reference) whose noise-dominated elements are
    judged by the gradients alone: each element counts only by how far it stands beyond its own
    drift (the steps both runs took while it was dominated), `excess` = ||max(|m − b| − drift,
    0)||, so the drift of one element never covers another's error."""
    if drift <= 0 or not math.isfinite(d.error):
        return d
    return dataclasses.replace(d, error=excess, drift=drift)


def excess_over(base: np.ndarray, merged: np.ndarray, drift: np.ndarray) -> float:
    """||max(|m − b| − drift, 0)|| over aligned flat float64 arrays (`beyond_drift`)."""
    gap = np.abs(merged - base)
    gap -= drift
    np.maximum(gap, 0.0, out=gap)
    return math.sqrt(dot(gap, gap))
