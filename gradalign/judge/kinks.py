"""A ReLU-like kink crossed in one run and not the other: an honest difference the noise floor
cannot see coming.

A unit whose pre-activation sits within rounding of a kink (ReLU's 0, a max-pool's tie) is
switched on in one run and off in the other. The forward barely changes (the activation is
continuous there), but the backward through that unit gains or loses one sample's
contribution: at that update, one row of the unit's weight (and its bias element) and one
column of the next layer's weight hold the whole gradient error, and every tensor upstream of
the unit follows. The baseline crosses kinks
against the reference too (measured: 2 in 300 updates of the default SGD run).

- **An isolated jump** (`excuse_isolated_jumps`): a gradient failure at a single update whose
  error sits in a few rows, with the neighbouring updates, the weights and the loss all within
  noise, is reported as a note, not a failure; at most `1 + updates // 100` such updates.
- **Jumps the baseline makes too** (`excuse_jumps_like_the_baselines`): over a long run a
  model with many near-ties (a max over positions after a convolution) crosses kinks at many
  updates, some in a row. Where the baseline's own gradient jumped against the reference (its
  error over `JUMP_OUTLIER` times its median over the run, held in at most `JUMP_OWN_ROWS` rows
  and `JUMP_OWN_SHARE` of them), the merged run's gradient failures with the weights within
  noise are excused if there are at most factor times as many updates of them as of the
  baseline's, each only in tensors the baseline jumped in and in no more rows than its jumps
  needed; otherwise none is. Only the baseline and the reference say where and how a jump looks,
  so a bug in the merged run cannot widen this, and a bug fails its weights anyway.
- **A divergence that starts at a kink** (`follow_kink_divergence`): under an adaptive
  optimizer or momentum, the steps taken with the jumped gradient move that unit's weights by a
  share of a step, and from then on the two runs follow neighbouring trajectories, not one
  trajectory and its rounding. When the first update that fails has the kink's signature (no
  bookkeeping problem, the loss within noise, every earlier update within noise, the worst
  gradient's error in at most `KINK_UNITS` rows and `JUMP_ROWS` of its rows, and the step
  taken with it left the rounding: some weight failed, or stood over factor times its noise
  and factor times further than the update before, passing by what a drift allows (`_stepped`;
  model zoo run 7155, an encoder under Adam, K=4, 100 updates: the kink's row stepped 14.9x
  its noise at update 83 and no weight failed until kinks crossed at updates 89 to 93 had
  failed the gradients; else it is an isolated jump or none), the kink's size is
  measured there as a share of the reference: J_g, the failing gradients' largest
  ||g_m − g_ref|| / ||g_ref||, and J_w, the larger of J_g (a gradient off by a share of itself
  steps off by about that share) and the failing weights' largest
  ||w_m − w_ref|| / ||w_ref − w_ref(before)||. From that update on, each gradient may also
  differ by factor·J_g·||g_ref|| and each weight by factor·J_w·||w_ref − w_ref(before)|| (the
  distance the reference moved since the update before the kink), and a note says so; a kink
  with factor·J_g ≥ 1 would leave the gradients unchecked and is not followed. Measured on the
  Transformer encoders of bench/model_zoo.py that crossed a kink (4 of about 170 runs, Adam,
  AdamW, Adamax, RAdam): later gradients stayed within 2.1 J_g (a second kink crossed at the
  next update in one of them). Runs parted at one kink cross others: a later update whose
  gradient is further off than J_g, that error in a few rows or columns, is another kink, and
  J_g (and J_w with it) is raised to its size from there (`_later_kink`; model zoo run 753:
  0.57% at update 4, 1.66% at update 6, then 2.3% at update 9 failed). An accumulation bug
  is not localized: it fails the update it
  starts at in every tensor its windows touch (loss scaling, a lost micro-batch, a gradient not
  cleared differ by shares of 1/K and more), and one that starts after a kink must still exceed
  factor·J_g (a few percent in those runs). The signature
  needs the update's full weights and gradients; where a run kept sketches there, a failure
  that could be a kink stays a failure and a note says what would tell them apart.

Without a reference the isolated jump and the followed divergence are measured against the
baseline instead (the fixed tolerances may not see the kink's step in the weights, so none is
required to have failed there): a Transformer encoder's ReLU feed-forward crossing a kink under
Adam was the last kind of false alarm of bench/model_zoo.py --reference-none (4 of 800 runs).
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np

from ..runs.model import Run, Tensors
from .metrics import TensorDiff, _safe_div
from .results import UpdateResult

JUMP_SHARE = 0.9  # a kink's jump holds this share of its error ...
JUMP_ROWS = 0.01  # ... in at most this share of the tensor's rows (at least one row)
KINK_UNITS = 2  # a divergence followed from a kink crossed at most this many units
JUMP_OUTLIER = 10.0  # a baseline's gradient error this many times its median is a jump ...
JUMP_OWN_ROWS = 8  # ... if at most this many rows hold JUMP_SHARE of it ...
JUMP_OWN_SHARE = 0.25  # ... and at most this share of the rows


def excuse_isolated_jumps(results: list[UpdateResult], merged: Run, ref: Run) -> list[str]:
    """Mark isolated, localized gradient jumps as excused; return a note for each."""
    candidates = [
        r
        for r in results
        if _gradients_alone_failed(r) and r.loss_ok and _neighbours_pass(results, r.update)
    ]
    notes = []
    for r in candidates[: 1 + len(results) // 100]:
        gm, gr = merged.grads(r.update), ref.grads(r.update)
        if gm is None or gr is None:
            continue
        failing = [d for d in r.grads if not d.ok]
        shares = {d.name: _row_share(gm[d.name], gr[d.name]) for d in failing}
        if not all(rows is not None for rows in shares.values()):
            continue
        _excuse(r, set(shares), "isolated jump")
        worst = max(failing, key=lambda d: d.ratio)
        notes.append(
            f"update {r.update}: the gradient of {', '.join(shares)} jumped to "
            f"{worst.ratio:.3g}x its noise floor in {max(shares.values())} row(s) or column(s) of "
            f"{worst.name}, while the updates around it, the weights and the loss stayed "
            "within noise: an activation crossed its kink in one run and not the other "
            "(the baseline shows such jumps against the reference too); not counted as a "
            "failure"
        )
    return notes


def excuse_jumps_like_the_baselines(
    results: list[UpdateResult], base: Run, merged: Run, ref: Run, factor: float
) -> list[str]:
    """Excuse gradient jumps the baseline makes against the reference too (module docstring):
    at most `factor` times as many as the baseline's, in the tensors it jumped in, each held in
    as few rows as its own jumps were. One note for all of them."""
    # the loss is judged on its own: a jump at u moves the loss of u + 1
    candidates = [r for r in results if _gradients_alone_failed(r)]
    if not candidates:
        return []
    own = _baseline_jumps(results, base, ref)
    seen = sorted(set().union(*(updates for updates, _ in own.values())))
    if not own or len(candidates) > factor * len(seen):
        return []
    rows_seen = {name: rows for name, (_, rows) in own.items()}
    excused = []
    for r in candidates:
        gm, gr = merged.grads(r.update), ref.grads(r.update)
        if gm is None or gr is None:
            return []
        failing = [d for d in r.grads if not d.ok]
        if not all(
            d.name in rows_seen
            and _row_share(gm[d.name], gr[d.name], rows_seen[d.name], JUMP_OWN_SHARE)
            for d in failing
        ):
            return []
        excused.append((r, failing))
    for r, failing in excused:
        _excuse(r, {d.name for d in failing}, "jump")
    tensors = sorted({d.name for _, failing in excused for d in failing})
    at = ", ".join(str(r.update) for r, _ in excused)
    return [
        f"updates {at}: the gradients of {', '.join(tensors)} jumped out of noise in a few "
        "rows while the weights stayed within noise, as the baseline's own "
        f"gradients jumped against the reference at update(s) {', '.join(map(str, seen))} (an "
        "activation or a max crossing its kink in one run and not the other, as the same "
        f"rows show): not counted as failures (at most {factor:g}x the baseline's number)"
    ]


def _gradients_alone_failed(r: UpdateResult) -> bool:
    """Whether some gradient of update `r` failed while its weights passed and its bookkeeping
    held (what a kink crossed in one run leaves)."""
    return any(not d.ok for d in r.grads) and all(d.ok for d in r.weights) and not r.problems


def _excuse(r: UpdateResult, names: set[str], reason: str) -> None:
    """Mark the gradients `names` of update `r` as excused, for `reason`."""
    r.grads[:] = [dataclasses.replace(d, excused=reason) if d.name in names else d for d in r.grads]


def _baseline_jumps(
    results: list[UpdateResult], base: Run, ref: Run
) -> dict[str, tuple[set[int], int]]:
    """Per gradient tensor, where the baseline's own error against the reference jumped (over
    JUMP_OUTLIER times its median over the run) and held JUMP_SHARE in few rows: those updates,
    and the most rows any of them needed."""
    series: dict[str, list[tuple[int, float]]] = {}
    for r in results:
        for d in r.grads:
            if d.noise is not None and math.isfinite(d.noise):
                series.setdefault(d.name, []).append((r.update, d.noise))
    found: dict[str, tuple[set[int], int]] = {}
    for name, points in series.items():
        typical = float(np.median([n for _, n in points]))
        for u, noise in points:
            if typical <= 0 or noise <= JUMP_OUTLIER * typical:
                continue
            gb, gr = base.grads(u), ref.grads(u)
            if gb is None or gr is None or name not in gb or name not in gr:
                continue
            rows = _row_share(gb[name], gr[name], JUMP_OWN_ROWS, JUMP_OWN_SHARE)
            if rows is not None:
                updates, most = found.get(name, (set(), 0))
                found[name] = (updates | {u}, max(most, rows))
    return found


def follow_kink_divergence(
    results: list[UpdateResult], merged: Run, ref: Run, factor: float
) -> list[str]:
    """Widen the updates from a kink on by the kink's own size (module docstring); a note if
    the first failing update is one. `ref`: the reference, or the baseline where there is
    none."""
    first = first_failing(results)
    if first is None:
        return []
    at = results[first]
    failing = [d for d in at.grads if not d.ok]
    moved = [d for d in at.weights if not d.ok]
    prior = results[first - 1] if first else None
    if at.problems or not at.loss_ok or not failing or not _stepped(at, prior, factor):
        return []
    u = at.update
    gm, gr, wm, wr = merged.grads(u), ref.grads(u), merged.weights(u), ref.weights(u)
    before = ref.weights(u - 1) if u > 0 else ref.init_weights()
    if gm is None or gr is None or wm is None or wr is None or before is None:
        if factor * max(d.rel_l2 for d in failing) >= 1 or _whole_model_moved(at):
            return []  # too large to be followed anyway, or not a kink's few rows
        return [
            f"update {u}: gradients failed while the loss and every earlier update stayed within "
            "noise, as when an activation crosses its kink in one run alone; telling a kink "
            "from a bug needs that update's full weights and gradients in both runs (a sketched "
            "run keeps them at its snapshot updates only: snapshot_every)"
        ]
    many = [d for d in failing if _many_rows(gm[d.name])]
    if not many:
        return []
    worst = max(many, key=lambda d: d.ratio)
    rows = _row_share(gm[worst.name], gr[worst.name], KINK_UNITS)
    if rows is None:
        return []
    j_grads = max(_share(gm[d.name], gr[d.name], 0.0) for d in failing)
    if factor * j_grads >= 1:  # a gradient allowed to differ by all of itself is not checked
        return []
    # a gradient off by a share of itself steps off by about that share
    j_weights = max([j_grads, *(_share(wm[d.name], wr[d.name], before[d.name]) for d in moved)])
    if not (math.isfinite(j_grads) and math.isfinite(j_weights)):
        return []
    since = f"update {u - 1}" if u else "the start"
    notes = [
        f"update {u}: the gradient of {worst.name} jumped to {worst.ratio:.3g}x its allowed "
        f"error, {JUMP_SHARE:.0%} of it in {rows} row(s) or column(s), the loss and every "
        "earlier update within noise: an activation crossed its kink in one run and not the "
        "other, and the runs follow neighbouring trajectories from there. From update "
        f"{u} on, each gradient may also differ by {factor:g} x {j_grads:.3g} of its norm and "
        f"each weight by {factor:g} x {j_weights:.3g} of how far it moved since {since} "
        "(the kink's size at that update)"
    ]
    for r in results[first:]:  # the kink's own update read above
        g_ref = gr if r is at else ref.grads(r.update)
        w_ref = wr if r is at else ref.weights(r.update)
        later = None if r is at or g_ref is None else _later_kink(r, merged, g_ref, j_grads)
        if later is not None and factor * later[1] < 1:
            j_grads, j_weights = later[1], max(j_weights, later[1])  # a share steps a share
            notes.append(
                f"update {r.update}: another kink crossed, the gradient of {later[0]} "
                f"{j_grads:.3g} of its norm off, {JUMP_SHARE:.0%} of it in {later[2]} row(s) or "
                f"column(s). From update {r.update} on, each gradient may also differ by "
                f"{factor:g} x {j_grads:.3g} of its norm and each weight by {factor:g} x "
                f"{j_weights:.3g} of how far it moved since {since}"
            )
        if g_ref is not None:
            r.grads[:] = _widened(r.grads, factor * j_grads, g_ref, None)
        if w_ref is not None:
            r.weights[:] = _widened(r.weights, factor * j_weights, w_ref, before)
    return notes


def _stepped(at: UpdateResult, prior: UpdateResult | None, factor: float) -> bool:
    """Whether the step taken with the jumped gradient left the rounding: some weight failed,
    or stood over `factor` times its noise and `factor` times further than the update before
    (a weight that passes by what a drift or a spread allows: under Adam the kink's own row
    stepped 14.9x its noise at model zoo run 7155's update 83 and stayed far within what was
    allowed). A gradient that jumped but was not stepped with (recorded apart from the step)
    leaves the weights in their noise. Without a noise (no reference) any jump counts: the
    fixed tolerances may not see one step."""
    if any(not d.ok for d in at.weights):
        return True
    before = {d.name: _over_noise(d) for d in prior.weights} if prior is not None else {}
    ratios = [(d.name, _over_noise(d)) for d in at.weights]
    if all(ratio is None for _, ratio in ratios):
        return True
    return any(
        ratio is not None and ratio > factor * max(1.0, before.get(name) or 0.0)
        for name, ratio in ratios
    )


def _over_noise(d: TensorDiff) -> float | None:
    """A tensor's error over its noise, where it has one."""
    return d.error / d.noise if d.noise and math.isfinite(d.noise) else None


