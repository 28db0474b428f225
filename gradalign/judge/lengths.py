"""Why two runs hold other numbers of updates, said in the refusal of their lengths: a window
lost or gained at the end of the data, windows run across an epoch's end, a log read with the
wrong K or printed by several processes, or a run that stopped early (killed, its log cut)."""

from __future__ import annotations

import numpy as np

from ..runs.logs.records import LIGHTNING_CSV, LIGHTNING_LAST_MICRO
from ..runs.model import Run


def length_hint(base: Run, other: Run, other_name: str = "merged") -> str:
    """The parenthesis the refusal ends with, or "": runs that read other numbers of samples
    lost or gained a window at the end of the data; a log whose step lines are as many as the
    baseline's updates prints one per update; one that prints each step on N lines, N times as
    many updates, may be N processes' lines; else the shorter run stopped early."""
    times = int(other.config.get("lines_per_step", 1)) if other.kind == "log" else 1
    if times > 1 and other.updates == base.updates * times:
        return (
            f" (its log prints each step on {times} lines, read as {times} micro-steps each: if "
            f"{times} processes print into one log, give one log per card)"
        )
    k = other.accum_steps
    if other.kind != "log" and k > 1 and other.updates == base.updates * k:
        return (
            f" (the {other_name} run holds K={k} times the baseline's updates: a limit on its "
            "steps counted in micro-steps, as max_steps=N*K, runs K times as long; give both "
            "runs the same number of updates)"
        )
    if base.micro_samples is not None and other.micro_samples is not None:
        read = int(base.micro_samples.sum()), int(other.micro_samples.sum())
        mine, theirs = base.window_sums(base.micro_samples), other.window_sums(other.micro_samples)
        n, longer = min(len(mine), len(theirs)), mine if len(mine) > len(theirs) else theirs
        if np.array_equal(mine[:n], theirs[:n]) and longer[-1] == longer.max():
            return _stopped_early(base, other, other_name)  # alike, fewer, no short last one
        if other.accum_steps > 1 and theirs.size and mine.size:
            micro = int(other.micro_samples[0])  # over its ranks, as the windows' sums
            if micro == mine[0] and theirs[0] == other.accum_steps * mine[0]:
                k = other.accum_steps
                if other.kind == "log" and other.updates * k == base.updates:
                    return (  # the same counts as a log of one line per update read with -k K
                        f" (its log holds {base.updates} step lines of {micro} rows each, as "
                        "many as the baseline's updates and as large: if it prints one line "
                        f"per update, not one per micro-step, give it -k 1; if it prints each "
                        f"micro-step, each micro-batch holds the baseline's whole batch: the "
                        f"batch per micro-step was not divided by K={k}; give each micro-step "
                        "the batch / K)"
                    )
                return (
                    f" (each micro-batch of the {other_name} run holds {micro} rows, the "
                    f"baseline's whole batch: the batch per micro-step was not divided by "
                    f"K={other.accum_steps}, so each window holds {int(theirs[0])} rows and the "
                    "data runs out sooner; give each micro-step the batch / K)"
                )
        if read[0] != read[1]:
            return (
                f" (the baseline read {read[0]} samples, the other {read[1]}: a "
                "window that crosses the end of the data without a step there is dropped or "
                "runs on into the next pass; step at the end of each pass over the data, as "
                "accelerate's sync_with_dataloader=True does)"
            )
        crossed = _window_crossing(mine, theirs, read[0])
        if crossed:
            return crossed
    lines = other.updates * other.accum_steps
    logs = other.kind == "log" and base.kind == "log" and times == 1
    if logs and lines and base.updates > lines and not base.updates % lines:
        return (  # a merged log's micro-steps are more lines than the baseline's updates
            f" (the baseline's log holds {base.updates} step lines, {base.updates // lines} "
            f"times the merged log's {lines}: given in the other order? the baseline comes "
            "first: `gradalign compare BASELINE MERGED -k K`)"
        )
    if other.kind == "log" and times == 1 and base.updates and not lines % base.updates:
        fits = lines // base.updates
        if 1 < fits < other.accum_steps:  # read with a K larger than its lines hold
            per_card = (
                f"; -k is each card's own count: {other.accum_steps} micro-batches an update "
                f"over {len(other.cards)} cards are {fits} a card"
                if len(other.cards) > 1 and fits * len(other.cards) == other.accum_steps
                else ""
            )
            return (
                f" (its log holds {lines} step lines, {fits} per baseline update: read it with "
                f"-k {fits}{per_card})"
            )
    ratio, rest = divmod(other.updates, base.updates) if base.updates else (0, 1)
    if other.kind == "log" and times == 1 and not rest and ratio > 1:
        return (
            f" (its log holds {lines} step lines, {ratio} times the baseline's updates: if it "
            f"prints one line per micro-step, read it with -k {other.accum_steps * ratio})"
        )
    if other.kind != "log" or other.accum_steps < 2 or lines != base.updates:
        return _stopped_early(base, other, other_name)
    if other.config.get("written_by") == LIGHTNING_CSV:  # epoch and step columns: most likely
        return (
            f" (its {lines} rows are as many as the baseline's updates: {LIGHTNING_LAST_MICRO}; "
            "a table another writer printed with one row per update, each the window's mean, "
            "is read with -k 1)"
        )
    return (
        f" (its log holds {lines} step lines, as many as the baseline's updates: if it prints "
        "one line per update, not one per micro-step, give it -k 1)"
    )


def _stopped_early(base: Run, other: Run, other_name: str) -> str:
    """A run that holds fewer updates than the other, nothing else told: one stopped early (its
    process killed, a log cut while it was written); say which, and what both hold."""
    other_name = "merged run" if other_name == "merged" else other_name
    shorter, name = (base, "baseline") if base.updates < other.updates else (other, other_name)
    if not shorter.updates:
        return ""
    what = "its log was cut, or its run" if shorter.kind == "log" else "its run"
    cut = ", or cut the longer log to those updates," if "log" in (base.kind, other.kind) else ""
    return (
        f" (the {name} stopped early? {what} ended after update {shorter.updates - 1}; both hold "
        f"updates 0 to {shorter.updates - 1}: record the runs to the same length{cut} to judge "
        "them)"
    )


def _window_crossing(mine: np.ndarray, theirs: np.ndarray, read: int) -> str:
    """Both runs read the same `read` samples, but a window of the other run holds another
    number of them (`theirs`, per window) than the baseline's batch at that update (`mine`): its
    windows ran across an epoch's end."""
    n = min(len(mine), len(theirs))
    apart = [i for i in range(n) if mine[i] != theirs[i]]
    if not apart:
        return ""
    i = apart[0]
    return (
        f" (both read {read} samples, but the other run's window "
        f"{i} holds {int(theirs[i])} of them and the baseline's batch {int(mine[i])}: a window "
        "that runs across an epoch's end, its micro-batches counted over the whole run instead "
        "of per epoch, mixes two passes; step at the end of each pass over the data)"
    )
