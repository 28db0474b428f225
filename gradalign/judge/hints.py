"""What an `unexplained` failure's evidence still says: where no signature names a cause, the
facts that narrow it down (a loss apart before any step; micro-batches of unequal sizes)."""

from __future__ import annotations

import numpy as np

from ..runs.logs.records import LIGHTNING_CSV, LIGHTNING_LAST_MICRO, UNNUMBERED
from ..runs.logs.smooth import LAG1_MAX, difference_lag1
from .results import NOT_CHECKED, PASS, Comparison, UpdateResult
from .signatures.common import losses_given
from .signatures.decisive import forward_parted, steps_seen

FLOAT64_RERUN = (
    "to tell the two apart, record the merged run in float64 as well and compare the float64 "
    "runs (`gradalign compare REFERENCE MERGED64`): if they pass, the trainings are the same "
    "and only the rounding differs; if they fail, the training differs"
)


def unexplained_hints(c: Comparison, r: UpdateResult | None) -> tuple[list[str], list[str]]:
    """Clauses for the message and for the fix (each possibly empty)."""
    said, fixes = [], []
    logs = c.merged.kind == "log" or c.baseline.kind == "log"
    # a log of one line per update prints the window's mean: its steps are unknown
    whole = c.merged.kind == "log" and c.merged.accum_steps <= c.baseline.accum_steps
    lightning = whole and c.merged.config.get("written_by") == LIGHTNING_CSV
    failing = r is not None and not r.loss_ok  # the loss failed at the first failing update
    missing = c.merged.config.get("missing_cards") if c.merged.kind == "log" and failing else None
    if missing:
        said.append(f"the merged logs are not the whole run, which comes first: {missing}")
    if lightning and failing:
        said.append(f"if the merged run accumulated, {LIGHTNING_LAST_MICRO}")
    # records numbered by position: each may be a mean over the N updates since the last
    numbered = any(UNNUMBERED in note for run in (c.baseline, c.merged) for note in run.notes)
    if failing and r.update == 0:
        if whole and numbered:
            said.append(
                "the logs' records print no step and were numbered one an update: where they "
                "were printed every N updates (the Trainer's logging_steps), each is a mean "
                "over N updates, and record 0's gap may come from steps after the first; "
                "print every update (logging_steps=1) to judge each"
            )
        elif whole:
            said.append(
                "update 0's losses come from the same initial weights, so this gap is in what "
                "each loop computed or printed"
            )

        elif c.merged.kind == "log" or not steps_seen(c):  # a step inside is unseen
            unseen = (
                "a log of losses does not show the steps"
                if c.merged.kind == "log"
                else "these runs record neither the weights at each micro-step (`micro/state`) "
                "nor their optimizer steps (`update/optimizer_steps`)"
            )
            said.append(
                "update 0's losses come from the initial weights unless the merged loop "
                "stepped inside the window, so this gap is in what each loop computed or "
                "printed, or in such a step (an optimizer stepped at every micro-batch: the "
                f"micro-batches after it ran on weights already stepped; {unseen})"
            )
        else:
            said.append(
                "update 0's loss is computed before any step, from the initial weights, so "
                "this gap is not in training but in what each loop computed or printed"
            )
        if logs and not lightning:
            said[-1] += (
                ": a smoothed loss (an exponential moving average, or a running mean over a "
                "window of steps, which the merged loop advances K times per update), micro-"
                "batches of unequal sizes averaged without their counts, other samples or "
                "another seed, or another loss reduction"
            )
            if whole:
                said[-1] += (
                    "; or each merged line prints one micro-batch's loss, not the window's mean "
                    "(nanoGPT prints its window's last, `loss.item() * gradient_accumulation_"
                    "steps`), which scatters about the baseline's batch mean; or an optimizer "
                    "step inside the window, where a line prints the whole window's mean (its "
                    "later micro-batches then ran on weights already stepped; such a log does "
                    "not say how often the loop stepped)"
                )
            fixes.append(
                "print each micro-batch's own loss, not a smoothed one, from both loops seeded "
                "alike on the same data; where micro-batches differ in size, print each one's "
                "count on its line (`bsz 7`, `num_items: 120`): the window mean is then "
                "weighted by it"
                + ("; a loop printing one line per update prints its window's mean" * whole)
            )
    scattered = _scattered(c) if logs and whole and not lightning else None
    if scattered:
        said.append(scattered)
        fixes.append(
            "print each update's window mean on the merged line (the mean of its K micro-"
            "batches' losses, weighted by their sizes), or each micro-batch's own loss on a line "
            "of its own, read with -k K; or record both loops with gradalign.Recorder"
        )
    summed = _summed(r) if whole and failing and r.update == 0 and not numbered else None
    if summed:  # before the clauses that guess: this one reads a ratio
        said.insert(len(said) - 1 if said else 0, summed)
        fixes.insert(
            0,
            "divide each micro-batch's loss by K before adding it to the window's (and before "
            "its backward): the window's loss is the mean of its micro-batches'",
        )
    parted = _parted_after_a_step(c, r) if logs and not lightning and not scattered else None
    if parted:
        said.append(parted)
        fixes.append(
            "print each update's gradient norm before clipping in both logs (`grad_norm: ...`, "
            "as transformers' and PaddleNLP's trainers do): a K-times gradient is then named "
            "`loss-scale`; or record both loops with gradalign.Recorder, which names the cause"
        )
    smoothed = _smoothed(c) if logs and failing else None
    if smoothed:
        said.append(smoothed)
        if not fixes:
            fixes.append("print each micro-batch's own loss, not a smoothed one")
    counts = _uneven_counts(c)
    if r is not None and r.update > 0 and losses_given(c.merged) and forward_parted(c, r):
        said.append(
            f"the losses part at update {r.update} with the gradients, every check of update "
            f"{r.update - 1} within noise: the forward computed otherwise from weights the runs "
            "shared, as where a choice made per input (a token routed to another expert, an "
            "argmax, a tie) went one way in one run and the other way in the other; a "
            "reweighting or a scale of the micro-batches moves the gradients of the update it "
            "starts at, and the losses only from the next"
        )
        counts = None  # no reweighting of the micro-batches: not the clause for one
        if c.reference is not None:
            fixes.append(FLOAT64_RERUN)
    if counts:
        said.append(
            f"the merged micro-batches differ in size ({counts}): a loop that divides each "
            "micro loss by K instead of weighting it by its share of the batch's samples "
            "trains otherwise than the baseline"
        )
    if missing:
        fixes.insert(0, "give every card's log, card 0 first, then judge again")
    run_dirs = c.baseline.kind == c.merged.kind == "run-dir"  # not a log's, not a golden's
    unrecorded = _unrecorded(c) if run_dirs else []
    if unrecorded:
        fixes.append(
            f"record what these runs lack and the judge reads to name a cause: "
            f"{', '.join(unrecorded)} (docs/FORMAT.md)"
        )
    return said, fixes


