"""Helpers every signature uses: which update fails first, K, norms of tensor sets."""

from __future__ import annotations

import math

import numpy as np

from ...runs.model import Run, Tensors
from ...runs.ranks import counted_on
from ..fits import columns, gram
from ..results import Comparison, UpdateResult
from ..views import Sketching, exact, norm_of, sketch_width, vectors

COSINE_SAME_DIRECTION = 1 - 1e-6  # a pure rescaling keeps the direction to rounding error
RATIO_MATCH = 1e-3  # relative distance to K, 1/K or K+1 that names the loss-scale variant


def finite(value: float | None) -> float | None:
    return float(value) if value is not None and math.isfinite(value) else None


def window(c: Comparison) -> int:
    """K of the merged run relative to the baseline's."""
    return max(1, c.merged.accum_steps // max(1, c.baseline.accum_steps))


def own_k(c: Comparison) -> int:
    """The merged run's own K: what a bug in its loop scales by, its baseline being right
    whatever its own K (a baseline of K_b micro-steps sums their shares to the batch's gradient:
    a merged loss left undivided is K times it, not K/K_b)."""
    return max(1, c.merged.accum_steps)


def whole_ratio(ratio: float) -> int:
    """The whole number a positive ratio (or, below 1, its inverse) is nearest: the K of a log
    read with -k 1, one line per update, whose lines do not say it."""
    return round(ratio) if ratio >= 1 else round(1 / ratio)


def times(ratio: float) -> str:
    """A ratio with the digits that tell it from 1: "1.00002 times", never "1 times" for losses
    that differ."""
    text = f"{ratio:.4g}"
    if text == "1" and ratio != 1 and math.isfinite(ratio):
        text = f"{ratio:.{2 - math.floor(math.log10(abs(ratio - 1)))}g}"
    return text


def window_scale(k: int, scale: float, short: tuple[int, int] | None = None) -> str:
    """One of K, 1/K or K+1 (a wrong loss scale's ratios), or n/K in a window of n micro-steps
    short of the merged run's K (`short`: (n, K)), said as the window's scale it is, with its
    value: `K = 4`."""
    if short is not None and short[0] < short[1] and scale == short[0] / short[1]:
        return f"{short[0]}/K = {scale:.4g}, the window's {short[0]} micro-step(s) over K"
    name = "K" if scale == k else "K+1" if scale == k + 1 else "1/K"
    return f"{name} = {scale:.4g}"


def failing(c: Comparison) -> UpdateResult | None:
    return next((r for r in c.results if not r.ok), None)


def first_gradient_failure(c: Comparison) -> UpdateResult | None:
    return next((r for r in c.results if r.grad_failed), None)


def relative_error(base: Tensors, merged: Tensors, names: list[str] | None = None) -> float | None:
    """||merged - base|| / ||base|| over the tensors `names` (default: every tensor both hold; a
    sketched run holds some), in float64, a slice at a time."""
    both = [n for n in base if n in merged] if names is None else names
    g = gram(columns((base, merged), both, lambda b, m: (b, m - b)), 2)
    return math.sqrt(g[1, 1] / g[0, 0]) if g[0, 0] > 0 else None


def on_ranks(c: Comparison, key: str, row: int, above: float = 0) -> tuple[str, dict]:
    """The merged run's ranks whose own count `key` (runs/ranks.py COUNTS) exceeds `above` at
    `row`, where only some did: said for a message (" on rank 1") and as evidence
    ({"ranks": [1]}); ("", {}) where no rank is to be named (one process, every rank alike)."""
    ranks = counted_on(c.merged.ranks, key, row, above)
    if not ranks:
        return "", {}
    said = f" on rank{'s' if len(ranks) > 1 else ''} {', '.join(map(str, ranks))}"
    return said, {"ranks": ranks}


def width(c: Comparison) -> Sketching | None:
    """How tensors are seen when any run kept sketches (judge/views.py), else None."""
    return sketch_width(c.baseline, c.merged, c.reference)


def grads_of(c: Comparison, run: Run, update: int) -> Tensors | None:
    """A run's gradient at an update: whole tensors, or (sketched runs) sketch vectors, which
    keep every linear relation between gradients."""
    return vectors(run, "grads", update, width(c))


def weights_of(c: Comparison, run: Run, update: int | None) -> Tensors | None:
    """A run's weights after an update (None: initial), whole or as sketch vectors."""
    return vectors(run, "weights", update, width(c))


def exact_of(c: Comparison, run: Run, kind: str, update: int) -> Tensors | None:
    """The tensors of an update whose element values are known: all where the run kept full
    files there (a full run; a sketched one at its snapshot updates), else those kept whole."""
    return exact(run, kind, update, width(c), files=True)


def grad_norm(c: Comparison, run: Run, update: int) -> float | None:
    """The exact norm of a run's whole gradient at an update."""
    return norm_of(run, "grads", update, width(c))


def scaled_error(c: Comparison, r: UpdateResult, scale: float = 1.0) -> float | None:
    """The relative L2 error of the merged gradient divided by `scale` against the baseline's,
    at an update (None where either gradient is not known element by element)."""
    gb, gm = grads_of(c, c.baseline, r.update), grads_of(c, c.merged, r.update)
    if gb is None or gm is None:
        return None
    if scale != 1.0:
        gm = {n: np.asarray(v, dtype=np.float64) / scale for n, v in gm.items()}
    return relative_error(gb, gm)


def noise_share(c: Comparison, r: UpdateResult) -> float:
    """The gradient's noise at an update, over the whole model, as a share of the baseline's
    gradient, times the noise factor: factor·||noise|| / ||g_base||. The noise is the baseline's
    own distance from the reference, the same in full and sketch mode (what a sketch's estimate
    adds to the allowed error is not noise). Without a reference: what the check allows."""
    own = own_noise(c, r)
    if own is not None:
        return c.tolerances.noise_factor * own
    norm = grad_norm(c, c.baseline, r.update)
    if not norm:
        return 0.0
    allowed = math.sqrt(math.fsum(d.unbounded**2 for d in r.grads if math.isfinite(d.unbounded)))
    return allowed / norm


def own_noise(c: Comparison, r: UpdateResult) -> float | None:
    """The gradient's own noise at an update, over the whole model, as a share of the
    baseline's gradient: ||noise|| / ||g_base|| (None without a reference, or no gradient)."""
    if not r.grads or not all(d.noise is not None and math.isfinite(d.noise) for d in r.grads):
        return None
    norm = grad_norm(c, c.baseline, r.update)
    if not norm:
        return None
    return math.sqrt(math.fsum(d.noise**2 for d in r.grads)) / norm  # type: ignore[operator]


def failing_share(c: Comparison, r: UpdateResult) -> tuple[float, list[str]] | None:
    """The relative L2 error of the gradients that failed at an update, over their own norm,
    and their names: each stands beyond what it was allowed, so beyond its own noise, where the
    whole model's noise may hide it (a 16-bit ResNet whose convolutions' noise is half their
    gradient, beside an output bias off by a half). None where none failed (or was excused)."""
    gb, gm = grads_of(c, c.baseline, r.update), grads_of(c, c.merged, r.update)
    if gb is None or gm is None:
        return None
    names = [d.name for d in r.grads if not d.ok and d.name in gb and d.name in gm]
    error = relative_error(gb, gm, names)
    return None if error is None else (error, names)


def same_direction(c: Comparison, r: UpdateResult) -> float:
    """The cosine above which two gradients point the same way, over the whole model."""
    return same_direction_at(noise_share(c, r))


CLEAR_OF_ALLOWED = 3.0  # a scale matching no known ratio stands this far beyond what is allowed


def allowed_share(c: Comparison, r: UpdateResult) -> float:
    """What the gradient check allowed at an update, over the whole model, as a share of the
    baseline's gradient (inf where it allowed anything), without a sketch estimator's bound
    (a gradient 1.05 times the baseline's was no scale beside it at sketch width 31)."""
    norm = grad_norm(c, c.baseline, r.update)
    allowed = math.sqrt(math.fsum(d.unbounded**2 for d in r.grads))
    return allowed / norm if norm else math.inf


def pure_scale(c: Comparison, r: UpdateResult, ratio: float, cosine: float) -> bool:
    """Whether the merged gradient is the baseline's times `ratio` and nothing else: it points
    the same way, its size is off by more than the noise's share, and the difference lies more
    along the gradient than across it (noise turns a gradient, a scale does not; a bfloat16 run
    without a reference: 0.9988 times the baseline's, 0.07 across). A scale no known ratio
    explains must also stand CLEAR_OF_ALLOWED times beyond what the check allowed: a model of
    a few one-element tensors has every gradient collinear, so a failure at 1.1x its allowance
    is "1.0000006 times the baseline's" there, which is rounding, not a scale."""
    if not cosine >= same_direction(c, r) or not abs(ratio - 1) > noise_share(c, r):
        return False
    if not abs(ratio - 1) > CLEAR_OF_ALLOWED * allowed_share(c, r):
        return False
    return abs(ratio - 1) > abs(ratio) * math.tan(math.acos(min(cosine, 1.0)))


def same_direction_at(share: float) -> float:
    """The cosine above which two gradients point the same way: rounding's 1 − 1e-6, or, where
    the noise is a larger share ρ of the gradient (bfloat16), 1 − 2ρ² (noise of that share
    turns a gradient by about ρ²/2 in cosine)."""
    return 1 - max(1 - COSINE_SAME_DIRECTION, 2 * share**2)


EXACT_HOOKS = ("allreduce_hook",)  # DDP's default all-reduce, as a hook: the same numbers


def lossy_hooks(c: Comparison) -> list[str]:
    """The comm hooks the merged run's DDP ran on its gradients, other than the exact default."""
    if c.merged.world_size < 2:
        return []
    hooks = c.merged.model_facts.get("comm_hooks") or []
    return [h for h in hooks if h.rsplit(".", 1)[-1] not in EXACT_HOOKS]


def normalized_by_window(run: Run) -> bool:
    """Whether the framework that recorded the run normalized its loss by the window's item
    count itself (the transformers Trainer given num_items_in_batch): no micro-batch's mean was
    divided by K there, whatever else went wrong."""
    return run.config.get("loss_normalized_by") == "num_items_in_batch"


def losses_given(run: Run) -> bool:
    """Whether the run's micro-step losses are each micro-batch's own, as the loop gave them,
    not read back from the loss it backpropagated (a framework integration's: `framework` in
    its config), which carries the loop's normalization, right or wrong."""
    return "framework" not in run.config


def micro_draws(run: Run) -> np.ndarray | None:
    """A run's `micro/draws`; zeros where the Recorder kept none (it writes them only where a
    micro-step drew), known by its other per-micro-step series; None for another source."""
    if run.micro_draws is not None:
        return np.asarray(run.micro_draws)
    if run.micro_grad_writes is not None:
        return np.zeros(len(run.micro_loss), dtype=np.int64)
    return None


def dropout_ran(c: Comparison) -> bool:
    """Whether the model has dropout layers that may have drawn masks: not where both runs are
    known to have drawn no random number after their first micro-step (the model in eval()
    mode, as one disables dropout to verify)."""
    if not (c.baseline.model_facts.get("dropout") or c.merged.model_facts.get("dropout")):
        return False
    found = micro_draws(c.baseline), micro_draws(c.merged)
    return not all(d is not None and not d[1:].any() for d in found)


def scaling_rules(k: int) -> list[tuple[float, str]]:
    """What a batch-size scaling rule multiplies a setting by for K, with its name: K or
    sqrt(K), or their inverses (a learning rate, a clip threshold)."""
    root = math.sqrt(k)
    return [(1 / k, "1/K"), (float(k), "K"), (1 / root, "1/sqrt(K)"), (root, "sqrt(K)")]
