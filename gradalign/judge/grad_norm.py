"""The whole model's gradient norm against the reference, update by update.

Where a 16-bit baseline parts from its float64 reference, each tensor's noise floor can widen
to a third of the gradient's own size (`vacuous.widened_blind_note`): the runs' gradients turn
apart, and a merged run that leaves micro-batches out, or weights them wrongly, passes every
tensor. Their size does not turn with them. The baseline's whole-model norm stays close to the
reference's while the runs part (model zoo, bfloat16 autocast, sketched: within 2% at most
updates), so the merged run's norm is judged by that: its log-ratio to the reference's must stay
within NORM_FACTOR times the baseline's own (RMS over the run, at least NORM_FLOOR, and at each
update at least its RMS over the updates around, ±POOL: where the baseline's norm wanders for
a stretch, model zoo run 284111, OPT under bfloat16 over 300 updates, the baseline's log-ratio
2.8% RMS over the run and up to 23% between updates 112 and 149, the merged norm stood 20% off
the reference's at updates 134 and 135 and failed), and an update fails where the merged norm
stands beyond it, on one side, for NORM_RUN updates in a row or more (a clean run's norm can
spike at one update alone). Model zoo run 236502 (Mixtral under Adamax, K=8, bfloat16,
sketched), every micro-step's gradient zeroed from update 6: the merged norm 0.32 to 0.47 of
the reference's at every update from there, the baseline's within 2.3%, and every tensor
passed."""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass
from functools import cached_property
from itertools import groupby

import numpy as np

from .noise import POOL, around
from .results import FAIL, GRAD_NORM, NOT_CHECKED, PASS, Check, UpdateResult

NORM = GRAD_NORM  # the check's name and its findings' key (UpdateResult.findings)
NORM_FACTOR = 6.0  # times the baseline's own log-ratio (RMS over the run) a merged one may reach
NORM_FLOOR = 0.01  # the least noise a norm is granted: 1% (float32 runs agree far closer)
NORM_RUN = 2  # updates in a row, beyond on one side, that fail


def model_norm(squares: Iterable[float]) -> float:
    """The whole model's norm from its tensors' squared norms."""
    return math.sqrt(math.fsum(squares))


def norms_of(arrays: Iterable[np.ndarray]) -> float:
    """The whole model's norm of these tensors, summed in float64."""
    return model_norm(float(np.vdot(a, a)) for a in (np.asarray(x, np.float64) for x in arrays))


@dataclass
class _Norms:
    """The updates whose norms all three runs kept, their log-ratios to the reference's, and
    the baseline's own: its RMS over the run (at least NORM_FLOOR), and per update at least
    its RMS over the updates around (±POOL)."""

    updates: list[UpdateResult]
    base: np.ndarray
    merged: np.ndarray
    noise: float

    @cached_property
    def allowed(self) -> np.ndarray:
        """Per update, NORM_FACTOR times the larger of the run's RMS and the local one."""
        squares = self.base**2
        local = np.sqrt([around(squares, k).mean() for k in range(len(squares))])
        return NORM_FACTOR * np.maximum(local, self.noise)

    def beyond(self) -> list[int]:
        """The updates (indices) beyond what is allowed on one side, NORM_RUN or more in a row;
        an infinite log (a norm of 0) is beyond too."""
        out, side = np.abs(self.merged) > self.allowed, np.sign(self.merged)
        bad: list[int] = []
        for (beyond, _), run in groupby(range(len(out)), key=lambda k: (out[k], side[k])):
            found = list(run)
            if beyond and len(found) >= NORM_RUN:
                bad += found
        return bad

    def excess(self) -> float:
        """The largest, over NORM_RUN updates in a row on one side, of the least merged
        log-ratio over what is allowed: the check fails beyond 1."""
        over, side = np.abs(self.merged) / self.allowed, np.sign(self.merged)
        runs = (
            float(np.min(over[i : i + NORM_RUN]))
            for i in range(len(over) - NORM_RUN + 1)
            if len(set(side[i : i + NORM_RUN])) == 1
        )
        return max(runs, default=0.0)


def grad_norm_check(results: list[UpdateResult]) -> Check:
    """The merged run's whole-model gradient norm against the reference's at every update all
    three runs kept one, judged by the baseline's own (the module's rule); each update that
    fails holds why (`UpdateResult.grad_norm_beyond`)."""
    n = _norms(results)
    if n is None:
        return Check(NORM, NOT_CHECKED, "needs a reference's gradients at two updates or more")
    allowed = n.allowed
    bad = n.beyond()
    for k in bad:
        b, m, ref = n.updates[k].grad_norms  # type: ignore[misc]
        n.updates[k].grad_norm_beyond = (
            f"whole-model gradient norm {m / ref:.4g} times the reference's (baseline "
            f"{b / ref:.4g} times; a factor {math.exp(allowed[k]):.4g} allowed)"
        )
    rule = (
        f"a factor {math.exp(NORM_FACTOR * n.noise):.4g} allowed: {NORM_FACTOR:g} times the "
        f"baseline's own distance from the reference's norm, {n.noise:.2%} RMS over "
        f"{len(n.updates)} updates (at least {NORM_FLOOR:.0%}), or its RMS over the "
        f"{2 * POOL + 1} updates around where larger"
    )
    if bad:
        r = n.updates[bad[0]]
        b, m, ref = r.grad_norms  # type: ignore[misc]
        return Check(
            NORM,
            FAIL,
            f"{len(bad)}/{len(n.updates)} updates beyond, {NORM_RUN} or more in a row; first, "
            f"update {r.update}: the merged run's whole-model gradient norm {m:.6g}, "
            f"{m / ref:.4g} times the reference's {ref:.6g} (the baseline's {b / ref:.4g} "
            f"times; a factor {math.exp(allowed[bad[0]]):.4g} allowed there); {rule}",
        )
    lone = float(np.max(np.abs(n.merged) / allowed))
    excess = n.excess()
    within = (
        f"within {excess:.2g}x of what is allowed of the reference's over any {NORM_RUN} updates "
        "in a row"
        if excess > 0
        else f"never on one side of the reference's {NORM_RUN} updates in a row"
    )
    return Check(
        NORM,
        PASS,
        f"the merged run's whole-model gradient norm {within} ({lone:.2g}x of what is allowed "
        f"at one update); {rule}",
    )


def norm_excess(results: list[UpdateResult]) -> float | None:
    """How near a comparison came to failing the check: beyond 1 fails (None: not checked)."""
    n = _norms(results)
    return None if n is None else n.excess()


def _norms(results: list[UpdateResult]) -> _Norms | None:
    """The norms the check reads (None where fewer than NORM_RUN updates kept them)."""
    judged = [(r, x) for r in results if (x := _logs(r.grad_norms)) is not None]
    if len(judged) < NORM_RUN:
        return None
    base = np.array([x[0] for _, x in judged])
    merged = np.array([x[1] for _, x in judged])
    noise = max(float(np.sqrt(np.mean(base**2))), NORM_FLOOR)
    return _Norms([r for r, _ in judged], base, merged, noise)


def _logs(norms: tuple[float, float, float] | None) -> tuple[float, float] | None:
    """ln(baseline/reference) and ln(merged/reference) of one update's norms, where the
    baseline's and the reference's are positive and all three finite (None otherwise)."""
    if norms is None or not all(math.isfinite(x) for x in norms):
        return None
    b, m, ref = norms
    if b <= 0 or ref <= 0:
        return None
    return math.log(b / ref), (math.log(m / ref) if m > 0 else -math.inf)
