"""Golden files in the judge: make one from a recorded run (and its float64 reference), and judge a
run against one with the same machinery as `compare`.

The losses are judged exactly as `compare` judges them (the golden keeps the window losses of the
run and of its reference). Weights and gradients are judged from the summaries: the error is a
lower bound on ||merged - golden|| (`runs.summaries.lower_bound`), the allowed bound `compare`'s
less the excuses `compare` reads from element values (a jump's at a kink). What the other rules
need the golden keeps: each weight's drift (judge/drift.py: measured against the reference as
`compare` measures it, so `build` accepts the reference `compare` accepts, and the noise widens
as there), and each gradient's norm beside the merged run's and the reference's (gradients on
parted paths are judged by their size: judge/parted_sizes.py). A lower bound fails a run that
`compare` would pass only where such an excuse is needed; what it cannot see (an error
orthogonal to the kept directions) is reported as not checked.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from .. import __version__
from ..errors import BadInput
from ..runs import golden as fmt
from ..runs.model import Run, Tensors
from ..runs.summaries import SKETCH_SIZE, lower_bound, norm, summary
from .compare import compare
from .compatible import check_reference, check_reference_weights, reference_bound
from .drift import Drift, widened
from .metrics import TensorDiff, fit_ratio, fixed_allowed, noise_allowed
from .results import Comparison, UpdateResult
from .signatures.clipping import clip_calls
from .step_rules import stored_bits
from .tolerances import Tolerances

UNNAMED = ("grad-accum-dtype", "token-normalization", "penalty-not-scaled", "grad-not-cleared")
_CONFIG_MAY_DIFFER = {"accum_steps", "device", "record", "snapshot_every"}


def build(run: Run, reference: Run | None) -> dict[str, Any]:
    """The golden file's content for `run` (and its float64 `reference`, checked to be a rerun of
    the same training). Refuses runs without full weights and any non-finite number."""
    if run.kind != "run-dir" or not run.full_weights:
        raise BadInput(f"{run.source}: a golden file is made from a recorded run directory")
    for kept in (run, reference):
        if kept is not None and kept.record == "sketch":  # its updates between hold no tensors
            raise BadInput(
                f"{kept.source}: recorded with --record sketch, whose updates between its full "
                "snapshots keep sketches alone; a golden summarizes every update's weights and "
                "gradients: record it with full snapshots (the default)"
            )
    if run.updates < 1:  # a golden file keeps at least one update (its reader refuses fewer)
        raise BadInput(f"{run.source}: holds no updates, so there is nothing to keep as a golden")
    bound = check_reference(run, run, reference) if reference is not None else None
    init, ref_init = run.init_weights() or {}, reference.init_weights() if reference else None
    # noise-dominated elements drift as `compare` measures them (against the reference alone)
    drift = Drift(init, stored_bits(run)) if bound is not None and init else None
    per_update, names = [], [t.name for t in run.tensors]
    for i in range(run.updates):
        weights, grads = run.weights(i) or {}, run.grads(i) or {}
        ref_w = reference.weights(i) if reference is not None else None
        ref_g = reference.grads(i) if reference is not None else None
        if drift is not None and ref_w is not None and weights:
            drift.advance(grads or None, ref_g, weights, ref_w, first=i == 0)
        if ref_w is not None and bound is not None:
            walked = drift.strayed if drift is not None else None
            check_reference_weights(i, weights, ref_w, init, bound, walked)
        kept_weights = _summaries(names, weights, ref_w, init, ref_init)
        if drift is not None and ref_w is not None:
            _keep_drift(kept_weights, drift)
        per_update.append(
            {
                "update": i,
                "weights": kept_weights,
                "grads": _summaries(names, grads, ref_g, None, None),
            }
        )
    golden = {
        "format": fmt.FORMAT,
        "format_version": fmt.VERSION,
        "gradalign": __version__,
        "environment_key": fmt.environment_key(run.environment),
        "source": {"run": run.source, "reference": reference.source if reference else None},
        "recorded_accum_steps": run.accum_steps,
        "updates": run.updates,
        "sketch_size": SKETCH_SIZE,
        "reference_dtype": reference.dtype if reference is not None else None,
        "grad_dtype": run.grad_dtype,
        "environment": run.environment,
        "config": run.config,
        "model": run.model_facts,
        "optimizer": run.optimizer_settings,
        "tensors": [
            {"name": t.name, "shape": list(t.shape), "dtype": t.dtype, "kind": t.kind}
            for t in run.tensors
        ],
        "init_fingerprints": [fmt.hex64(v) for v in run.init_state]
        if run.init_state is not None
        else None,
        "series": _series(run, reference),
        "per_update": per_update,
    }
    bad = fmt.first_non_finite(golden)
    if bad is not None:
        raise BadInput(
            f"{run.source}: {bad} is not a finite number; a golden must hold finite numbers "
            "(a run that diverged cannot be one)"
        )
    return golden


def _summaries(
    names: list[str],
    values: Tensors,
    ref: Tensors | None,
    start: Tensors | None,
    ref_start: Tensors | None,
) -> dict[str, Any]:
    """Each tensor's summary in model order, its reference's and its noise ||value - ref||."""
    found = {}
    for name in (n for n in names if n in values):
        value = values[name]
        item = summary(value, None if start is None else start[name])
        if ref is not None and name in ref:
            ref_start_value = None if ref_start is None else ref_start[name]
            item["reference"] = summary(ref[name], ref_start_value)
            gap = np.asarray(value, np.float64) - np.asarray(ref[name], np.float64)
            item["noise"] = norm(gap)
        found[name] = item
    return found


def _keep_drift(kept: dict[str, Any], drift: Drift) -> None:
    """Each weight's drift allowance and what the other elements' gradient noise explains of its
    distance from the reference (judge/drift.py), where not 0: `golden check` widens the noise
    by the first as `compare` does, and accepts the noise within both."""
    for name, item in kept.items():
        if "noise" not in item:
            continue
        allowance, explained = drift.allowance(name), drift.explained.get(name, 0.0)
        if allowance > 0:
            item["drift"] = allowance
        if explained > 0:
            item["explained"] = explained


def _series(run: Run, reference: Run | None) -> dict[str, list]:
    series: dict[str, list] = {"window_loss": [float(v) for v in run.window_losses()]}
    if reference is not None:
        series["reference_window_loss"] = [float(v) for v in reference.window_losses()]
    if run.micro_items is not None:
        series["window_items"] = [float(v) for v in run.window_totals(run.micro_items)]
    if run.micro_samples is not None:  # the rows of each batch: a merged window of others is told
        series["window_rows"] = [int(v) for v in run.window_sums(run.micro_samples)]
    if run.micro_data is not None:
        series["window_samples"] = [fmt.hex64(v) for v in run.window_sums(run.micro_data)]
    for key in fmt.SERIES:
        values = clip_calls(run) if key == "clip_calls" else getattr(run, key)
        if values is not None:
            series[key] = [v.item() for v in np.asarray(values)]
    for key in fmt.THRESHOLDS:
        values = getattr(run, key)
        if values is not None and np.isfinite(values).any():
            series[key] = [float(v) if math.isfinite(v) else None for v in values]
    return series


class _SummaryJudge:
    """Judges one update's weights and gradients from the golden's summaries."""

    def __init__(self, golden: dict, merged: Run, tol: Tolerances, floor: float) -> None:
        self.golden, self.merged, self.tol, self.floor = golden, merged, tol, floor
        self.calibrated = "reference_window_loss" in golden["series"]
        self.start = merged.init_weights()
        self.sizes = {t.name: int(np.prod(t.shape)) for t in merged.tensors}
        self.names = [t.name for t in merged.tensors]  # model order, as `compare` judges

    def __call__(self, result: UpdateResult) -> None:
        entry = self.golden["per_update"][result.update]
        weights, grads = self.merged.weights(result.update), self.merged.grads(result.update)
        tol = self.tol
        if weights is not None:
            for name in self.names:
                start = self.start.get(name) if self.start is not None else None
                kept = entry["weights"][name]
                d, _ = self._judge(name, kept, weights[name], start, tol.weight_rtol, self.floor)
                if d.noise is not None:  # as `compare` widens it (judge/drift.py)
                    d = widened(d, kept.get("drift", 0.0), tol.noise_factor)
                result.weights.append(d)
        kept_grads = entry.get("grads") or {}
        if grads is not None and kept_grads:
            golden_sketches, merged_sketches = [], []
            for name in (n for n in self.names if n in kept_grads and n in grads):
                d, mine = self._judge(name, kept_grads[name], grads[name], None, tol.grad_rtol, 0.0)
                result.grads.append(d)
                golden_sketches.append(np.asarray(kept_grads[name]["sketch"]))
                merged_sketches.append(np.asarray(mine["sketch"]))
            if golden_sketches:
                result.grad_ratio, result.grad_cosine = fit_ratio(golden_sketches, merged_sketches)

    def _judge(
        self,
        name: str,
        kept: dict,
        value: np.ndarray,
        start: np.ndarray | None,
        rtol: float,
        floor: float,
    ) -> tuple[TensorDiff, dict]:
        """One tensor against the golden's summary; `floor`: a weight's rounding, in units of
        its norm (metrics.fixed_allowed), 0 for a gradient."""
        mine = summary(value, start if "moved" in kept else None)
        center = kept["reference"] if self.calibrated and "reference" in kept else kept
        finite = bool(np.isfinite(value).all())
        error = lower_bound(mine, center) if finite else math.inf
        rounding = None
        if self.calibrated and "noise" in kept:
            allowed = noise_allowed(
                self.tol.noise_factor, kept["noise"], self.floor, center["norm"]
            )
            rounding = self.floor * center["norm"]
        else:
            scale = kept.get("moved", kept["norm"])
            allowed = fixed_allowed(
                rtol, scale, self.tol.weight_atol, self.sizes[name], floor, kept["norm"]
            )
        nan = math.nan
        moved, noise = kept.get("moved"), kept.get("noise")
        size, norm = self.sizes.get(name), kept["norm"]  # ||b||, from the run's own values
        sizes = (mine["norm"], center["norm"]) if rounding is not None else None  # ||m||, ||ref||
        diff = TensorDiff(
            name,
            *(nan, nan, nan, nan),
            error,
            allowed,
            moved,
            noise,
            rounding=rounding,
            norm=norm,
            size=size,
            sizes=sizes,
        )
        return diff, mine


def judge(
    golden: dict[str, Any],
    source: str,
    merged: Run,
    overrides: dict | None = None,
    on_update: Any = None,
) -> Comparison:
    """Judge `merged` against a golden file's content, read from `source`."""
    base, reference = fmt.as_runs(golden, source)
    if reference is not None:
        check_noise(golden, base, source)

    def tensors(tol: Tolerances, floor: float) -> _SummaryJudge:
        return _SummaryJudge(golden, merged, tol, floor)

    comparison = compare(base, merged, overrides, reference, on_update, tensors=tensors)
    comparison.notes.append(
        f"judged against the golden file {source} (recorded from {golden['source']['run']}, "
        f"{golden['environment_key']}): weight and gradient errors are lower bounds from norms "
        f"and {golden.get('sketch_size', SKETCH_SIZE)} projections per tensor; a golden cannot "
        f"name {', '.join(UNNAMED)}, which read the baseline's gradient values"
    )
    drifted = _drifted_before_failing(comparison)
    if drifted:
        comparison.notes.append(drifted)
    changed = sorted(
        key
        for key in set(golden["config"]) & set(merged.config)
        if key not in _CONFIG_MAY_DIFFER and golden["config"][key] != merged.config[key]
    )
    if changed:
        shown = ", ".join(
            f"{k} {_setting(merged.config[k])} (golden: {_setting(golden['config'][k])})"
            for k in changed[:5]
        )
        comparison.notes.append(f"the run's config differs from the golden's: {shown}")
    return comparison


