"""Learning-rate signatures: a schedule stepped at another pace or offset, an lr scaled by a
constant. Both compare the lr each optimizer step used (recorded by a step hook), at the
precision each run recorded it in."""

from __future__ import annotations

import numpy as np

from ..bookkeeping import (
    NARROW,
    distinct,
    group_named,
    lr_groups,
    recorded_dtype,
)
from ..results import Comparison, Diagnosis
from .common import finite, scaling_rules, window

SCALE_MATCH = 1e-6  # relative: a constant lr ratio, allowing float32 rounding of each lr


# accelerate's batches split over the processes, whose scheduler then steps once per update
SPLIT_BATCHES = "`Accelerator(dataloader_config=DataLoaderConfiguration(split_batches=True))`"


def lined_up_lrs(c: Comparison) -> tuple[np.ndarray, np.ndarray]:
    """Both runs' lr over the updates that line up (runs whose windows stop lining up differ
    in length), of the first param group whose lr differs there (`differing_group`)."""
    _, base_lr, merged_lr = differing_group(c)
    return base_lr, merged_lr


def differing_group(c: Comparison) -> tuple[int, np.ndarray, np.ndarray]:
    """(group, baseline's lr, merged's lr) over the updates that line up, of the first param
    group whose lr differs at one of them, else of the first group: a schedule stepped per
    micro-step in one group alone (a head's own lambda) is read from that group."""
    n = len(c.results)
    groups = [(g, b[:n], m[:n]) for g, b, m in lr_groups(c.baseline, c.merged)]
    for group, b, m in groups:
        both = min(len(b), len(m))
        wide = (np.asarray(x[:both], dtype=np.float64) for x in (b, m))
        if not _equal(b, m)(*wide).all():
            return group, b, m
    return groups[0] if groups else (0, c.baseline.lr, c.merged.lr)


def _lr_differs(c: Comparison) -> list[int]:
    return [r.update for r in c.results if any(k == "lr" for k, _ in r.problems)]


def _equal(base_lr: np.ndarray, merged_lr: np.ndarray):
    """Elementwise equality of two float64 arrays of lrs: at the coarser precision the two
    runs recorded theirs in (`bookkeeping.same_scalar`), or within 1e-9 relative (1e-15
    absolute); NaN equals NaN (no step in either)."""
    dtypes = recorded_dtype(merged_lr), recorded_dtype(base_lr)
    narrow = [NARROW[d] for d in dtypes if d in NARROW]
    kind = min(narrow, key=lambda t: np.finfo(t).bits) if narrow else None

    def same(a: np.ndarray, b: np.ndarray) -> np.ndarray:
        with np.errstate(over="ignore", invalid="ignore"):
            exact = a.astype(kind) == b.astype(kind) if kind is not None else a == b
            close = np.abs(a - b) <= np.maximum(1e-9 * np.maximum(np.abs(a), np.abs(b)), 1e-15)
        return exact | close | (np.isnan(a) & np.isnan(b))

    return same


MAX_PACE = 64  # paces tried beyond the likely ones (K, W): a schedule stepped that often


def schedule_offset(
    base_lr: np.ndarray, merged_lr: np.ndarray, likely: tuple[int, ...] = ()
) -> tuple[int, int] | None:
    """The pace m and offset c with merged lr[t] == baseline lr[m·t + c] wherever the baseline
    reaches m·t + c, at two updates at least (three for a pace other than 1 and the likely
    ones: two lrs of a step schedule fit a pace by chance; m = 1, c = 0 is the same schedule),
    one of them an update where the two differ (a constant stretch of the baseline's fits any
    pace); c = −1
    (one update behind) at the same pace only. Where several paces fit (a warmup that levels
    off fits 2·t + 3 as well as 4·t + 3), the first of `likely` that fits (K, the micro-steps
    per update), else the slowest. Paces up to MAX_PACE are tried, and the likely ones and one
    more (a scheduler stepped at every micro-step and again after the step), each offset in one
    vectorized comparison: the work grows with the updates times the paces, not their cube."""
    base = np.asarray(base_lr, dtype=np.float64)
    merged = np.asarray(merged_lr, dtype=np.float64)
    n = min(len(base), len(merged))
    base, merged = base[:n], merged[:n]
    same = _equal(np.asarray(base_lr), np.asarray(merged_lr))
    differs = np.concatenate(([0], np.cumsum(~same(merged, base))))  # prefix counts
    fits = []
    paces = sorted({*range(1, MAX_PACE + 1), *likely, *(m + 1 for m in likely)})
    for m in (m for m in paces if m < n):
        if fits and m > max(likely, default=0):
            break  # no likelier pace is left to find
        for c in range(-1 if m == 1 else 0, 2 * m + 1):
            if (m, c) == (1, 0):
                continue
            first, stop = (-c + m - 1) // m, (n - c + m - 1) // m  # 0 <= m·t + c < n
            first, stop = max(first, 0), min(stop, n)
            least = 2 if m == 1 or m in likely else 3  # a pace less likely (K+1, any other)
            if stop - first < least or differs[stop] == differs[first]:
                continue  # too few updates (two lrs of a step schedule fit by chance), or none
                # where the two lrs differ
            ts = np.arange(first, stop)
            if bool(same(merged[ts], base[m * ts + c]).all()):
                if not likely:
                    return m, c
                fits.append((m, c))
    return next((f for m in likely for f in fits if f[0] == m), fits[0] if fits else None)