def _later_kink(
    r: UpdateResult, merged: Run, g_ref: Tensors, followed: float
) -> tuple[str, float, int] | None:
    """A kink crossed at a later update of a followed divergence: the gradient (of a tensor of
    many rows) furthest off as a share of its norm, by more than the size followed so far, that
    error in a few rows or columns. A run whose trajectories parted at one kink crosses more, each a
    jump of its own (model zoo run 753, a Transformer encoder under Adam, K=8: 0.57% at update
    4, then 1.66% in one other row at update 6, and update 9 off by 2.3% in two rows failed at
    1.006x): the size followed is raised to it from there on. A bug is not in a few rows."""
    gm = merged.grads(r.update)
    if gm is None:
        return None
    shares = {
        name: _share(gm[name], g_ref[name], 0.0)
        for name in gm.keys() & g_ref.keys()
        if _many_rows(g_ref[name])
    }
    worst = max(shares, key=lambda name: (shares[name], name), default=None)
    if worst is None or not shares[worst] > followed:
        return None
    rows = _row_share(gm[worst], g_ref[worst], KINK_UNITS)
    return None if rows is None else (worst, shares[worst], rows)


def _whole_model_moved(r: UpdateResult) -> bool:
    """Whether the model's gradient as a whole is scaled or turned (its least-squares ratio
    more than 1% from 1, or its cosine below 0.999): a kink moves a few rows of a tensor, which
    leave the whole nearly as it was. A golden's summaries carry no per-tensor share (NaN),
    and a loss scaled K times was said to be as when an activation crosses its kink."""
    ratio, cosine = r.grad_ratio, r.grad_cosine
    if ratio is None or cosine is None or not (math.isfinite(ratio) and math.isfinite(cosine)):
        return False
    return abs(ratio - 1) > 0.01 or cosine < 0.999


