"""`grad-hooks`: hooks on the parameters' gradients (`register_hook`,
`register_post_accumulate_grad_hook`) run at every backward: on the batch's gradient in the
baseline, on each micro-batch's (or on the sum so far) in the merged run. A hook linear in the
gradient (a constant scale, a gradient reversal) commutes with the sum; one that is not (a clamp,
a clip, a normalization, noise added) changes the window's gradient. The Recorder lists the
hooked parameters (manifest `model.grad_hooks`); only they can fail by their hooks, so the
reading asks that every gradient failing at the first failing update is one of them."""

from __future__ import annotations

from ..results import Comparison, Diagnosis
from .common import finite, first_gradient_failure, window


def grad_hooks(c: Comparison) -> Diagnosis | None:
    """The last resort's reading of a gradient that fails only in hooked parameters, where the
    merged run forwards more pieces per update than one: against a reference, or in float32
    and float64 (whose fixed tolerances stand far above a first gradient's rounding)."""
    hooked = list(c.merged.model_facts.get("grad_hooks") or [])
    pieces = window(c) * c.merged.world_size
    calibrated = c.reference is not None or c.dtype in ("float32", "float64")
    r = first_gradient_failure(c) if hooked and pieces > 1 and calibrated else None
    failed = [d for d in r.grads if not d.ok] if r is not None else []
    if not failed or any(d.name not in hooked for d in failed):
        return None
    worst = max(failed, key=lambda d: d.error / d.allowed if d.allowed else float("inf"))
    shown = ", ".join(hooked[:4]) + (f" and {len(hooked) - 4} more" if len(hooked) > 4 else "")
    where = "over the ranks' shares and " if c.merged.world_size > 1 else ""
    alike = set(c.baseline.model_facts.get("grad_hooks") or []) == set(hooked)
    base = (
        "as the baseline's do, on the batch's gradient there"
        if alike
        else "which the baseline's parameters do not carry alike"
    )
    return Diagnosis(
        "grad-hooks",
        f"from update {r.update} the gradients of {len(failed)} tensor(s) fail (worst "
        f"{worst.name}, {worst.rel_l2:.3g} off, cosine {worst.cosine:.6f}), all of them "
        f"parameters that carry a hook on their gradient ({shown}: register_hook or "
        f"register_post_accumulate_grad_hook), {base}: a hook runs at every backward, in the "
        f"merged run {where}on each of the K={window(c)} micro-batches' gradients, and a hook "
        "that is not linear in the gradient (a clamp, a clip, a normalization, noise added) "
        "changes their sum; no accumulation bug's shape fits the failure",
        {
            "first_update": r.update,
            "hooked_parameters": hooked,
            "failing_tensors": [d.name for d in failed],
            "worst_rel_l2": finite(worst.rel_l2),
            "worst_cosine": finite(worst.cosine),
            "K": window(c),
        },
        "apply what the hook does to the window's accumulated gradient once, after the last "
        "micro-step's backward and before optimizer.step() (e.g. p.grad.clamp_(-c, c), or "
        "torch.nn.utils.clip_grad_value_), instead of in a hook on every backward; a hook "
        "linear in the gradient (a constant scale) may stay",
    )