def late_pace(
    base_lr: np.ndarray, merged_lr: np.ndarray, likely: tuple[int, ...]
) -> tuple[int, int, int] | None:
    """(m, c, d): the lrs agree before update d, and from d on merged lr[t] == baseline lr[m·t
    + c] wherever the baseline reaches it, at two updates at least, for a likely pace m > 1
    (K, W): a schedule that began to advance m steps per update partway through the run (a
    scheduler.step() moved into the micro-step loop at some update, or one that steps per
    micro-step once warmup ends). At d the merged schedule stands 1 to 2·m steps ahead."""
    base = np.asarray(base_lr, dtype=np.float64)
    merged = np.asarray(merged_lr, dtype=np.float64)
    n = min(len(base), len(merged))
    base, merged = base[:n], merged[:n]
    same = _equal(np.asarray(base_lr)[:n], np.asarray(merged_lr)[:n])(merged, base)
    differ = np.flatnonzero(~same)
    if not differ.size or differ[0] == 0:
        return None
    d = int(differ[0])
    for m in sorted(p for p in likely if p > 1):
        for ahead in range(1, 2 * m + 1):
            c = d + ahead - m * d  # m·d + c = d + ahead
            ts = np.arange(d, n)
            ts = ts[m * ts + c < n]
            if ts.size >= 2 and bool(
                _equal(base_lr, merged_lr)(merged[ts], base[m * ts + c]).all()
            ):
                return m, c, d
    return None


def lr_ratio(
    base_lr: np.ndarray, merged_lr: np.ndarray, slack: np.ndarray | None = None
) -> float | None:
    """The constant q with merged lr = q · baseline lr at every step (None if there is none),
    to SCALE_MATCH and each step's `slack` (relative: what printing the two lrs rounded)."""
    both = np.isfinite(base_lr) & np.isfinite(merged_lr) & (base_lr != 0)
    if both.sum() < 1:
        return None
    ratios = merged_lr[both] / base_lr[both]
    allowed = SCALE_MATCH + (0.0 if slack is None else np.asarray(slack)[both])
    q = float(np.median(ratios))
    if q <= 0 or abs(q - 1) <= np.max(allowed):
        return None
    return q if bool(np.all(np.abs(ratios / q - 1) <= allowed)) else None


def printed_slack(c: Comparison) -> np.ndarray:
    """Per update lined up, how far the ratio of the two printed lrs may be off by their
    printing alone (half a printed digit of each, relative; 0 for an lr recorded, not printed)."""
    n = len(c.results)
    slack = np.zeros(n)
    for run in (c.baseline, c.merged):
        if run.lr_quantum is not None:
            lr = np.abs(np.asarray(run.lr, dtype=np.float64)[:n])
            quantum = np.asarray(run.lr_quantum, dtype=np.float64)[:n]
            with np.errstate(divide="ignore", invalid="ignore"):
                slack += np.where(lr > 0, 0.5 * quantum / np.where(lr > 0, lr, 1.0), 0.0)
    return slack


def _explained_by_schedule(base_lr: np.ndarray, merged_lr: np.ndarray, k: int) -> bool:
    """A schedule stepped at another pace explains the lrs (a hyperbolic schedule stepped per
    micro-step is also a constant multiple of the baseline's: the pace is the likelier bug)."""
    found = schedule_offset(base_lr, merged_lr, (k,))
    return found is not None and found[0] > 1


def _compared(base_lr: np.ndarray, merged_lr: np.ndarray) -> int:
    """How many updates both runs stepped with a finite, nonzero baseline learning rate."""
    return int((np.isfinite(base_lr) & np.isfinite(merged_lr) & (base_lr != 0)).sum())


def _scaling_rule(q: float, k: int, slack: float = 0.0) -> bool:
    """Whether `q` is what a batch-size rule gives for K: K or sqrt(K), or their inverses."""
    return any(abs(q / rule - 1) <= SCALE_MATCH + slack for rule, _ in scaling_rules(k))


