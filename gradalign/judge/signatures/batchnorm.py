"""`batchnorm`: the model normalized with batch statistics, each micro-batch's own in the merged
run, or in one run only (the other held fixed statistics, as in eval mode)."""

from __future__ import annotations

import numpy as np

from ...runs.model import Run
from ..results import Comparison, Diagnosis
from .common import exact_of
from .decisive import update0_gap


def batchnorm(c: Comparison) -> Diagnosis | None:
    """BatchNorm that normalized with batch statistics in either run: each micro-batch's own in
    the merged run; or in one run only, the other's held fixed as in eval mode (the runs put it
    in different modes)."""
    base_layers, merged_layers = _batch_statistics(c.baseline), _batch_statistics(c.merged)
    layers = base_layers or merged_layers
    if not layers:
        return None
    evidence, differs = update0_gap(c)
    buffers = [d for d in c.results[0].weights if d.name.endswith("num_batches_tracked")]
    w0b, w0m = exact_of(c, c.baseline, "weights", 0), exact_of(c, c.merged, "weights", 0)
    if buffers and w0b and w0m and buffers[0].name in w0b and buffers[0].name in w0m:
        name = buffers[0].name
        evidence["num_batches_tracked_after_update_0"] = {
            "merged": int(np.asarray(w0m[name]).ravel()[0]),
            "baseline": int(np.asarray(w0b[name]).ravel()[0]),
        }
    stats = [d for d in c.results[0].weights if d.name.endswith("running_mean") and not d.ok]
    if not differs and not stats:
        return None
    evidence["batchnorm_layers"] = list(layers)
    if bool(base_layers) != bool(merged_layers):
        return _modes_apart("merged" if merged_layers else "baseline", layers, evidence, c)
    return Diagnosis(
        "batchnorm",
        f"the model has BatchNorm ({', '.join(layers)}): each micro-batch of B/K is normalized "
        "with its own statistics, so the forward pass already differs from the batch of B "
        "(loss at update 0 differs by "
        f"{c.results[0].loss_diff:.3g}) and the running statistics are updated K times per update",
        evidence,
        "use GroupNorm or LayerNorm (no batch statistics), or keep BatchNorm in eval mode with "
        "fixed statistics, or accumulate the statistics over the whole window (SyncBatchNorm-"
        "style) before normalizing",
    )


def _modes_apart(moved: str, layers: list[str], evidence: dict, c: Comparison) -> Diagnosis:
    """BatchNorm in train mode in one run (`moved`) and in eval mode in the other."""
    other = "baseline" if moved == "merged" else "merged"
    evidence["batch_statistics_in"] = moved
    return Diagnosis(
        "batchnorm",
        f"the {moved} run's BatchNorm layers ({', '.join(layers)}) normalized with batch "
        "statistics (their running statistics moved through update 0) where the "
        f"{other} run's kept the statistics they started with, as in eval mode: the runs put "
        f"BatchNorm in different modes (loss at update 0 differs by {c.results[0].loss_diff:.3g})",
        evidence,
        "put BatchNorm in the same mode in both runs: call .eval() on the layers meant to keep "
        "fixed statistics (a frozen backbone's) after every model.train(), in both loops",
    )


def _batch_statistics(run: Run) -> list[str]:
    """The run's BatchNorm layers that may have normalized with batch statistics: all but those
    whose recorded buffers (running statistics, batch counter) stayed as they started through
    the first update, as in eval mode, where a layer normalizes with fixed statistics."""
    layers = run.model_facts.get("batchnorm") or []
    if run.init_state is None or run.update_state is None or not run.updates:
        return list(layers)
    moved = run.init_state != run.update_state[0]
    buffers = [(t.name, m) for t, m in zip(run.tensors, moved, strict=True) if t.kind == "buffer"]

    def frozen(layer: str) -> bool:
        own = [m for name, m in buffers if name.startswith(f"{layer}.")]
        return bool(own) and not any(own)

    return [layer for layer in layers if not frozen(layer)]
