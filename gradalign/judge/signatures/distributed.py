"""Data-parallel signatures: read what each rank recorded (judge/distributed.py) and the shape of
the gradient, and name the data-parallel bug: ranks that are no longer replicas (or kept alike by
a broadcast while each stepped with its own gradient), a scheduler stepped per rank, ranks
reading the same rows, BatchNorm statistics per rank; a loss reduced once too often over the
ranks and items normalized per rank are read in the gradient's shape (signatures/dp_shapes.py)."""

from __future__ import annotations

import numpy as np

from ..checks import sample_mismatches
from ..clip_norms import ranks_apart
from ..distributed import RankFacts, listed
from ..results import Comparison, Diagnosis
from .clipping import failed_before_clip
from .common import (
    finite,
    lossy_hooks,
    on_ranks,
    relative_error,
    same_direction,
    window,
)
from .decisive import update0_gap
from .dp_shapes import dp_loss_reduction, dp_token_normalization
from .learning_rate import SPLIT_BATCHES, lined_up_lrs, schedule_offset

FIRST = ("window-bookkeeping", "step-in-window", "micro-batch-missing")  # explain parted replicas
SUBSUMED = {"scheduler-per-rank": "lr-schedule", "dp-sampler": "data-order"}


def _facts(c: Comparison) -> RankFacts | None:
    return c.ranks


def replicas_diverged(c: Comparison) -> Diagnosis | None:
    facts = _facts(c)
    if facts is None:
        return None
    if facts.agree:
        return _unreduced(c, facts)
    first = facts.first_update()
    params = [t.name for t in c.merged.tensors if t.kind == "param"]
    evidence: dict = {"first_update": first, "world_size": facts.world}
    if facts.init:
        rank, names = next(iter(sorted(facts.init.items())))
        evidence.update(cause="initial weights", rank=rank, tensors=names)
        message = (
            f"the ranks did not start from the same weights: rank {rank}'s initial {listed(names)} "
            "differ from rank 0's, so every update moves other weights on each rank"
        )
        fix = (
            "build the model identically on every rank (same seed) and load checkpoints before "
            "wrapping it in DistributedDataParallel, which broadcasts rank 0's weights only when "
            "it is constructed"
        )
    elif first in facts.grads:
        rank, names = next(iter(sorted(facts.grads[first].items())))
        evidence.update(cause="gradient", rank=rank, tensors=names, parameters=len(params))
        clipped, ranks = on_ranks(c, "update/clip_calls", first)
        around = _bypassed(c, first)
        if clipped:  # some ranks clipped: the gradient changed after the all-reduce there
            evidence["clipped_on"] = ranks["ranks"]
            why = (
                f"(a clip ran{clipped} only, after the all-reduce: the ranks stepped with "
                "gradients clipped otherwise)"
            )
        elif around:
            count, where, on = around
            evidence.update(bypassed_forwards=count, **on)
            why = (
                f"because {count} forward{'s' if count > 1 else ''} of window {first}{where} "
                "went around DistributedDataParallel (the model inside it called directly, "
                "`ddp.module(x)` or a method of the model): DDP all-reduces the gradients of "
                "the forwards it runs, and no others"
            )
        elif len(names) == len(params):
            why = (
                f"in every parameter: window {first}'s gradients were not all-reduced (DDP's "
                "sync flag set after the forward, or no_sync() around the last micro-step), or "
                "changed on some ranks after it (a hook or a scale that not every rank applies)"
            )
        else:
            why = (
                f"in {listed(names)} only ({len(names)} of {len(params)} parameters): these were "
                "never synced (parameters DDP ignores or finds unused; find_unused_parameters with "
                "no_sync before torch 2.4, pytorch #69031)"
            )
        message = f"at update {first} rank {rank} stepped with another gradient than rank 0 {why}"
        fix = (
            "clip on every rank alike (clip_grad_norm_ outside `if rank == 0:`): after the "
            "all-reduce every rank holds the same gradient and must change it the same way"
            if clipped
            else "run every training forward through the DistributedDataParallel wrapper, "
            "ddp(x) rather than ddp.module(x); a method of the model other than forward() is "
            "reached through DDP only by making it the forward"
            if around
            else "keep no_sync() around the first K-1 micro-steps only, forward and backward "
            "included: DDP reads the sync flag in forward(); let the last micro-step's forward "
            "and backward run synced; make every parameter take part in every synced backward; "
            "change the gradient after the all-reduce on every rank alike, or on none"
        )
    else:
        table = facts.weights.get(first) or {}
        rank, names = next(iter(sorted(table.items())), (None, []))
        steps = facts.steps.get(first, {})
        evidence.update(cause="optimizer step", rank=rank, tensors=names, steps=steps)
        message = (
            f"after update {first} the ranks hold other weights although they stepped with the "
            f"same gradients{f' ({listed(names)})' if names else ''}: the optimizer step differs "
            f"across the ranks{': ' + next(iter(steps.values())) if steps else ''}"
        )
        fix = "give every rank the same optimizer, learning rate schedule and step calls"
    return Diagnosis("replicas-diverged", message, evidence, fix)


