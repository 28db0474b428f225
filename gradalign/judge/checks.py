"""The named checks of a comparison, each summarised over all updates: pass, fail or not checked."""

from __future__ import annotations

import numpy as np

from ..runs.model import Run
from ..runs.summaries import SKETCH_SIZE
from .bookkeeping import bad_alike
from .clip_norms import clip_calls_check, pre_clip_check
from .distributed import listed
from .grad_norm import grad_norm_check
from .metrics import TensorDiff
from .replicas import replicas_comparable
from .results import FAIL, NOT_CHECKED, PASS, Check, UpdateResult
from .skipped_steps import SKIPPED
from .window_sizes import data_boundaries, judged_updates, problems
from .windows import observable_windows

NONE_LINED_UP = "no update lines up with the baseline's"


def build_checks(
    base: Run,
    merged: Run,
    results: list[UpdateResult],
    changes: dict[int, list[str]],
    calibrated: bool,
    disagreements: dict[int, list[str]] | None = None,
    grad_rtol: float = 0.0,
) -> list[Check]:
    """The checks of a comparison; `grad_rtol`: the gradients' tolerance, by which the norms
    before clipping a log prints are judged (it prints no gradient to judge them by)."""
    unit = "the noise floor" if calibrated else "the tolerance"
    checks = [
        _bookkeeping_check(base, merged, len(results)),
        _finite_check(base, merged, len(results)),
        _loss_check(results, unit),
        same_samples(base, merged),
    ]
    golden = base.kind == "golden"
    weight_kind = "weights" if base.full_weights else "weights (printed values only)"
    grad_kind = "gradients"
    if golden:
        weight_kind, grad_kind = (f"{k} (norms and projections)" for k in (weight_kind, grad_kind))
    no_weights = "no weights recorded" if results else NONE_LINED_UP
    checks.append(_tensor_check(weight_kind, [r.weights for r in results], no_weights, unit))
    no_grads = "not recorded by " + _missing(base, merged, "has_grads", golden)
    checks.append(
        _tensor_check(
            grad_kind, [r.grads for r in results], no_grads if results else NONE_LINED_UP, unit
        )
    )
    if golden:
        checks += [
            Check(
                f"{kind}, element by element",
                NOT_CHECKED,
                f"a golden file keeps each tensor's norm, distance moved and {SKETCH_SIZE} "
                f"projections, not its values: an error orthogonal to them is not seen; compare "
                "against the baseline run itself for that",
            )
            for kind in ("weights", "gradients")
        ]
    if calibrated and not golden:
        checks.append(grad_norm_check(results))
    checks.append(_window_check(merged, changes))
    if merged.replicas:
        checks.append(_replica_check(merged, disagreements or {}))
    checks.append(_series_check("learning rate", ("lr",), base, merged, results))
    checks.append(
        _series_check(
            "optimizer steps",
            ("optimizer_steps", "state_step", "loss_scale"),
            base,
            merged,
            results,
        )
    )
    if base.clip_max_norm is not None and merged.clip_max_norm is not None:  # both clipped
        checks.append(_series_check("clip threshold", ("clip_max_norm",), base, merged, results))
    checks.append(_init_check(base, merged))
    clipped = base.grad_norm_pre_clip is not None and merged.grad_norm_pre_clip is not None
    if clipped:
        checks.append(pre_clip_check(base, merged, results, grad_rtol, calibrated))
    clips = clip_calls_check(base, merged, results)
    if clips is not None:
        checks.append(clips)
    return checks


def _init_check(base: Run, merged: Run) -> Check:
    """Identical initial weights: compared value by value, or by bit fingerprints (a golden)."""
    if base.load_init_weights is not None and merged.load_init_weights is not None:
        return Check("initial weights", PASS, "identical")
    if base.init_state is not None and merged.init_state is not None:
        return Check("initial weights", PASS, "identical bit fingerprints")
    return Check("initial weights", NOT_CHECKED, "not recorded by the source")


def fingerprint_mismatches(base: Run, other: Run) -> np.ndarray | None:
    """The tensors whose initial bit fingerprints differ; None where either run kept none, or
    of another dtype (they say nothing: a float64 reference's)."""
    mine, theirs = base.init_state, other.init_state
    if mine is None or theirs is None or mine.dtype != theirs.dtype or base.dtype != other.dtype:
        return None
    return np.flatnonzero(mine != theirs)


def sample_mismatches(base: Run, merged: Run) -> np.ndarray | None:
    """Updates whose window saw other samples than the baseline's batch (None: not recorded),
    among the updates whose windows line up."""
    return _window_mismatches(base, merged, "micro_data")