_READ = (  # a run directory's optional fields that most diagnoses read, as FORMAT.md names them
    ("gradients (`grads/`)", lambda run: run.load_grads is not None),
    ("the learning rate (`update/lr`)", lambda run: run.lr is not None),
    ("optimizer steps (`update/optimizer_steps`)", lambda run: run.optimizer_steps is not None),
    ("the weights at each micro-step (`micro/state`)", lambda run: run.micro_state is not None),
    ("sample digests (`micro/data`)", lambda run: run.micro_data is not None),
)


def _unrecorded(c: Comparison) -> list[str]:
    """The fields of `_READ` that either run lacks."""
    return [name for name, has in _READ if not (has(c.baseline) and has(c.merged))]


def _parted_after_a_step(c: Comparison, r: UpdateResult | None) -> str | None:
    """A clause where logs of losses alone (no gradient, weight or norm printed) agree at
    update 0, before any step, and part later: the steps differed, and losses cannot say how."""
    status = {check.name.split(" (")[0]: check.status for check in c.checks}
    tensors = ("weights", "gradients", "norms before clipping")
    alone = all(status.get(name, NOT_CHECKED) == NOT_CHECKED for name in tensors)
    if not alone or r is None or r.update < 1 or r.loss_ok or not c.results[0].loss_ok:
        return None
    lr = "the printed learning rates agree; " if status.get("learning rate") == PASS else ""
    first = next((u.update for u in c.results if u.loss_judged), 0)
    if first >= r.update:  # the first loss both printed parts: no step was taken before it
        return (
            f"update {r.update} is the first whose loss both logs print (both runs' loss "
            "scalers skipped the updates before it, which stepped nothing), so it ran from the "
            "initial weights: the gap is in what each loop computed or printed"
        )
    agree = (  # a loss both runs' scalers skipped unprinted is no agreement before any step
        "at update 0, before any step"
        if first == 0
        else f"at update {first}, the first both printed (both runs' scalers skipped the "
        "updates before it)"
    )
    return (
        f"the losses agree {agree}, and part at update {r.update}: the "
        f"steps differed, and losses alone cannot say how ({lr}a gradient K times too large, "
        "from micro-batch losses not divided by K or gradients summed over the window, moves "
        "the weights as an lr K times larger does; so do another optimizer setting, a "
        "clip, or other samples from this update on)"
    )