def _widened(
    diffs: list[TensorDiff], share: float, ref: Tensors, before: Tensors | None
) -> list[TensorDiff]:
    """Each diff with share·||ref|| (or share·||ref − before||) added to what it allows."""
    out = []
    for d in diffs:
        if d.name in ref and (before is None or d.name in before):
            r = np.asarray(ref[d.name], dtype=np.float64)
            scale = np.linalg.norm(r if before is None else r - before[d.name])
            d = dataclasses.replace(d, allowed=d.allowed + share * float(scale))
        out.append(d)
    return out


def _share(merged: np.ndarray, ref: np.ndarray, before: np.ndarray | float) -> float:
    """||merged − ref|| / ||ref − before||: an error as a share of the reference's size."""
    r = np.asarray(ref, dtype=np.float64)
    error = float(np.linalg.norm(np.asarray(merged, dtype=np.float64) - r))
    return _safe_div(error, float(np.linalg.norm(r - before)))


def _neighbours_pass(results: list[UpdateResult], update: int) -> bool:
    near = [r for r in results if abs(r.update - update) == 1]
    return all(all(d.ok for d in r.grads) for r in near)


def _many_rows(tensor: np.ndarray) -> bool:
    """Whether a kink's few rows are evidence in this tensor: its error in a few rows of a
    tensor of many (in a tensor of one row, a 0-d temperature or a bias, it always is: a wrong
    loss scale showed as a kink there)."""
    return _rows(tensor) * JUMP_OWN_SHARE >= KINK_UNITS