def scaled_lr(c: Comparison) -> tuple[float, int] | None:
    """(q, u): the merged lr is q times the baseline's at every update from u on and equal
    before (u = 0: at every update), where no schedule's pace explains the two. From a later u
    only at a batch-size scaling rule's q (K, sqrt(K) or their inverses) over two updates at
    least: a ratio that appears late, in no rule, is a schedule's doing, read by lr-schedule."""
    bad = _lr_differs(c)
    if not bad:
        return None
    _, base_lr, merged_lr = differing_group(c)
    k = window(c)
    if _explained_by_schedule(base_lr, merged_lr, k):
        return None
    slack = printed_slack(c)
    q = lr_ratio(base_lr, merged_lr, slack)
    most = SCALE_MATCH + float(slack.max(initial=0.0))
    if q is not None:
        if _compared(base_lr, merged_lr) < 2 and not _scaling_rule(q, k, most - SCALE_MATCH):
            return None  # one update's ratio is no constant: a schedule's pace reads alike
        return q, 0
    first = bad[0]
    if first == 0 or _compared(base_lr[first:], merged_lr[first:]) < 2:
        return None
    if not _equal(base_lr[:first], merged_lr[:first])(
        *(np.asarray(x[:first], dtype=np.float64) for x in (base_lr, merged_lr))
    ).all():
        return None
    q = lr_ratio(base_lr[first:], merged_lr[first:], slack[first:])
    if q is None or not _scaling_rule(q, k, most - SCALE_MATCH):
        return None
    return q, first


def lr_scaled(c: Comparison) -> Diagnosis | None:
    found = scaled_lr(c)
    if found is None:
        return None
    q, first = found
    group, base_lr, merged_lr = differing_group(c)
    k, most = window(c), SCALE_MATCH + float(printed_slack(c).max(initial=0.0))
    if abs(q / k - 1) <= most:
        q, which = float(k), f" = K={k}"
    elif abs(q * k - 1) <= most:
        q, which = 1 / k, f" = 1/K (K={k})"
    else:
        which = ""
    when = "at every update" if first == 0 else f"from update {first} on (equal before it)"
    cause = (
        "the merged optimizer was given another lr (a batch-size scaling rule applied to "
        "accumulation, which keeps the effective batch B)"
        if first == 0
        else "the lr was rescaled there (a batch-size scaling rule applied when the run was "
        "resumed, or when K changed): accumulation keeps the effective batch B"
    )
    if first and _diverged_by(c, first - 1):  # as a scheduler fed the loss would follow them
        cause += (
            f"; or, as the runs' losses or gradients differed before update {first}, a "
            "scheduler that steps on the loss (ReduceLROnPlateau) followed them there: then "
            "what made them differ comes first"
        )
    return Diagnosis(
        "lr-scaled",
        f"the merged learning rate{group_named(group)} is {q:.6g} times the baseline's {when}"
        f"{which}: {cause}",
        {
            "lr_ratio": q,
            "K": k,
            "first_update": first,
            "merged_lr": finite(merged_lr[first]),
            "baseline_lr": finite(base_lr[first]),
            **({"param_group": group} if group else {}),
        },
        "give the merged optimizer the baseline's learning rate: accumulation over K micro-"
        "batches of B/K is the batch of B, so no lr scaling applies",
    )


def _diverged_by(c: Comparison, update: int) -> bool:
    """Whether a loss or a gradient failed at or before `update`: computed before that update's
    step, neither can follow from its learning rate, so a learning rate that first differs
    there, in no schedule's pattern, followed the divergence (a scheduler stepped on the loss,
    such as ReduceLROnPlateau) rather than caused it."""
    return any(not r.loss_ok or any(not d.ok for d in r.grads) for r in c.results[: update + 1])


def _first_present(lrs: np.ndarray) -> int | None:
    """The first update a param group held an lr at (NaN before `add_param_group` added it)."""
    held = np.flatnonzero(~np.isnan(np.asarray(lrs, dtype=np.float64)))
    return int(held[0]) if held.size else None


