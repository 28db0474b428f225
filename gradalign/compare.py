"""Judge a merged run against its baseline, update by update, from the recorded data alone."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from .errors import BadInput
from .metrics import TensorDiff, diff, fit_ratio
from .run import Run
from .tolerances import Tolerances, for_dtype, least_precise
from .windows import inside_window_changes

PASS, FAIL, NOT_CHECKED = "pass", "fail", "not checked"


@dataclass
class UpdateResult:
    """Everything judged at one optimizer update."""

    update: int
    base_loss: float
    merged_loss: float
    loss_diff: float
    loss_allowed: float
    weights: list[TensorDiff] = field(default_factory=list)
    grads: list[TensorDiff] = field(default_factory=list)
    grad_ratio: float | None = None
    grad_cosine: float | None = None
    problems: list[tuple[str, str]] = field(default_factory=list)  # (check key, message)

    @property
    def loss_ok(self) -> bool:
        return bool(self.loss_diff <= self.loss_allowed)

    @property
    def ok(self) -> bool:
        tensors_ok = all(t.ok for t in self.weights) and all(t.ok for t in self.grads)
        return self.loss_ok and tensors_ok and not self.problems

    @property
    def worst(self) -> TensorDiff | None:
        return max(self.weights, key=lambda t: t.ratio, default=None)


@dataclass
class Check:
    name: str
    status: str  # pass | fail | not checked
    detail: str


@dataclass
class Comparison:
    baseline: Run
    merged: Run
    tolerances: Tolerances
    dtype: str
    results: list[UpdateResult]
    checks: list[Check]
    notes: list[str]
    first_divergence: dict | None

    @property
    def verdict(self) -> str:
        return FAIL if any(c.status == FAIL for c in self.checks) else PASS

    @property
    def accum_steps(self) -> int:
        return self.merged.accum_steps

    @property
    def updates(self) -> int:
        return self.merged.updates


def check_compatible(base: Run, merged: Run) -> dict[str, np.ndarray] | None:
    """Raise BadInput when the two runs cannot be the same training at all.

    Returns the (shared) initial weights when the sources recorded them.
    """
    if base.updates != merged.updates:
        raise BadInput(
            f"runs of different lengths: baseline has {base.updates} updates, "
            f"merged has {merged.updates}"
        )
    if base.updates == 0:
        raise BadInput("the runs hold no updates to compare")
    b = [(t.name, t.shape) for t in base.tensors]
    m = [(t.name, t.shape) for t in merged.tensors]
    if b != m:
        only = sorted(set(b) ^ set(m))
        first = f"{only[0][0]} {list(only[0][1])}" if only else "tensor order"
        raise BadInput(f"runs of different models: they differ in {first}")
    if base.full_weights != merged.full_weights:
        raise BadInput("cannot compare a run with full weights against one with printed values")
    init_b, init_m = base.init_weights(), merged.init_weights()
    if init_b is not None and init_m is not None:
        for name in init_b:
            if not np.array_equal(init_b[name], init_m[name]):
                delta = float(np.abs(init_b[name] - init_m[name].astype(np.float64)).max())
                raise BadInput(
                    f"initial weights differ (first in {name}, max abs diff {delta:.3g}): the runs "
                    "did not start from the same model; use the same seed and initialisation"
                )
    return init_b


def _dtype(run: Run) -> str:
    params = [t.dtype for t in run.tensors if t.kind == "param"]
    return run.environment.get("dtype") or (params[0] if params else "float32")


def compare(base: Run, merged: Run, overrides: dict | None = None) -> Comparison:
    """Judge `merged` against `base`. Raises BadInput for runs that cannot be compared."""
    starts = check_compatible(base, merged)
    dtype = least_precise([_dtype(base), _dtype(merged)])
    tol = for_dtype(dtype, overrides)
    base_loss, merged_loss = base.window_losses(), merged.window_losses()
    resolution = base.loss_resolution + merged.loss_resolution
    weight_floor = base.weight_resolution + merged.weight_resolution
    changes = inside_window_changes(merged)
    results = []
    for i in range(base.updates):
        allowed = tol.loss_atol + tol.loss_rtol * abs(base_loss[i]) + resolution
        loss_diff = abs(merged_loss[i] - base_loss[i])
        result = UpdateResult(
            i,
            float(base_loss[i]),
            float(merged_loss[i]),
            float(loss_diff) if math.isfinite(loss_diff) else math.inf,
            float(allowed),
        )
        _judge_tensors(result, base, merged, tol, starts, weight_floor)
        _judge_bookkeeping(result, base, merged)
        result.problems.extend(("window", text) for text in changes.get(i, []))
        results.append(result)
    checks = _checks(base, merged, results, changes)
    return Comparison(
        base,
        merged,
        tol,
        dtype,
        results,
        checks,
        _notes(merged, merged_loss),
        _first_divergence(results),
    )


def _judge_tensors(
    result: UpdateResult,
    base: Run,
    merged: Run,
    tol: Tolerances,
    starts: dict | None,
    weight_floor: float,
) -> None:
    i = result.update
    wb, wm = base.weights(i), merged.weights(i)
    if wb is not None and wm is not None:
        for info in base.tensors:
            start = starts.get(info.name) if starts is not None else None
            result.weights.append(
                diff(
                    info.name,
                    wb[info.name],
                    wm[info.name],
                    rtol=tol.weight_rtol,
                    atol=tol.weight_atol + weight_floor,
                    start=start,
                    elementwise=not base.full_weights,
                )
            )
    gb, gm = base.grads(i), merged.grads(i)
    if gb is not None and gm is not None:
        names = [t.name for t in base.tensors if t.name in gb and t.name in gm]
        for name in names:
            result.grads.append(
                diff(name, gb[name], gm[name], rtol=tol.grad_rtol, atol=tol.weight_atol)
            )
        result.grad_ratio, result.grad_cosine = fit_ratio(
            [gb[n] for n in names], [gm[n] for n in names]
        )


def _judge_bookkeeping(result: UpdateResult, base: Run, merged: Run) -> None:
    i = result.update
    if base.lr is not None and merged.lr is not None:
        lb, lm = float(base.lr[i]), float(merged.lr[i])
        same = (math.isnan(lb) and math.isnan(lm)) or math.isclose(lb, lm, rel_tol=1e-12)
        if not same:
            result.problems.append(("lr", f"lr {lm:.6g} in merged, {lb:.6g} in baseline"))
    if base.optimizer_steps is not None and merged.optimizer_steps is not None:
        sb, sm = int(base.optimizer_steps[i]), int(merged.optimizer_steps[i])
        if sb != sm:
            result.problems.append(
                ("optimizer_steps", f"{sm} optimizer step(s) in merged, {sb} in baseline")
            )


def _checks(
    base: Run, merged: Run, results: list[UpdateResult], changes: dict[int, list[str]]
) -> list[Check]:
    checks = [_finite_check(base, merged), _loss_check(results)]
    weight_kind = "weights" if base.full_weights else "weights (printed values only)"
    checks.append(_tensor_check(weight_kind, [r.weights for r in results], "no weights recorded"))
    checks.append(
        _tensor_check(
            "gradients",
            [r.grads for r in results],
            "not recorded by " + _missing(base, merged, "has_grads"),
        )
    )
    checks.append(_window_check(merged, changes))
    checks.append(_series_check("learning rate", "lr", base, merged, results))
    checks.append(_series_check("optimizer steps", "optimizer_steps", base, merged, results))
    init_known = base.load_init_weights is not None and merged.load_init_weights is not None
    checks.append(
        Check(
            "initial weights",
            PASS if init_known else NOT_CHECKED,
            "identical" if init_known else "not recorded by the source",
        )
    )
    return checks


def _finite_check(base: Run, merged: Run) -> Check:
    for name, run in (("baseline", base), ("merged", merged)):
        bad = np.flatnonzero(~np.isfinite(run.micro_loss))
        if bad.size:
            return Check(
                "finite losses",
                FAIL,
                f"{name} loss is {run.micro_loss[bad[0]]} at micro-step {int(bad[0])}",
            )
    return Check("finite losses", PASS, "every micro-step loss is finite")


def _loss_check(results: list[UpdateResult]) -> Check:
    bad = [r for r in results if not r.loss_ok]
    worst = max(r.loss_diff for r in results)
    if bad:
        r = bad[0]
        return Check(
            "losses",
            FAIL,
            f"{len(bad)}/{len(results)} updates differ; first at update "
            f"{r.update}: {r.loss_diff:.3g} > {r.loss_allowed:.3g}",
        )
    return Check("losses", PASS, f"max abs diff {worst:.3g} over {len(results)} updates")


def _tensor_check(name: str, per_update: list[list[TensorDiff]], absent: str) -> Check:
    if not any(per_update):
        return Check(name, NOT_CHECKED, absent)
    diffs = [d for ds in per_update for d in ds]
    bad_updates = [i for i, ds in enumerate(per_update) if not all(d.ok for d in ds)]
    worst = max(diffs, key=lambda d: d.ratio)
    if bad_updates:
        first = next(d for d in per_update[bad_updates[0]] if not d.ok)
        return Check(
            name,
            FAIL,
            f"{len(bad_updates)}/{len(per_update)} updates differ; first at "
            f"update {bad_updates[0]} in {first.name} ({first.ratio:.3g}x the tolerance)",
        )
    return Check(
        name,
        PASS,
        f"worst {worst.name}: {worst.ratio:.2g}x the tolerance, "
        f"max abs diff {max(d.max_abs for d in diffs):.3g}",
    )


def _window_check(merged: Run, changes: dict[int, list[str]]) -> Check:
    name = "no weight change inside a window"
    if merged.accum_steps == 1:
        return Check(name, NOT_CHECKED, "merged run has K=1")
    if merged.micro_state is None:
        return Check(name, NOT_CHECKED, "no per-micro-step weight digests recorded")
    if changes:
        first = min(changes)
        return Check(
            name, FAIL, f"{len(changes)} window(s); first, update {first}: {changes[first][0]}"
        )
    return Check(name, PASS, "weights change only at each window's last micro-step")


def _series_check(
    name: str, attr: str, base: Run, merged: Run, results: list[UpdateResult]
) -> Check:
    if getattr(base, attr) is None or getattr(merged, attr) is None:
        return Check(name, NOT_CHECKED, "not recorded by " + _missing(base, merged, attr))
    bad = [(r.update, text) for r in results for key, text in r.problems if key == attr]
    if bad:
        return Check(
            name, FAIL, f"{len(bad)} update(s) differ; first, update {bad[0][0]}: {bad[0][1]}"
        )
    return Check(name, PASS, "identical at every update")


def _missing(base: Run, merged: Run, attr: str) -> str:
    """Which of the two runs lacks `attr` (None or False)."""
    pairs = (("baseline", base), ("merged", merged))
    names = [n for n, r in pairs if getattr(r, attr) is None or getattr(r, attr) is False]
    return " and ".join(names) or "either run"


def _notes(merged: Run, merged_loss: np.ndarray) -> list[str]:
    notes: list[str] = []
    printed = merged.printed_window_loss
    if printed is not None:
        slack = 2 * merged.loss_resolution + 1e-7 * np.abs(merged_loss)
        gaps = np.abs(printed - merged_loss)
        for i in np.flatnonzero(np.isfinite(printed) & ~(gaps <= slack)):
            notes.append(
                f"update {int(i)}: the log's printed window mean {printed[i]:.8g} "
                f"disagrees with the mean of its micro losses {merged_loss[i]:.8g}; "
                "the computed mean is used"
            )
    return notes


def _first_divergence(results: list[UpdateResult]) -> dict | None:
    for r in results:
        if r.ok:
            continue
        bad_w = next((d.name for d in r.weights if not d.ok), None)
        bad_g = next((d.name for d in r.grads if not d.ok), None)
        where = (
            "gradient"
            if bad_g
            else "weights"
            if bad_w
            else "loss"
            if not r.loss_ok
            else "bookkeeping"
        )
        return {"update": r.update, "parameter": bad_g or bad_w, "in": where}
    return None