def _drifted_before_failing(c: Comparison) -> str:
    """Where the run failed `unexplained` after weights with a drift (elements walked on
    rounding noise) passed: `compare` carries the excess the merged run's weights took within
    their drift to every later tensor (judge/noise.py `carry_admitted_excess`), measured from
    their real distance to the reference, of which a golden keeps a lower bound alone. Model
    zoo runs 285625 and 285693 (GPT-2 in float32 under AdamW and RMSprop) passed `compare` and
    failed their goldens so, every failing tensor within 0.16 and 0.32 of what `compare` allowed
    it."""
    first = next((r for r in c.results if not r.ok), None)
    if first is None or any(d.code != "unexplained" for d in c.diagnosis if d.severity == "error"):
        return ""
    names = sorted(
        {d.name for r in c.results[: first.update + 1] for d in r.weights if d.drift and d.ok}
    )
    if not names:
        return ""
    shown = ", ".join(names[:3]) + (f" and {len(names) - 3} more" if len(names) > 3 else "")
    return (
        f"by update {first.update} the weights of {shown} passed within their drift (elements "
        "walked on rounding noise): compare widens every later tensor by the excess the merged "
        "run's weights took within it, measured from their real distance to the reference, of "
        "which a golden keeps a lower bound alone, so a golden may fail here what compare "
        "passes: compare against the baseline's run directory to tell"
    )