SUMMED = 0.01  # a merged loss this near a whole multiple (2 or more) of the baseline's


def _summed(r: UpdateResult) -> str | None:
    """A clause where a merged log's update-0 loss is a whole multiple n >= 2 of the baseline's
    (within SUMMED): its line prints n micro-batch losses summed, not their mean. A cold probe's
    PaddleNLP log (`tr_loss` adding each micro-batch's loss undivided) stood 4.00 times the
    baseline's at update 0 and was `unexplained` without a word of it."""
    if not r.base_loss or not np.isfinite(r.merged_loss / r.base_loss):
        return None
    q = r.merged_loss / r.base_loss
    n = round(q)
    if n < 2 or abs(q / n - 1) > SUMMED:
        return None
    return (
        f"the merged loss at update 0 is {q:.4g} times the baseline's: each merged line likely "
        f"prints {n} micro-batch losses summed, not their mean (each added undivided, as "
        "`tr_loss += loss`); backpropagated so, the gradient is as many times too large, and "
        "the steps after it differ as an lr that many times larger would"
    )


SCATTERED = 8  # judged updates, at least, whose losses scatter about the baseline's
SCATTER_SIDE = 0.25  # the share above and the share below the baseline's, each at least


def _scattered(c: Comparison) -> str | None:
    """A clause where a merged log of one line per update prints losses that scatter about the
    baseline's, above and below it from the first updates, with no lean (their mean within
    half their spread): one micro-batch's loss a line, not the window's mean. A cold probe's
    timm log (`--grad-accum-steps 4`: its `Loss:` the window's last micro-batch's) agreed at
    update 0 to its 3 printed digits and was told "the steps differed" from update 1."""
    gaps = [r.merged_loss - r.base_loss for r in c.results if r.loss_judged]
    gaps = np.array([g for g in gaps if np.isfinite(g)])
    if gaps.size < SCATTERED or not np.any(gaps):
        return None
    above, below = np.mean(gaps > 0), np.mean(gaps < 0)
    if min(above, below) < SCATTER_SIDE or abs(gaps.mean()) > 0.5 * gaps.std():
        return None
    shown = f"{int(np.sum(gaps > 0))} above and {int(np.sum(gaps < 0))} below"
    return (
        f"the merged losses scatter about the baseline's from the first updates, {shown}, "
        "leaning neither way: each merged line likely "
        "prints one micro-batch's loss, not the window's mean (nanoGPT's `loss.item() * "
        "gradient_accumulation_steps`; timm's train.py `Loss:` under --grad-accum-steps, its "
        "window's last micro-batch's), or other samples at each update; steps that differed "
        "part the losses further as training goes on"
    )


def _smoothed(c: Comparison) -> str | None:
    """A clause where the logs' printed losses move in correlated steps, as a smoothed loss's do
    (`smooth.difference_lag1` above `LAG1_MAX`), with the correlations."""
    lags = [difference_lag1(run.micro_loss) for run in (c.baseline, c.merged)]
    if not any(lag is not None and lag > LAG1_MAX for lag in lags):
        return None
    shown = " and ".join("unknown" if lag is None else f"{lag:+.2f}" for lag in lags)
    return (
        "the printed losses move in correlated steps, as a smoothed loss does (the lag-1 "
        f"correlation of their differences is {shown} in the baseline and merged logs; a step's "
        "own loss, whose batch noise enters two differences, gives about -0.5)"
    )


def _uneven_counts(c: Comparison) -> str | None:
    """The sizes of the first window whose micro-batches differ in size, e.g. '8, 8, 7, 7'."""
    sizes = c.merged.micro_samples
    if sizes is None or c.merged.accum_steps < 2:
        return None
    for u in range(c.merged.updates):
        w = c.merged.window(u)
        window = np.asarray(sizes[w.start : w.stop])
        if window.size > 1 and len(set(window.tolist())) > 1:
            return ", ".join(str(int(n)) for n in window[:8]) + (", ..." if window.size > 8 else "")
    return None