def _rows(tensor: np.ndarray) -> int:
    """The rows `_row_share` counts: the first axis, or each element of a 1-D tensor."""
    return int(tensor.shape[0]) if np.ndim(tensor) > 1 else int(np.size(tensor))


def _row_share(
    merged: np.ndarray, ref: np.ndarray, most: int | None = None, of_rows: float = JUMP_ROWS
) -> int | None:
    """How many units hold JUMP_SHARE of the error, if they are at most `of_rows` of the units
    (at least one) and at most `most`: rows (the units a weight feeds, its bias's elements), or
    for a weight of two or more axes its columns (axis 1: the units feeding it), the fewer. A
    unit at its kink changes its own row and the next layer's column: a ReLU unit switched on
    by a pre-activation that is the residue of a cancelling sum (a mostly dead net) put a whole
    jump of 17.6x into one column of the output weight, and nowhere else."""
    err = np.asarray(merged, dtype=np.float64) - np.asarray(ref, dtype=np.float64)
    squared = err.reshape(err.shape[0], -1) ** 2 if err.ndim > 1 else err.reshape(-1, 1) ** 2
    energies = [squared.sum(axis=1)]
    if err.ndim > 1:
        energies.append((err.reshape(err.shape[0], err.shape[1], -1) ** 2).sum(axis=(0, 2)))
    counts = []
    for energy in energies:
        limit = max(1, int(of_rows * energy.shape[0]))
        limit = limit if most is None else min(limit, most)
        found = fewest_holding(energy, JUMP_SHARE, limit)
        if found is not None:
            counts.append(len(found))
    return min(counts) if counts else None


def fewest_holding(energy: np.ndarray, share: float, most: int) -> np.ndarray | None:
    """The indices of the fewest entries of `energy` (squared errors of rows or elements) that
    hold `share` of its sum, if they are at most `most`; None if more, or if the sum is 0 or not
    finite."""
    total = float(energy.sum())
    if not np.isfinite(total) or total <= 0:
        return None
    order = np.argsort(energy, kind="stable")[::-1]
    needed = int(np.searchsorted(np.cumsum(energy[order]), share * total)) + 1
    return order[:needed] if needed <= most else None


def first_failing(results: list[UpdateResult]) -> int | None:
    """The index of the first update that fails, if any."""
    return next((i for i, r in enumerate(results) if not r.ok), None)