def lr_schedule(c: Comparison) -> Diagnosis | None:
    bad = _lr_differs(c)
    if not bad:
        return None
    if scaled_lr(c) is not None:
        return None  # lr-scaled's
    group, base_lr, merged_lr = differing_group(c)
    i = bad[0]
    evidence: dict = {
        "first_update": i,
        "merged_lr": finite(merged_lr[i]),
        "baseline_lr": finite(base_lr[i]),
        "updates_differing": len(bad),
    }
    present = _first_present(base_lr), _first_present(merged_lr)
    grouped = c.baseline.lr_groups is not None and c.merged.lr_groups is not None
    if grouped and present[0] != present[1]:  # a group that does not exist yet holds no lr
        evidence.update(param_group=group, baseline_from=present[0], merged_from=present[1])
        return Diagnosis(
            "lr-schedule",
            f"param group {group} (in the model's order) steps from update {present[1]} in the "
            f"merged run and from "
            f"update {present[0]} in the baseline: it was added (add_param_group) at another "
            "point of the training, as at a count of micro-steps instead of updates",
            evidence,
            "add the group (or unfreeze its parameters) at the same update in both runs: count "
            "optimizer steps, not micro-batches",
        )
    found = schedule_offset(base_lr, merged_lr, (window(c),))
    late = late_pace(base_lr, merged_lr, (window(c),)) if found is None else None
    if late is not None:
        found, i = late[:2], late[2]
    # a consequence: a scheduler fed the diverged loss (ReduceLROnPlateau); never at update 0,
    # which no loss fed to a scheduler can have moved yet (a plateau's first step only sets its
    # best): there the lr is a cause beside what failed (tests/test_schedule_pace.py)
    if found is None and i > 0 and _diverged_by(c, i):
        return None
    shown_m, shown_b = distinct(float(merged_lr[i]), float(base_lr[i]))
    fix = (
        "step the scheduler once per optimizer step (once per window of K micro-batches), "
        "after optimizer.step(), and give both runs the same schedule in updates"
    )
    if group:
        evidence["param_group"] = group
    if found is not None:
        m, offset = found
        evidence["schedule_steps_per_update"], evidence["schedule_offset"] = m, offset
        where = f"{m}·t {'+' if offset > 0 else '−'} {abs(offset)}" if offset else f"{m}·t"
        pace = (
            f"advanced {m} steps per update"
            if m > 1
            else f"ran {offset} step(s) ahead"
            if offset > 0
            else "ran one step behind"
        )
        since = "" if late is None else f" from update {i} on (equal before it)"
        message = (
            f"the learning-rate schedule{group_named(group)} {pace}{since}: merged lr at "
            f"update t equals the baseline's at update {where} (update {i}: {shown_m} vs "
            f"{shown_b})"
        )
        if m == 1 and abs(offset) == 1 and not c.merged.full_weights:
            fix = (
                "print the lr at the same point of both loops (the lr the optimizer step used, "
                "before scheduler.step()); if the merged scheduler really is a step "
                f"{'ahead' if offset > 0 else 'behind'}, step it once per optimizer step, "
                "after optimizer.step()"
            )
            message += (
                ": the two logs may print the lr at different points of the loop (one before "
                "scheduler.step(), one after), as a print moved into the window's `if` does"
            )
        if m == window(c):
            message += ", i.e. the scheduler stepped once per micro-step"
            if m == c.merged.world_size:  # scheduler-per-rank's pace too: not told apart
                message += (
                    f", or once per rank (W = K = {m}: accelerate steps a prepared scheduler "
                    "once per process)"
                )
                fix += f"; or, if it stepped once per rank, split the batches: {SPLIT_BATCHES}"
            if offset and late is None:
                message += f", {offset} of them before the window's optimizer step"
    else:
        message = (
            f"the learning rates{group_named(group)} differ from update {i} on ({shown_m} in "
            f"merged, {shown_b} in baseline)"
        ) + _beyond_baseline(base_lr, merged_lr, evidence)
    return Diagnosis("lr-schedule", message, evidence, fix)


def _beyond_baseline(base_lr: np.ndarray, merged_lr: np.ndarray, evidence: dict) -> str:
    """Where no pace fits: the first update whose merged lr lies outside every lr the baseline
    held (below its lowest, above its highest), said, as a schedule that advanced faster (a
    scheduler stepped per micro-step, or fed each micro-batch's loss) leaves it."""
    base = np.asarray(base_lr, dtype=np.float64)
    merged = np.asarray(merged_lr, dtype=np.float64)
    if not np.isfinite(base).any():
        return ""
    low, high = np.nanmin(base), np.nanmax(base)
    with np.errstate(invalid="ignore"):
        outside = np.flatnonzero((merged < low * (1 - 1e-6)) | (merged > high * (1 + 1e-6)))
    if not outside.size:
        return ""
    j = int(outside[0])
    evidence["first_update_beyond_baseline"] = j
    side = "below the lowest" if merged[j] < low else "above the highest"
    return (
        f"; from update {j} the merged lr ({merged[j]:.4g}) is {side} the baseline ever held "
        f"({low if merged[j] < low else high:.4g}): its schedule moved faster than the "
        "baseline's, as a scheduler stepped at every micro-step, or one fed each micro-batch's "
        "loss (ReduceLROnPlateau), does; no fixed pace fits it"
    )
