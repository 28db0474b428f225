"""Random numbers the runs drew: `micro/draws` (record/draws.py) says whether torch's default
generators advanced at each micro-step; dropout layers or noise drawn per micro-step make B/K
micro-batches draw otherwise than B (`dropout-rng`), and a run whose dropout drew nothing ran in
eval() mode."""

from __future__ import annotations

import numpy as np

from ..checks import sample_mismatches
from ..results import Comparison, Diagnosis
from .common import dropout_ran, failing, micro_draws
from .decisive import draws, update0_gap


def _dropout_layers(c: Comparison) -> list[str] | None:
    """The dropout layers either run's model has (its facts), if any."""
    return c.baseline.model_facts.get("dropout") or c.merged.model_facts.get("dropout")


def dropout_rng(c: Comparison) -> Diagnosis | None:
    layers = _dropout_layers(c)
    leftover = _leftover_draws(c, layers)
    if leftover is not None:
        return leftover
    drawn = draws(c)
    if not drawn and not dropout_ran(c):  # no dropout, or its layers drew no mask (eval())
        return None
    evidence, differs = update0_gap(c)
    if not differs or c.results[0].loss_ok:  # other masks give another loss at once
        return None
    mismatched = sample_mismatches(c.baseline, c.merged)
    if mismatched is not None and mismatched.size:  # other samples: data-order's
        return None
    silent = _drew_alone(c) if layers else None
    if silent is not None:  # one run's dropout drew nothing: it ran in eval() mode
        evidence.update(dropout_layers=list(layers), drew_nothing=silent)
        active = "baseline" if silent == "merged" else "merged"
        return Diagnosis(
            "dropout-rng",
            f"the model has dropout ({', '.join(layers)}); the {active} run drew random numbers "
            f"at its micro-steps and the {silent} run drew none: its dropout was inactive (the "
            "model in eval() mode, or p=0), so the runs differ from update 0 with identical "
            f"weights and samples (loss differs by {c.results[0].loss_diff:.3g})",
            evidence,
            "train both runs in the same mode: call model.train() before the training loop, and "
            "again after any evaluation inside it",
        )
    if layers:
        evidence["dropout_layers"] = list(layers)
        what, drew = f"the model has dropout ({', '.join(layers)})", "random masks"
    else:
        evidence["draws_each_micro_step"] = True
        what = (
            "the loop draws random numbers at every micro-step (torch's default generator "
            "advanced between micro-steps: noise in the forward, such as a VAE's or a diffusion "
            "model's, or an augmentation drawn per batch, such as mixup's or cutmix's mixing "
            "weight and permutation; no dropout layer)"
        )
        drew = (
            "random numbers: one draw for a batch of B is not K draws for B/K (torch's CPU "
            "randn fills them otherwise unless each holds a multiple of 16 numbers)"
        )
    cosine = evidence.get("update_0_grad_cosine")
    shape = f", gradient cosine {cosine:.4f} at update 0" if cosine is not None else ""
    return Diagnosis(
        "dropout-rng",
        f"{what} and the runs differ from update 0, with identical weights and samples (loss "
        f"differs by {c.results[0].loss_diff:.3g}{shape}): the two runs drew different {drew}",
        evidence,
        "draw the same masks in both runs: do not reseed or consume the generator per "
        "micro-step; give dropout a contiguous tensor whose rows are the samples (`.contiguous()` "
        "on a transposed or permuted view, such as nn.MultiheadAttention's batch_first output: "
        "a mask is drawn in memory order, which the batch size reorders); with several random "
        "ops per forward, use batch-invariant randomness (a mask seeded by sample, layer and "
        "update); or verify with dropout disabled to isolate it"
        if layers
        else "draw the same numbers in both runs: the noise for the whole batch of B once per "
        "update, sliced per micro-batch, or from a generator seeded by sample and update; or "
        "verify with the noise fixed to isolate it",
    )


def _leftover_draws(c: Comparison, layers: list[str] | None) -> Diagnosis | None:
    """The runs part at the first window whose discarded micro-steps (an epoch's leftover,
    cleared by zero_grad() or by hand: runs/discarded.py) drew random numbers the baseline
    never drew: every random op after them draws from a shifted stream, so the masks differ
    from there."""
    drew = sorted(set(c.merged.discarded_draws) - set(c.baseline.discarded_draws))
    first = failing(c)
    if not drew or first is None or first.update != drew[0]:  # they part there, or not by it
        return None
    what = f"dropout ({', '.join(layers)})" if layers else "random draws at every micro-step"
    return Diagnosis(
        "dropout-rng",
        f"the runs agree before update {first.update} and part there: "
        f"before window {drew[0]} the merged run forwarded micro-steps whose gradient "
        "was then cleared (an epoch's leftover micro-batch, left out of the judged run), "
        f"and the model's {what} drew random numbers there that the baseline never drew: every "
        "mask after them comes from a shifted stream",
        {"first_update": first.update, "windows_after_drawn_leftovers": drew},
        "do not forward the leftover micro-batches: give the micro-batch loader a length that "
        "is a multiple of K (drop the tail, or stop at the last whole window); or forward them "
        "inside torch.random.fork_rng() so they leave the generator as they found it",
    )


def _drew_alone(c: Comparison) -> str | None:
    """The run ("baseline" or "merged") that drew no random numbers at any micro-step where the
    other drew at most of its own (`micro/draws`); None where both drew or neither is known."""
    b, m = micro_draws(c.baseline), micro_draws(c.merged)
    if b is None or m is None or len(b) < 2 or len(m) < 2:
        return None
    if not b[1:].any() and c.merged.draws_each_micro_step():
        return "baseline"
    if not m[1:].any() and c.baseline.draws_each_micro_step():
        return "merged"
    return None


def dropout_stopped(c: Comparison) -> Diagnosis | None:
    """From some update on, one run's dropout drew nothing while the other's drew at most of
    its micro-steps, and the runs part there: the model left in eval() mode after an
    evaluation inside the loop (`micro/draws`, per update)."""
    layers, r = _dropout_layers(c), failing(c)
    if not layers or r is None or not r.update:
        return None  # at update 0 dropout_rng reads it
    first = r.update
    per = {}
    for name, run in (("baseline", c.baseline), ("merged", c.merged)):
        found = micro_draws(run)
        if found is None or len(found) != int(run.sizes.sum()):
            return None
        per[name] = np.asarray(run.window_totals(found) > 0)[: len(c.results)]
    for silent, other in (("merged", "baseline"), ("baseline", "merged")):
        quiet = np.flatnonzero(per[other] & ~per[silent])
        if not quiet.size or not per[silent][: quiet[0]].all():
            continue  # it drew at every update before (it trained), then stopped
        u = int(quiet[0])
        if per[silent][u:].any() or not per[other][u:].all() or first < u:
            continue
        return Diagnosis(
            "dropout-rng",
            f"the model has dropout ({', '.join(layers)}); from update {u} the {silent} run drew "
            f"no random numbers while the {other} run drew at every update: its dropout was "
            f"inactive from there (the model left in eval() mode after an evaluation inside the "
            f"loop), and the runs part from update {first}",
            {"first_update": u, "drew_nothing_from": u, "run": silent, "dropout_layers": layers},
            "call model.train() after any evaluation inside the training loop, in both runs",
        )
    return None