def _unreduced(c: Comparison, facts: RankFacts) -> Diagnosis | None:
    """Replicas kept alike by a broadcast of rank 0's weights after each step, where each rank
    stepped with a gradient of its own in every parameter and no clip ran on some ranks alone,
    and the gradients fail there, turned (rank 0's rows alone point elsewhere; a loop that
    reduces to rank 0 and broadcasts leaves the same fingerprints, and its scale bug is a
    scale): the gradients were never reduced, and rank 0's own B/(W·K) rows trained the model
    (probe runs on 2 ranks: a ZeroRedundancyOptimizer without DDP, and a loop stepping each
    rank and broadcasting rank 0's weights, were named `cross-sample-loss`, cosine 0.758)."""
    if not facts.overwritten_grads:
        return None
    params = [t.name for t in c.merged.tensors if t.kind == "param"]
    u = min(facts.overwritten_grads)  # the first update a rank stepped with its own gradient
    rank, names = min(facts.overwritten_grads[u].items())
    if len(names) < len(params) or on_ranks(c, "update/clip_calls", u)[0]:
        return None
    r = c.results[u] if u < len(c.results) else None
    if r is None or all(d.ok for d in r.grads):
        return None
    if r.grad_cosine is None or r.grad_cosine >= same_direction(c, r):
        return None  # a scale of the gradient (a loss not divided by K): not one rank's rows
    return Diagnosis(
        "replicas-diverged",
        f"at update {u} rank {rank} stepped with another gradient than rank 0 in every "
        "parameter, and its weights were then made rank 0's (a broadcast from rank 0): the "
        "gradients were not all-reduced before the step, so each rank stepped with the "
        "gradient of its own B/(W·K) rows and rank 0's alone was kept (a "
        "ZeroRedundancyOptimizer without DistributedDataParallel, or a loop that steps "
        "each rank and then broadcasts)",
        {
            "first_update": u,
            "world_size": facts.world,
            "cause": "gradients not reduced",
            "rank": rank,
            "parameters": len(params),
        },
        "all-reduce the gradients before the step: wrap the model in "
        "DistributedDataParallel (ZeroRedundancyOptimizer shards the optimizer's state, "
        "not the gradients' reduction), or all_reduce each gradient and divide it by W "
        "before optimizer.step()",
    )


def _bypassed(c: Comparison, update: int) -> tuple[int, str, dict] | None:
    """Forwards of window `update` that went around DistributedDataParallel (the largest count
    of any rank), with the ranks named where only some did so; None where none did."""
    counts = c.merged.bypassed_forwards
    if counts is None or counts[update] <= 0:
        return None
    where, ranks = on_ranks(c, "update/bypassed_forwards", update)
    return int(counts[update]), where, ranks