def _setting(value: Any) -> str:
    """A config value in the note; None is a setting left to its default (the built-in
    trainer's lr of its optimizer), not a value."""
    return "unset" if value is None else repr(value)


_SLACK = 1e-6  # float64 rounding of norms and sketches summed over millions of elements


def check_noise(golden: dict[str, Any], base: Run, source: str) -> None:
    """Refuse a golden whose noise ||run - reference|| is more than `build` accepted: at every
    update and weight within `reference_bound` of the distance the reference moved, plus the
    weight's kept drift (`_keep_drift`), and over all gradients at update 0
    (`check_first_gradients`). The noise widens every allowed bound; a larger one (a hand edit,
    a merge) would pass what the golden's own run could not. The kept drift is trusted as the
    reference's summaries are: a schema check bounds it, nothing recomputes it."""
    bound = reference_bound(base, base, f"reference of {source}")
    sizes = {t.name: math.prod(t.shape) for t in base.tensors}
    hint = "edited by hand? rewrite it with `gradalign golden write`"
    for entry in golden["per_update"]:
        for name, kept in entry["weights"].items():
            ref = kept["reference"]
            scale = ref.get("moved", ref["norm"])
            limit = fixed_allowed(bound.rtol, scale, bound.atol, sizes[name])
            limit += bound.rounding(name, entry["update"]) * ref["norm"]
            limit += kept.get("drift", 0.0) + kept.get("explained", 0.0)  # its noise's walk
            if not kept["noise"] <= limit + _SLACK * (ref["norm"] + kept["norm"]):
                raise BadInput(
                    f"{source}: golden field 'per_update[{entry['update']}].weights.{name!r}"
                    f".noise' is {kept['noise']:.3g}, more than a reference may stray from its "
                    f"run ({limit:.3g}: {bound.rtol:g} of the distance moved plus rounding); "
                    + hint
                )
    grads = golden["per_update"][0].get("grads") or {}
    apart = math.fsum(g["noise"] ** 2 for g in grads.values())
    size = math.fsum(g["reference"]["norm"] ** 2 for g in grads.values())
    if grads and math.sqrt(apart) > (bound.rtol + bound.epsilon + _SLACK) * math.sqrt(size):
        raise BadInput(
            f"{source}: golden fields 'per_update[0].grads.*.noise' add up to "
            f"{math.sqrt(apart):.3g}, more than {bound.rtol:g} of the gradients' size "
            f"{math.sqrt(size):.3g} that a reference may stray at update 0; " + hint
        )