def row_mismatches(base: Run, merged: Run) -> np.ndarray | None:
    """Updates whose window's rows (`micro/pairs`: each sample's tensors together) differ from
    the baseline batch's, though its values may agree (None: either run lacks them). Evidence
    only: a collator that packs each batch into other rows trains alike."""
    return _window_mismatches(base, merged, "micro_pairs")


def _window_mismatches(base: Run, merged: Run, digests: str) -> np.ndarray | None:
    """Updates, among those whose windows line up, whose window sum of a per-micro-step digest
    series (a Run field) differs between the runs (None: either lacks it)."""
    mine, theirs = getattr(base, digests), getattr(merged, digests)
    if mine is None or theirs is None:
        return None
    n = judged_updates(base, merged)
    same = base.window_sums(mine)[:n] == merged.window_sums(theirs)[:n]
    return np.flatnonzero(~same)


def _bookkeeping_check(base: Run, merged: Run, judged: int) -> Check:
    name = "window bookkeeping"
    found = problems(base, "baseline") + problems(merged, "merged", base)
    if found:
        later = max(base.updates, merged.updates) - judged
        tail = f"; {later} later update(s) not comparable" if later > 0 else ""
        return Check(name, FAIL, "; ".join(found) + tail)
    ends = data_boundaries(merged, base)
    inner = [i for i in ends if i < merged.updates - 1]  # the last window may end the data
    sizes = {int(merged.sizes[i]) for i in inner}
    if merged.updates >= 2 and len(inner) == merged.updates - 1 and len(sizes) == 1:
        held = sizes.pop()  # every window before the last held another K: not data ends
        return Check(
            name,
            PASS,
            f"every window held {held} micro-steps, not the K={merged.accum_steps} the run "
            "states (accum_steps given to the Recorder), each lined up with the baseline's "
            f"batch of its update: the loop accumulates {held}; record it with "
            f"accum_steps={held}"
            + (
                " (or it called micro() once per window, not after each micro-batch's "
                "backward: then no check could look inside the windows)"
                if held == 1
                else ""
            ),
        )
    if ends:
        shown = ", ".join(f"{i} ({int(merged.sizes[i])})" for i in ends[:3])
        if len(ends) > 3:
            shown += f" and {len(ends) - 3} more"
        why = (
            "at the end of the data"
            if not inner
            else "(windows that vary, as a token budget makes them, or the data's end)"
        )
        return Check(
            name,
            PASS,
            f"every window ended with update() and held K micro-steps, except window(s) {shown} "
            f"{why}, each lined up with the baseline's batch of its update (the samples check "
            "judges what they hold)",
        )
    return Check(name, PASS, "every window held K micro-steps and ended with update()")


def same_samples(base: Run, merged: Run) -> Check:
    name = "same samples per update"
    bad = sample_mismatches(base, merged)
    if bad is None:
        return Check(
            name, NOT_CHECKED, "no batch digests from " + _missing(base, merged, "micro_data")
        )
    if bad.size:
        return Check(
            name,
            FAIL,
            f"{bad.size}/{base.updates} windows saw other samples; first at update {int(bad[0])}",
        )
    if not judged_updates(base, merged):  # irregular windows from the first: nothing compared
        return Check(name, NOT_CHECKED, NONE_LINED_UP)
    return Check(name, PASS, "every window saw exactly its baseline batch's samples")


def _finite_check(base: Run, merged: Run, n: int) -> Check:
    alike = bad_alike(base, merged, n)
    if alike is not None:
        updates = listed([str(u) for u in np.flatnonzero(alike)], 6)
        return Check(
            "finite losses",
            PASS,
            f"both runs' losses are not finite at update(s) {updates} alike and finite again "
            "after (a bad batch both met): not judged there",
        )
    for name, run in (("baseline", base), ("merged", merged)):
        bad = run.non_finite_losses()
        if bad.size:
            return Check(
                "finite losses",
                FAIL,
                f"{name} loss is {run.micro_loss[bad[0]]} at micro-step {int(bad[0])}",
            )
    unprinted = sum(int((~r.loss_known).sum()) for r in (base, merged) if r.loss_known is not None)
    if unprinted:
        return Check(
            "finite losses",
            PASS,
            f"every printed micro-step loss is finite ({unprinted} not printed: iterations a "
            "loss scaler skipped)",
        )
    return Check("finite losses", PASS, "every micro-step loss is finite")