def scheduler_per_rank(c: Comparison) -> Diagnosis | None:
    """lr[t] equals the baseline's lr[W*t]: the scheduler stepped once per rank per update."""
    world = c.merged.world_size
    bad = [r for r in c.results if any(k == "lr" for k, _ in r.problems)]
    if world < 2 or not bad or c.baseline.lr is None or c.merged.lr is None:
        return None
    found = schedule_offset(*lined_up_lrs(c), (world,))  # where runs of two lengths line up
    advance = None if found is None else found[0]
    if advance != world or advance == window(c):  # W = K: lr-schedule names it
        return None
    i = bad[0].update
    return Diagnosis(
        "scheduler-per-rank",
        f"the learning-rate schedule advanced {world} steps per update, once per rank (W="
        f"{world}): merged lr at update t equals the baseline's at update {world}·t (update {i}: "
        f"{c.merged.lr[i]:.6g} vs {c.baseline.lr[i]:.6g})",
        {
            "first_update": i,
            "schedule_steps_per_update": advance,
            "world_size": world,
            "merged_lr": finite(float(c.merged.lr[i])),
            "baseline_lr": finite(float(c.baseline.lr[i])),
        },
        "step the scheduler once per optimizer step on each rank, not once per rank (accelerate "
        "steps a prepared scheduler once per process unless the batches are split: "
        f"{SPLIT_BATCHES}, whose loader then holds the batch of all processes (accelerate "
        "1.15 ignores `split_batches=` given to Accelerator itself); or "
        "`step_scheduler_with_optimizer=False` and step it yourself; or build the schedule "
        "for updates x processes)",
    )


def dp_sampler(c: Comparison) -> Diagnosis | None:
    """Windows with other samples, where ranks read identical micro-batches."""
    bad = sample_mismatches(c.baseline, c.merged)
    ranks = c.merged.ranks
    if len(ranks) < 2 or bad is None or not bad.size or ranks[0].micro_data is None:
        return None
    data = np.stack([rank.micro_data for rank in ranks])  # [W, M]
    duplicated = [m for m in range(data.shape[1]) if len(set(data[:, m].tolist())) < data.shape[0]]
    if not duplicated:
        return None
    m = duplicated[0]
    same = [r for r in range(len(ranks)) if data[r, m] == data[0, m]]
    return Diagnosis(
        "dp-sampler",
        f"ranks read the same samples: at {len(duplicated)} of {data.shape[1]} micro-steps two "
        f"ranks' micro-batches are identical (first micro-step {m}: ranks "
        f"{', '.join(map(str, same))}), so {bad.size} of {c.updates} windows hold duplicated "
        "samples and miss others of their baseline batch",
        {
            "micro_steps_with_duplicates": len(duplicated),
            "first_micro_step": m,
            "ranks": same,
            "windows_with_other_samples": int(bad.size),
        },
        "give each rank its own shard: a DistributedSampler(num_replicas=W, rank=r) (set_epoch "
        "each epoch; drop_last so no rank pads with repeated samples), so that the W x K "
        "micro-batches of window i are exactly baseline batch i",
    )


def clip_before_reduce(c: Comparison) -> Diagnosis | None:
    """Ranks that held the same replica yet clipped by other norms: the all-reduce hands every
    rank the same gradient bits, so a clip after it sees one norm on all; each rank clipped its
    own share (a partial sum of the window's gradient) before the reduce (`ranks_apart`)."""
    facts = _facts(c)
    found = ranks_apart(c.baseline, c.merged)
    if facts is None or not facts.agree or found is None or not found[0]:
        return None  # no norms per rank, or replicas that parted (replicas-diverged's)
    (u, *_), table = found
    seen = ", ".join(f"rank {r} {table[r, u]:.4g}" for r in range(table.shape[0]))
    engaged = any(not d.ok for r in c.results for d in (*r.weights, *r.grads))
    latent = (
        ""
        if engaged
        else ". No clip engaged in this run (its weights and gradients agree with the "
        "baseline's), but the first update at which a rank's share reaches the threshold will "
        "step with another gradient than the baseline's"
    )
    return Diagnosis(
        "clip-per-micro",
        f"the ranks clipped before their gradients were reduced: at update {u} their norms "
        f"before clipping were {seen} ({len(found[0])} of {table.shape[1]} updates), while they "
        "stepped as replicas; after the all-reduce every rank holds the same gradient and sees "
        f"one norm, so each clipped its own share, a partial sum of the window's gradient{latent}",
        {
            "update": u,
            "pre_clip_norms": [finite(float(v)) for v in table[:, u]],
            "engaged": engaged,
        },
        "clip once per update after the gradients are reduced over the ranks: under DDP after "
        "the window's last backward (outside no_sync), just before optimizer.step(); a hand "
        "all-reduce goes before the clip",
    )


