"""Data-parallel signatures: read what each rank recorded (judge/distributed.py) and the shape of
the gradient, and name the data-parallel bug: ranks that are no longer replicas, a scheduler
stepped per rank, ranks reading the same rows, BatchNorm statistics per rank, a loss reduced
once too often over the ranks, items normalized per rank."""

from __future__ import annotations

import numpy as np

from ..checks import sample_mismatches
from ..clip_norms import ranks_apart
from ..distributed import RankFacts, counts_per_rank, listed
from ..results import Comparison, Diagnosis, UpdateResult
from .common import (
    RATIO_MATCH,
    finite,
    lossy_hooks,
    on_ranks,
    pure_scale,
    relative_error,
    same_direction,
    window,
)
from .decisive import update0_gap
from .learning_rate import SPLIT_BATCHES, lined_up_lrs, schedule_offset

FIRST = ("window-bookkeeping", "step-in-window")  # causes that explain diverging replicas
SUBSUMED = {"scheduler-per-rank": "lr-schedule", "dp-sampler": "data-order"}


def _facts(c: Comparison) -> RankFacts | None:
    return c.ranks


def replicas_diverged(c: Comparison) -> Diagnosis | None:
    facts = _facts(c)
    if facts is None or facts.agree:
        return None
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


def dp_loss_reduction(c: Comparison, r: UpdateResult) -> Diagnosis | None:
    """Gradient W or 1/W times the baseline's, same direction: the loss reduced over the ranks
    on top of DDP's own mean (or once too often)."""
    world, k = c.merged.world_size, window(c)
    ratio, cosine = r.grad_ratio, r.grad_cosine
    if world < 2 or ratio is None or cosine is None or not cosine >= same_direction(c, r):
        return None
    if any(abs(ratio / q - 1) <= RATIO_MATCH for q in (k, 1 / k, k + 1)):
        return None  # loss-scale's variants (also when W = K)
    hooks = (
        (world, "summed over the ranks", "summed them without dividing by W"),
        (1 / world, "divided by W", "divided them by W once more"),
    )
    ran = lossy_hooks(c)  # a hook of the loop's own the Recorder saw on the DDP wrapper
    seen = f" (DDP ran {listed(ran, 2)})" if ran else ""
    for expected, how, hook in hooks:
        if abs(ratio / expected - 1) <= RATIO_MATCH:
            return Diagnosis(
                "dp-loss-reduction",
                f"at update {r.update} the gradient is {ratio:.6g} times the baseline's with "
                f"cosine {cosine:.8f}, and W={world}: each rank's loss was {how} on top of "
                f"the mean over the ranks (DDP's own, or an all_reduce by hand and its "
                f"division by W), or a comm hook {hook}{seen}",
                {
                    "update": r.update,
                    "grad_ratio": finite(ratio),
                    "grad_cosine": finite(cosine),
                    "world_size": world,
                    "expected_ratio": expected,
                },
                "average the ranks' gradients once: DDP already does (an all_reduce by hand "
                "sums them: divide by W once, after it); backpropagate each rank's own loss "
                "(its mean / K, or its share of the window's items) without multiplying or "
                "dividing it by the world size; to log the global loss, average the ranks' "
                "losses after backward",
            )
    return None


def dp_token_normalization(c: Comparison, r: UpdateResult) -> Diagnosis | None:
    """Items normalized locally (per rank, or per micro-batch): the ranks hold different item
    counts and the gradient error is within what reweighting rank r by N / (W·N_r) can cause.
    The gradient alone cannot tell a rank's count from a micro-batch's; the fix is the same.
    Without item counts, the ranks' rows (`batch=`) count: a plain mean over unequal shards."""
    counted = counts_per_rank(c.merged, r.update)
    if counted is None:
        return None
    counts, micro, unit = counted
    if len(counts) < 2 or min(counts) <= 0 or min(counts) == max(counts):
        return None
    total, world = sum(counts), len(counts)
    imbalance = max(abs(total / (world * n) - 1) for n in counts)
    # normalized per micro-batch, each is weighted by the window's share over its own count:
    # the rank's and the micro-step's imbalances add up
    pieces = [n for counts_of_rank in micro for n in counts_of_rank if n > 0]
    finest = max((abs(total / (len(micro[0]) * world * n) - 1) for n in pieces), default=0.0)
    gb, gm = c.baseline.grads(r.update), c.merged.grads(r.update)
    error = None if gb is None or gm is None else relative_error(gb, gm)
    if error is None or not 0 < error <= 2 * max(imbalance, finest):
        return None
    ratio, cosine = r.grad_ratio, r.grad_cosine
    if ratio is not None and cosine is not None and pure_scale(c, r, ratio, cosine):
        return None  # reweighting ranks turns the gradient; a count off by a few scales it
    if unit == "items":
        how = (
            "normalized by a local count (its own, or its micro-batch's), not by the window's "
            f"{total:g} items on all ranks"
        )
        fix = (
            "count the window's items over every rank first (all_reduce the item count of the "
            "K micro-batches), then backpropagate each micro-batch's summed loss x W / that "
            "total (DDP averages over W ranks): the num_items_in_batch fix of transformers #34242"
        )
    else:
        how = (
            "a mean over its own rows and DDP averaged the ranks equally, instead of weighting "
            f"each by its share of the window's {total:g} samples on all ranks"
        )
        fix = (
            "give every rank the same number of rows per micro-step (a DistributedSampler with "
            "drop_last, equal batch sizes), or weight each rank by its rows: backpropagate each "
            "micro-batch's summed loss x W / the window's rows on all ranks (all_reduce the "
            "count), and record items=n in micro()"
        )
    return Diagnosis(
        "dp-token-normalization",
        f"at update {r.update} the ranks hold {', '.join(f'{n:g}' for n in counts)} {unit} "
        f"(micro-batches {'; '.join(', '.join(map(str, m)) for m in micro)}), yet each rank's "
        f"loss was {how}: ranks are weighted up to {imbalance:.1%} wrong, and the gradient is "
        f"{error:.3g} off (relative L2, cosine {r.grad_cosine:.6f})",
        {
            "update": r.update,
            f"{unit}_per_rank": counts,
            f"{unit}_per_micro_batch": micro,
            "max_rank_weight_error": imbalance,
            "grad_rel_l2": error,
            "grad_cosine": finite(r.grad_cosine),
        },
        fix,
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


DECISIVE = [replicas_diverged, scheduler_per_rank, dp_sampler, clip_before_reduce, dp_batchnorm]
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
