"""Data-parallel signatures read in the shape of the gradient at one update: a loss reduced once
too often over the ranks (W or 1/W times the baseline's gradient), items normalized per rank
(signatures/distributed.py lists them with the decisive ones)."""

from __future__ import annotations

from ..distributed import counts_per_rank, listed
from ..results import Comparison, Diagnosis, UpdateResult
from .clipping import pre_clip_ratio
from .common import (
    RATIO_MATCH,
    finite,
    lossy_hooks,
    own_k,
    pure_scale,
    relative_error,
    same_direction,
)


def dp_loss_reduction(c: Comparison, r: UpdateResult) -> Diagnosis | None:
    """Gradient W or 1/W times the baseline's, same direction: the loss reduced over the ranks
    on top of DDP's own mean (or once too often). Read in the gradient stepped with and, where a
    clip engaged, in the norms before clipping (a clip that always engages hides the scale in
    the gradient; probe runs on 2 ranks: clipped at 0.05, the ranks' gradients summed without
    dividing by W failed only the norms before clipping, 2 times the baseline's, `unexplained`).
    A ratio K or 1/K is loss-scale's, which names W beside it where W = K; one of K+1 is W's
    where W = K+1 (DDP on 2 ranks without accumulation, K=1, summed over the ranks: it was
    named `loss += loss / K`)."""
    world, k = c.merged.world_size, own_k(c)
    ratio, cosine = r.grad_ratio, r.grad_cosine
    if world < 2 or ratio is None or cosine is None or not cosine >= same_direction(c, r):
        return None
    before = pre_clip_ratio(c, r.update)
    sizes = [(ratio, ""), *([(before, " before clipping")] if before is not None else [])]
    scaled = (k, 1 / k, *([k + 1] if k + 1 != world else []))  # loss-scale's (also when W = K)
    if any(abs(size / q - 1) <= RATIO_MATCH for size, _ in sizes for q in scaled):
        return None
    found = next(
        (
            (size, when, expected, how, hook)
            for size, when in sizes
            for expected, how, hook in (
                (world, "summed over the ranks", "summed them without dividing by W"),
                (1 / world, "divided by W", "divided them by W once more"),
            )
            if abs(size / expected - 1) <= RATIO_MATCH
        ),
        None,
    )
    if found is None:
        return None
    size, when, expected, how, hook = found
    ran = lossy_hooks(c)  # a hook of the loop's own the Recorder saw on the DDP wrapper
    seen = f" (DDP ran {listed(ran, 2)})" if ran else ""
    stepped = f" (stepped with: {ratio:.6g} times)" if when else ""
    alike = (
        f"; with W = K+1 = {world}, a loss accumulated as `loss += loss / K` gives the same "
        "ratio (record with K+1 ≠ W to tell them apart)"
        if expected == k + 1 and k > 1
        else ""
    )
    evidence = {
        "update": r.update,
        "grad_ratio": finite(ratio),
        "grad_cosine": finite(cosine),
        "world_size": world,
        "expected_ratio": expected,
        **({"pre_clip_ratio": finite(size)} if when else {}),
    }
    return Diagnosis(
        "dp-loss-reduction",
        f"at update {r.update} the gradient{when} is {size:.6g} times the baseline's{stepped} "
        f"with cosine {cosine:.8f}, and W={world}: each rank's loss was {how} on top of the "
        "mean over the ranks (DDP's own, or an all_reduce by hand and its division by W), or a "
        f"comm hook {hook}{seen}{alike}",
        evidence,
        "average the ranks' gradients once: DDP already does (an all_reduce by hand sums "
        "them: divide by W once, after it); backpropagate each rank's own loss (its mean / K, "
        "or its share of the window's items) without multiplying or dividing it by the world "
        "size; to log the global loss, average the ranks' losses after backward",
    )


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