def dp_batchnorm(c: Comparison) -> Diagnosis | None:
    """BatchNorm statistics per rank: running statistics differ across the ranks."""
    facts = _facts(c)
    layers = c.merged.model_facts.get("batchnorm")
    if facts is None or not layers or not facts.buffers:
        return None
    i = min(facts.buffers)
    rank, names = next(iter(sorted(facts.buffers[i].items())))
    evidence, _ = update0_gap(c)
    evidence.update(first_update=i, rank=rank, buffers=names, batchnorm_layers=list(layers))
    return Diagnosis(
        "dp-batchnorm",
        f"the model has BatchNorm ({', '.join(layers)}) and each rank normalized its own "
        f"B/(W·K) rows with their own statistics: after update {i} rank {rank}'s "
        f"{listed(names)} differ from rank 0's, and the forward already differs from one "
        f"process at batch B (loss at update 0 off by {c.results[0].loss_diff:.3g})",
        evidence,
        "convert the model with torch.nn.SyncBatchNorm.convert_sync_batchnorm(model) before "
        "wrapping it in DDP, so that each micro-step normalizes with the statistics of all "
        "ranks' rows (with K > 1 they are still those of B/K rows: see batchnorm)",
    )


def dp_comm_hook(c: Comparison) -> Diagnosis | None:
    """The last resort on W ranks: no known bug fits, the gradients fail, and DDP ran a comm
    hook other than its all-reduce (PowerSGD, compression): the all-reduce was approximated."""
    hooks = lossy_hooks(c)
    r = next((r for r in c.results if any(not t.ok for t in r.grads)), None)
    if not hooks or r is None:
        return None
    gb, gm = c.baseline.grads(r.update), c.merged.grads(r.update)
    error = None if gb is None or gm is None else relative_error(gb, gm)
    shown = "" if error is None else f", {error:.3g} off (relative L2)"
    return Diagnosis(
        "dp-comm-hook",
        f"the gradients differ from the baseline's from update {r.update}{shown}, no "
        f"accumulation bug fits, and DDP reduced them with the comm hook {', '.join(hooks)}: "
        "a hook that approximates or compresses the all-reduce (PowerSGD, fp16/bf16 "
        "compression) trains otherwise than the large batch's exact mean",
        {
            "update": r.update,
            "comm_hooks": hooks,
            "grad_rel_l2": finite(error) if error is not None else None,
            "grad_cosine": finite(r.grad_cosine),
        },
        "to check the accumulation, record the merged run with DDP's own all-reduce (no comm "
        "hook, or allreduce_hook); the hook's effect on training is a separate question the "
        "baseline's noise floor does not answer",
    )


def dp_scale_before_clip(c: Comparison) -> Diagnosis | None:
    """`dp-loss-reduction` where the first failing update failed by its norms before clipping
    alone: a clip that engaged in both runs hid the scale W or 1/W from the step."""
    r = failed_before_clip(c)
    return None if r is None else dp_loss_reduction(c, r)


DECISIVE = [
    replicas_diverged,
    scheduler_per_rank,
    dp_sampler,
    clip_before_reduce,
    dp_batchnorm,
    dp_scale_before_clip,
]
GRADIENT_SHAPE = [dp_loss_reduction, dp_token_normalization]


def with_ranks(c: Comparison, found: list[Diagnosis]) -> list[Diagnosis]:
    """The data-parallel causes among the decisive ones: after those that explain diverging
    replicas by themselves (a step inside the window), before the rest; a more specific cause
    replaces the general one it explains (scheduler-per-rank for lr-schedule, dp-sampler for
    data-order)."""
    if c.ranks is None:
        return found
    ranked = [d for d in (signature(c) for signature in DECISIVE) if d is not None]
    codes = {d.code for d in ranked}
    dropped = {general for specific, general in SUBSUMED.items() if specific in codes}
    if "dp-batchnorm" in codes and window(c) == 1:  # no micro-batches: the ranks' rows alone
        dropped.add("batchnorm")
    first = [d for d in found if d.code in FIRST]
    rest = [d for d in found if d.code not in FIRST and d.code not in dropped]
    return [*first, *ranked, *rest]
