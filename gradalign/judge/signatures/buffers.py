"""State the model writes while it computes (buffers other than BatchNorm's): written at every
micro-step, so K times per update in the merged run, or on W ranks from each rank's own rows."""

from __future__ import annotations

from ..distributed import listed
from ..results import Comparison, Diagnosis
from ..windows import written_in_forward
from .common import finite, window


def buffers_in_forward(c: Comparison) -> Diagnosis | None:
    """Buffers the model writes while it computes (a running mean of its inputs, spectral
    norm's power-iteration vectors), other than BatchNorm's: once per update in the baseline,
    at each of the K micro-steps in the merged run, each time from a micro-batch. Read only
    where no other cause fits (diagnose's last resort): a wrong gradient is named by its shape."""
    # K > 1: written between micro-steps (at a window's start alone: once per update, as the
    # baseline does); one micro-step per update on W ranks: written at all
    written = written_in_forward(c.merged, "buffer", between=window(c) > 1)
    differ = sorted(
        {d.name for r in c.results for d in r.weights if not d.ok and d.name in written}
    )
    if not differ:
        return None
    first = next(r for r in c.results if any(not d.ok and d.name in differ for d in r.weights))
    worst = max((d for d in first.weights if d.name in differ), key=lambda d: d.ratio)
    grads = any(not d.ok for r in c.results[: first.update + 1] for d in r.grads)
    evidence = {
        "buffers_written_in_forward": differ,
        "first_update": first.update,
        "worst": {"buffer": worst.name, "over_allowed": finite(worst.ratio)},
        "gradients_differ": grads,
    }
    also = ", and the gradients computed with them differ too" if grads else ""
    them = "them" if len(differ) > 1 else "it"
    how, fix = (
        (  # one micro-step per update on W ranks: each rank's forward sees its own rows
            f"each rank updates {them} from its own B/W rows, the baseline from the batch of B",
            "compute such statistics over the rows of all ranks (all-reduce them before they "
            "are applied, as SyncBatchNorm does), or keep them out of the forward",
        )
        if window(c) == 1 and c.merged.world_size > 1
        else (
            f"the merged run updates {them} K times per update, from a micro-batch of "
            + (
                "B/K"
                if c.merged.world_size == 1
                else f"B/(W·K) on each of W={c.merged.world_size} ranks"
            )
            + ", the baseline once per update from the batch of B",
            "update such state once per window from the whole window (gather the statistics "
            "over the K micro-batches and apply them at the last one), or leave it unchanged "
            "during the first K-1 micro-steps; a spectral norm's power iteration runs at every "
            "forward, so the merged run takes K iterations per update (run it once per window, "
            "or accept the difference)",
        )
    )
    return Diagnosis(
        "buffers-in-forward",
        f"the model's buffers {listed(differ, 3)} are written at every micro-step (in its "
        "forward, or by the loop between micro-steps: an average of the weights kept in "
        f"buffers): {how}, so the model's state differs from update {first.update} "
        f"({worst.name} at {worst.ratio:.3g}x its allowed error){also}",
        evidence,
        fix,
    )