def _loss_check(results: list[UpdateResult], unit: str) -> Check:
    if not results:
        return Check("losses", NOT_CHECKED, NONE_LINED_UP)
    skipped = [r.update for r in results if not r.loss_judged]
    results = [r for r in results if r.loss_judged]
    unjudged = (
        f"; not judged at update(s) {listed([str(u) for u in skipped], 6)}, which both runs "
        "skipped alike (a loss scaler's skip a log printed no loss for, or a loss not finite "
        "in both)"
        if skipped
        else ""
    )
    if not results:
        return Check("losses", NOT_CHECKED, "no update's loss was printed" + unjudged)
    bad = [r for r in results if not r.loss_ok]
    worst = max(r.loss_diff for r in results)
    if bad:
        r = bad[0]
        return Check(
            "losses",
            FAIL,
            f"{len(bad)}/{len(results)} updates differ; first at update "
            f"{r.update}: {r.loss_error:.3g} > {r.loss_allowed:.3g}{unjudged}",
        )
    ratio = max(r.loss_error / r.loss_allowed if r.loss_allowed else 0.0 for r in results)
    return Check(
        "losses",
        PASS,
        f"max abs diff {worst:.3g} over {len(results)} updates ({ratio:.2g}x {unit}){unjudged}",
    )


def _tensor_check(name: str, per_update: list[list[TensorDiff]], absent: str, unit: str) -> Check:
    if not any(per_update):
        return Check(name, NOT_CHECKED, absent)
    seen = sum(1 for ds in per_update if ds)
    partial = f" ({seen} of {len(per_update)} updates shown)" if seen < len(per_update) else ""
    diffs = [d for ds in per_update for d in ds]
    bad_updates = [i for i, ds in enumerate(per_update) if not all(d.ok for d in ds)]
    diffs = [d for d in diffs if d.excused != SKIPPED]  # never stepped with: no worst
    if not diffs:
        return Check(name, NOT_CHECKED, "both runs' optimizers skipped every step recorded")
    worst = max(diffs, key=lambda d: d.ratio)
    if bad_updates:
        first = next(d for d in per_update[bad_updates[0]] if not d.ok)
        return Check(
            name,
            FAIL,
            f"{len(bad_updates)}/{len(per_update)} updates differ; first at "
            f"update {bad_updates[0]} in {first.name} ({first.ratio:.3g}x {unit}){partial}",
        )
    noise = ""
    if worst.noise is not None and worst.noise > 0:
        noise = f", {worst.error / worst.noise:.2g}x the baseline's own error"
    known = [d.max_abs for d in diffs if not np.isnan(d.max_abs)]
    largest = (
        f", max abs diff {max(known):.3g}" if known else ", errors are lower bounds from summaries"
    )
    return Check(
        name, PASS, f"worst {worst.name}: {worst.ratio:.2g}x {unit}{noise}{largest}{partial}"
    )


def _window_check(merged: Run, changes: dict[int, list[str]]) -> Check:
    name = "no weight change inside a window"
    if merged.accum_steps == 1:
        return Check(name, NOT_CHECKED, "merged run has K=1")
    if merged.micro_state is None:
        return Check(name, NOT_CHECKED, "no per-micro-step weight digests recorded")
    if not observable_windows(merged):
        return Check(name, NOT_CHECKED, "no window shows its weights twice (printed only once)")
    if changes:
        first = min(changes)
        return Check(
            name, FAIL, f"{len(changes)} window(s); first, update {first}: {changes[first][0]}"
        )
    return Check(name, PASS, "weights change only at each window's last micro-step")


def _replica_check(merged: Run, disagreements: dict[int, list[str]]) -> Check:
    name = "cards hold the same weights"
    if not replicas_comparable(merged):
        return Check(name, NOT_CHECKED, "the card logs print no weights")
    if disagreements:
        first = min(disagreements)
        return Check(
            name,
            FAIL,
            f"{len(disagreements)} update(s); first, update {first}: {disagreements[first][0]}",
        )
    cards = len(merged.replicas) + 1
    return Check(name, PASS, f"all {cards} cards printed identical weights at every step")


def _series_check(
    name: str, attrs: tuple[str, ...], base: Run, merged: Run, results: list[UpdateResult]
) -> Check:
    present = [a for a in attrs if getattr(base, a) is not None and getattr(merged, a) is not None]
    if not present:
        return Check(name, NOT_CHECKED, "not recorded by " + _missing(base, merged, attrs[0]))
    if not results:
        return Check(name, NOT_CHECKED, NONE_LINED_UP)
    bad = [(r.update, text) for r in results for key, text in r.problems if key in attrs]
    if bad:
        return Check(
            name, FAIL, f"{len(bad)} update(s) differ; first, update {bad[0][0]}: {bad[0][1]}"
        )
    return Check(name, PASS, "identical at every update")


def _missing(base: Run, merged: Run, attr: str, golden: bool = False) -> str:
    """Which of the two runs lacks `attr` (None or False)."""
    pairs = (("the golden file" if golden else "baseline", base), ("merged", merged))
    names = [n for n, r in pairs if getattr(r, attr) is None or getattr(r, attr) is False]
    return " and ".join(names) or "either run"
